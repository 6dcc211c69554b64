"""Graph and eager A/B of the eager benchmark's small-prefill and decode calls (base .ab/ropekit_base vs this tree):
graphs of 128 calls replayed in interleaved rounds; eager 1000 back-to-back calls, interleaved rounds."""
import statistics, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / ".ab"))
import ropekit_base.bench.eager as EB
import ropekit.bench.eager as E
WANT = ("apply_rope", "apply_rope (in place)", "rope_and_cache", "rope_and_cache, float8 cache", "qk_norm_rope",
        "mla_rope_and_cache", "rope_and_cache + QK-norm")
print(torch.cuda.get_device_name(), flush=True)
with torch.no_grad():
    for case_new, case_base in zip(E.CASES, EB.CASES):
        fns = {}
        for mod, case, tag in ((EB, case_base, "base"), (E, case_new, "new")):
            for op in mod.OPS:
                if op.name in WANT:
                    fns[tag, op.name] = op.make(".peers")(case, "cuda").fn
        for fn in fns.values():
            for _ in range(20):
                fn()
        torch.cuda.synchronize()
        graphs = {}
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        for k, fn in fns.items():
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(128):
                    fn()
            graphs[k] = g
        torch.cuda.synchronize()
        gs = {k: [] for k in fns}
        es = {k: [] for k in fns}
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(9):
            for k, g in graphs.items():
                for _ in range(5):
                    a.record(); g.replay(); b.record(); b.synchronize(); gs[k].append(a.elapsed_time(b) * 1e3 / 128)
            for k, fn in fns.items():
                t0 = time.perf_counter()
                for _ in range(1000):
                    fn()
                torch.cuda.synchronize()
                es[k].append((time.perf_counter() - t0) / 1000 * 1e6)
        print(f"## {case_new.name}")
        for name in WANT:
            gb, gn = statistics.median(gs["base", name]), statistics.median(gs["new", name])
            eb, en = statistics.median(es["base", name]), statistics.median(es["new", name])
            print(f"{name:32s} graph base {gb:7.3f} new {gn:7.3f} new/base {gn / gb:.3f} | eager base {eb:7.2f} "
                  f"new {en:7.2f} new/base {en / eb:.3f}", flush=True)
