"""Session 62: the launch each fused benchmark case plans on this GPU, with this tree's model (registers rounded to the
allocation unit) and with 7a1bec4's (.ab/ropekit_base), in one process."""
import importlib, sys
sys.path.insert(0, ".ab")
import torch
for pkg in ("ropekit", "ropekit_base"):
    bench_fused = importlib.import_module(f"{pkg}.bench.fused")
    cases_mod = importlib.import_module(f"{pkg}.bench.fused_cases")
    launch_mod = importlib.import_module(f"{pkg}.triton.launch")
    build = bench_fused.impls()["ropekit-fused"]
    for case in cases_mod.CASES:
        if case.kind == "backward" or case.decode:
            continue
        launch_mod.plans.clear()
        result, data, fn = bench_fused.checked_call(case, build, "cuda", 5)
        seen = []
        for plan in launch_mod.plans.values():
            l = getattr(plan, "launch", None)
            l = getattr(l, "launch", l)
            if l is None or not hasattr(l, "arguments"):
                continue
            t = l.arguments.get("TILE"); c = l.arguments.get("CACHE")
            seen.append((t.BLOCK_S, t.BLOCK_H, l.num_warps, t.HEADS_INNER, getattr(c, "V_APART", None)))
        print(f"{pkg:13s} {case.name:36s} {seen}", flush=True)
