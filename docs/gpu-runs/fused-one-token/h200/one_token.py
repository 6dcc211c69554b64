"""Does one token a program beat the model's prefill tile on the H200 across the fused formats? Each prefill case
(b4 s4096) at the library's choice and forced to 1 token x 16 and 1 token x 32 heads (4 warps, the streaming hint,
heads inner), each graph captured inside its forced configuration, then all replayed in interleaved rounds; every
call checked against the float64 reference first. Graph replay, one process, the autotune off."""
import json, os, sys
import torch
from ropekit.bench import fused as F, fused_cases as FC
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton.configs import FusedConfig
from ropekit.triton.fused import forced_fused_config

CASES = sys.argv[1:] or ["prefill-b4-s4096", "prefill-b4-s4096-qknorm", "prefill-b4-s4096-fp8",
                         "prefill-b4-s4096-e5m2", "prefill-b4-s4096-page-table", "prefill-b4-s4096-int8-token-head",
                         "prefill-b4-s4096-fp8-token-head", "prefill-b4-s4096-fp8-q", "prefill-b4-s4096-nvfp4"]
timer = GpuTimer(Settings())
ceiling = timer.copy_ceiling()["gbps"]
name = torch.cuda.get_device_name()
print(name, "ceiling", round(ceiling), flush=True)
cases = {c.name: c for c in FC.CASES}
pending = []
for cname in CASES:
    case = cases[cname]
    floor = FC.floor_bytes(case)
    for cfg in (None, FusedConfig(1, 16, 4, True, True), FusedConfig(1, 32, 4, True, True)):
        with forced_fused_config(cfg):
            result, data, fn = F.checked_call(case, F._fused, "cuda", 11)
            assert result["ok"], (cname, cfg, result)
            graph = timer.capture([fn], floor / (ceiling * 1e3))
        label = "choice" if cfg is None else f"{cfg.block_s}x{cfg.block_h} w{cfg.num_warps}"
        pending.append((cname, label, floor, graph, data))
rows = []
for rnd in range(2):
    graphs = [p[3] for p in pending]
    results = timer.replay_rounds(graphs)
    for (cname, label, floor, _, _), (median, spread, calls) in zip(pending, results):
        pct = floor / (median * 1e3) / ceiling * 100
        rows.append(dict(case=cname, config=label, round=rnd, graph_us=median, spread=spread, pct_floor=pct))
        print(f"{rnd} {cname:34s} {label:8s} {median:8.2f} us {pct:6.1f}%", flush=True)
    if rnd == 0:  # replay_rounds releases its graphs: capture them again, each in its forced configuration
        fresh = []
        for cname, label, floor, _, data in pending:
            cfg = None if label == "choice" else FusedConfig(1, int(label.split("x")[1].split()[0]), 4, True, True)
            with forced_fused_config(cfg):
                fn = F._fused(data)
                fn()
                fresh.append((cname, label, floor, timer.capture([fn], floor / (ceiling * 1e3)), data))
        pending = fresh
json.dump(dict(device=name, ceiling_gbps=ceiling, rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "one_token.json"), "w"), indent=1)
