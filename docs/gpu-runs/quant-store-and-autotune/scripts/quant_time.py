"""One process: ropekit-fused graph time on the quantising prefill cases (the model's tile, autotune off)."""
import json, sys, torch
from ropekit.bench import fused as F
from ropekit.bench.timing import GpuTimer, Settings
tag = sys.argv[1]
names = sys.argv[2:]
timer = GpuTimer(Settings())
gbps = timer.copy_ceiling()["gbps"]
out = {"tag": tag, "gbps": gbps, "rows": {}}
for case in [c for c in F.CASES if c.name in names]:
    rows = F.run_case(case, {"ropekit-fused": F._fused}, timer, "cuda", ceiling_gbps=gbps, log=lambda *a: None)
    r = rows[0]
    floor_us = F.floor_bytes(case) / (gbps * 1e3)
    out["rows"][case.name] = dict(us=r["graph_us"], pct=100 * floor_us / r["graph_us"] if r["graph_us"] else None,
                                  status=r["status"], check={k: r.get(k) for k in ("ok", "error_ratio", "quant_ulps") if k in r})
    print(f"{tag:6s} {case.name:36s} {r['status']:6s} {r['graph_us'] or 0:8.2f} us  {out['rows'][case.name]['pct'] or 0:5.1f}%  copy {rows[1]['graph_us']:.2f}" + (f"  chain floor {rows[2]['graph_us']:.3f}" if len(rows) > 2 else ""), flush=True)
print(json.dumps(out))
