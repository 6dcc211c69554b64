"""The candidates a call past the L2 reaches (the streaming tile, its neighbours in both launch orders, the fused q+k
tile, the flat kernel), forced onto the sanitizer's mask-and-tail calls: run under compute-sanitizer memcheck."""
import sys
import torch
from ropekit import device as _device
from ropekit.reliability import sanitize as S
from ropekit.triton import choice
from ropekit.triton.model import rope_candidates

device = _device.DEVICE
facts = S._PUBLISHED_H100 if _device.INTERPRET else choice.device_facts(device)
failures, runs = 0, 0
for cfg in S.sanitize_configs():
    case = S.build_case(cfg, device, values=False)
    q = case.q.tensor(); k = case.k.tensor() if case.k is not None else None
    plan = S._plan(cfg, case, q, k, conjugate=False)
    if plan is None:
        continue
    big = plan.shape._replace(n_tokens=plan.shape.n_tokens * 1_000_000)  # the same call's shape past the L2
    configs = list(dict.fromkeys(rope_candidates(facts, big) + [c._replace(heads_inner=True) for c in
                                                                 rope_candidates(facts, plan.shape)
                                                                 if type(c).__name__ == "TileConfig" and not c.fused_qk]))
    for config in configs:
        if type(config).__name__ == "FlatConfig" and not plan.shape.flat_ok:
            continue
        runs += 1
        try:
            problems = S.run_with_launch_config(cfg, config, device)
        except Exception as error:  # noqa: BLE001
            problems = [repr(error)]
        if problems:
            failures += 1
            print("FAIL", cfg.describe(), config, problems[:2], flush=True)
print(f"streaming candidates: {runs} runs, {failures} failures", flush=True)
sys.exit(1 if failures else 0)
