"""One process: ropekit-fused graph time on prefill cases with the fused autotune as it is ("tree"), with an L2 flush
before each timed launch and more reps ("flush"), or off ("off": the model's choice). A fresh ROPEKIT_CACHE_DIR each."""
import json, os, statistics, sys, tempfile, time
os.environ["ROPEKIT_CACHE_DIR"] = tempfile.mkdtemp()
mode = sys.argv[2]
if mode in ("off", "h16"):
    os.environ["ROPEKIT_AUTOTUNE"] = "0"
import torch
from ropekit.triton import choice
from ropekit.bench import fused as F
from ropekit.bench.timing import GpuTimer, Settings

if mode in ("h16", "rounds16"):
    from ropekit.triton import model as _model
    from ropekit.triton.configs import next_pow2
    _orig_model = choice.model_fused
    def model_h16(facts, shape):
        config = _orig_model(facts, shape)
        if not shape.backward and shape.n_tokens > 128 and shape.width <= 128 and not shape.norm_over_heads:
            config = config._replace(block_h=min(16, next_pow2(shape.n_heads)))
        return config
    choice.model_fused = model_h16
    _model.model_fused = model_h16
if mode in ("flush", "rounds", "rounds16"):
    scratch = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")

    def time_launch(fn, *, warmup=2, reps=9):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            scratch.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(); fn(); end.record(); end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)
    choice.time_launch = time_launch
if mode in ("rounds", "rounds16"):
    def _tune_rounds(bench, candidates, rounds=3):
        times, failed = [[] for _ in candidates], set()
        for _ in range(rounds):
            for i, config in enumerate(candidates):
                if i in failed:
                    continue
                try:
                    times[i].append(float(bench(config)))
                except Exception:
                    failed.add(i)
        best, best_s = None, float("inf")
        for i, config in enumerate(candidates):
            if i in failed or not times[i]:
                continue
            s = statistics.median(times[i])
            if s < best_s * choice._MARGIN:
                best, best_s = config, s
        return best
    choice._tune = _tune_rounds

chosen = []
orig = choice._tune
def spy(bench, candidates):
    best = orig(bench, candidates)
    chosen.append(str(best))
    return best
choice._tune = spy
tag, names = sys.argv[1], sys.argv[3:]
timer = GpuTimer(Settings())
gbps = timer.copy_ceiling()["gbps"]
for case in [c for c in F.CASES if c.name in names]:
    rows = F.run_case(case, {"ropekit-fused": F._fused}, timer, "cuda", ceiling_gbps=gbps, log=lambda *a: None)
    r = rows[0]
    floor_us = F.floor_bytes(case) / (gbps * 1e3)
    pct = 100 * floor_us / r["graph_us"] if r["graph_us"] else 0
    print(f"{tag:7s} {case.name:34s} {r['status']:5s} {r['graph_us'] or 0:8.2f} us {pct:5.1f}%  copy {rows[1]['graph_us']:.2f}  chose {chosen[-1] if chosen else '-'}", flush=True)
    chosen.clear()
