"""A/B of the fused autotune's clock in one process: per prefill case the pick of the old clock (one timing a
candidate, no L2 flush) and of the new one (interleaved rounds, medians, the L2 flushed before each timed call), each
made by the public op's first call in an empty cache, timed together with the model's choice by graph replay
(ropekit.bench.fused_tune's harness: checked, interleaved rounds, the copy ceiling of the same process)."""
import argparse, json, os, statistics, sys, tempfile
import torch
from ropekit.bench import fused_tune as ft
from ropekit.bench.fused import checked_call, impls
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton import choice, launch, model

new_clock, new_rounds, new_candidates = choice.time_launch, choice._ROUNDS, choice.fused_candidates

def old_candidates(facts, shape):
    """HEAD's candidates: the hint and launch order flipped, no half warps."""
    chosen = model.model_fused(facts, shape)
    s, h, w = chosen.block_s, chosen.block_h, chosen.num_warps
    out = [chosen, chosen._replace(block_h=h * 2), chosen._replace(block_h=max(1, h // 2)),
           chosen._replace(block_s=s * 2), chosen._replace(block_s=max(1, s // 2)),
           chosen._replace(num_warps=w * 2)]
    out += [chosen._replace(evict_first=not chosen.evict_first, heads_inner=not chosen.heads_inner)]
    return model._keep(out, model.fused_candidate_space(shape))

def old_clock(fn, *, warmup: int = 2, reps: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); fn(); end.record(); end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)

def pick(case, shape, clock, rounds, candidates, seed):
    choice.time_launch, choice._ROUNDS, choice.fused_candidates = clock, rounds, candidates
    os.environ["ROPEKIT_CACHE_DIR"] = tempfile.mkdtemp()
    choice._chosen.clear(); launch.plans.clear()
    try:
        checked_call(case, impls()["ropekit-fused"], "cuda", seed)
        return choice.choose_fused(shape, "cuda")
    finally:
        choice.time_launch, choice._ROUNDS, choice.fused_candidates = new_clock, new_rounds, new_candidates

p = argparse.ArgumentParser()
p.add_argument("--cases", nargs="+", required=True)
p.add_argument("--extra", default="2,16,4,1,1")
p.add_argument("--out", required=True)
a = p.parse_args()
by = {c.name: c for c in CASES}
facts = choice.device_facts("cuda")
timer = GpuTimer(Settings(graph_ms=30.0, graph_rounds=5))
ceiling = timer.copy_ceiling()["gbps"]
print(f"copy ceiling: {ceiling:.0f} GB/s", flush=True)
picks, rows = {}, []
for name in a.cases:
    case = by[name]
    shape = ft.case_shape(case)
    mine = model.model_fused(facts, choice.fused_bucket(shape))
    old = pick(case, shape, old_clock, 1, old_candidates, 11)
    new = pick(case, shape, new_clock, new_rounds, new_candidates, 12)
    picks[name] = dict(model=tuple(mine), old_clock=tuple(old), new_clock=tuple(new))
    print(f"{name}: model {tuple(mine)[:5]} HEAD {tuple(old)[:5]} new {tuple(new)[:5]}", flush=True)
    extra = [tuple(int(x) for x in e.split(",")) for e in a.extra.split(";")] if a.extra else []
    extra = [e[:3] + tuple(bool(x) for x in e[3:5]) for e in extra]
    ft.SWEEP["prefill"] = [tuple(mine), tuple(old), tuple(new)] + extra
    choice._chosen.clear(); launch.plans.clear()
    os.environ["ROPEKIT_CACHE_DIR"] = tempfile.mkdtemp()
    os.environ["ROPEKIT_AUTOTUNE"] = "0"  # the table choice row below: the model's (no timing in the sweep)
    rows += ft.tune_case(case, timer, "cuda", ceiling)
    os.environ.pop("ROPEKIT_AUTOTUNE")
doc = dict(command=" ".join(sys.argv), gpu=torch.cuda.get_device_name(), ceiling=ceiling, picks=picks, rows=rows)
open(a.out, "w").write(json.dumps(doc, indent=1, default=str))
