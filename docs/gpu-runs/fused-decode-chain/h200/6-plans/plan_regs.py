"""Each fused forward case's plan under each package (base, this tree, alt): the tile, warps and the compiled
kernel's registers a thread (autotune off: the model's choice)."""
import importlib, sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / ".ab"))
from ropekit.bench.fused_cases import CASES, make_data
cases = sys.argv[2].split(",") if len(sys.argv) > 2 else [c.name for c in CASES if "backward" not in c.name]
for pkg in sys.argv[1].split(","):
    F = importlib.import_module(pkg + ".bench.fused")
    L = importlib.import_module(pkg + ".triton.launch")
    for c in CASES:
        if c.name not in cases:
            continue
        L.plans.clear()
        data = make_data(c, torch.device("cuda"), 0)
        F._fused(data)()
        torch.cuda.synchronize()
        for plan in list(L.plans.values()):
            launch = getattr(plan, "launch", None)
            if launch is None or not hasattr(launch, "per_call"):
                continue
            values = tuple(L._at(launch.arguments, p) for p in map(L._path, launch.per_call))
            tile = launch.arguments.get("TILE")
            print(f"{pkg:14s} {c.name:34s} grid {launch.grid} warps {launch.num_warps} "
                  f"tile {tuple(tile)[:4] if tile else None} regs {launch.registers(values)}", flush=True)
