"""One process, a fresh autotune cache: the fused prefill cases (ropekit-fused, graph replay) or apply_rope's tuned
main cases (python -m ropekit bench, ropekit only), with this tree ("new") or the tree before patched in ("old")."""
import json, os, sys, tempfile
os.environ["ROPEKIT_CACHE_DIR"] = tempfile.mkdtemp()
tag, mode, what = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.getcwd())
if mode == "old":
    import exp.old_clock  # noqa: F401
from ropekit.triton import choice
chosen = []
_orig = choice._tune
def spy(bench, candidates):
    best = _orig(bench, candidates)
    chosen.append(best)
    return best
choice._tune = spy
if what == "fused":
    from ropekit.bench import fused as F
    from ropekit.bench.timing import GpuTimer, Settings
    timer = GpuTimer(Settings())
    gbps = timer.copy_ceiling()["gbps"]
    for case in [c for c in F.CASES if c.name in sys.argv[4:]]:
        rows = F.run_case(case, {"ropekit-fused": F._fused}, timer, "cuda", ceiling_gbps=gbps, log=lambda *a: None)
        r = rows[0]
        pct = 100 * F.floor_bytes(case) / (gbps * 1e3) / r["graph_us"] if r["graph_us"] else 0
        c = chosen[-1] if chosen else None
        pick = f"{c.block_s}x{c.block_h} w{c.num_warps} {'E' if c.evict_first else '-'}{'I' if c.heads_inner else '-'}" if c else "-"
        print(f"{tag:5s} {case.name:34s} {r['status']:5s} {r['graph_us'] or 0:8.2f} us {pct:5.1f}%  chose {pick}", flush=True)
        chosen.clear()
else:
    from ropekit.bench.cli import main
    out = f"/tmp/rb_{tag}"
    main(["--cases", "llama3-8b-prefill,mha-fp16,fp32", "--impls", "ropekit", "--no-plots", "--out", out,
          "--time-budget", "60"])
    doc = json.load(open(f"{out}/benchmarks.json"))
    for r in doc["results"] if "results" in doc else doc["rows"]:
        if r.get("impl") == "ropekit" and r.get("direction", "forward") == "forward":
            print(f"{tag:5s} {r['case']:20s} {r.get('graph_us')}  chose {chosen}", flush=True)
