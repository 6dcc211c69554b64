"""The fused decode's tiles launched plainly (run with ROPEKIT_PDL=0): the plain rule's heads against every head."""
import sys
from ropekit.bench import fused_tune as ft
ft.SWEEP["decode"] = [(1, 8, 4), (1, 4, 4), (1, 16, 4), (1, 32, 4)]
sys.exit(ft.main(sys.argv[1:]))
