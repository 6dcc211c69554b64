"""The fused decode's tiles on the H200 (programmatic launches): fused_tune's decode set plus fewer heads and warps."""
import sys
from ropekit.bench import fused_tune as ft
ft.SWEEP["decode"] = ft.SWEEP["decode"] + [(1, 2, 4), (1, 4, 2), (1, 1, 1), (1, 2, 1), (1, 4, 1), (1, 1, 4), (1, 16, 8)]
sys.exit(ft.main(sys.argv[1:]))
