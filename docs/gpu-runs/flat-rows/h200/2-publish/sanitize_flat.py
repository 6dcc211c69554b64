"""Every flat configuration the model and the autotune can reach (``rope_candidate_space``'s FlatConfigs: 4-16 warps,
one to eight vectors a thread, paired or not, with and without the hint), forced onto each of the sanitizer's calls
the flat kernel can run (mask-and-tail shapes, odd head sizes, every position form): run under compute-sanitizer
memcheck, and plain (each result checked against the reference)."""
import sys
from ropekit import device as _device
from ropekit.reliability import sanitize as S
from ropekit.triton.model import rope_candidate_space

device = _device.DEVICE
failures, runs, calls = 0, 0, 0
for cfg in S.sanitize_configs():
    case = S.build_case(cfg, device, values=False)
    q = case.q.tensor(); k = case.k.tensor() if case.k is not None else None
    plan = S._plan(cfg, case, q, k, conjugate=False)
    if plan is None or not plan.shape.flat_ok:
        continue
    calls += 1
    for config in (c for c in rope_candidate_space(plan.shape) if type(c).__name__ == "FlatConfig"):
        runs += 1
        try:
            problems = S.run_with_launch_config(cfg, config, device)
        except Exception as error:  # noqa: BLE001
            problems = [repr(error)]
        if problems:
            failures += 1
            print("FAIL", cfg.describe(), config, problems[:2], flush=True)
print(f"flat candidates: {calls} calls, {runs} runs, {failures} failures", flush=True)
sys.exit(1 if failures else 0)
