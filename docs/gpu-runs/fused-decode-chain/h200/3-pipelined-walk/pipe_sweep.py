"""The fused forward walking several token blocks a program, software-pipelined (TILE.TOKEN_BLOCKS, TILE.STAGES),
against the library's own choice: one process, rows checked against the float64 reference, captured together and
replayed in interleaved rounds (ropekit.bench's harness). Autotune off (ROPEKIT_AUTOTUNE=0) so that 'default' is the
model's tile."""
import argparse, json, sys
from pathlib import Path
import torch
import ropekit.bench.fused as F
from ropekit.bench.fused_cases import CASES, floor_bytes
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton.configs import FusedConfig
from ropekit.triton.fused import forced_fused_config

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--rounds", type=int, default=7)
p.add_argument("--cases", default="prefill-b4-s4096,prefill-b4-s4096-qknorm,prefill-b4-s4096-fp8")
a = p.parse_args()
by = {c.name: c for c in CASES}
timer = GpuTimer(Settings(graph_ms=20.0, graph_rounds=a.rounds))
ceiling = timer.copy_ceiling()["gbps"]
print(f"{torch.cuda.get_device_name()}; copy ceiling {ceiling}", flush=True)
def variant(config):
    def build(data):
        call = F._fused(data)
        def run():
            if config is None:
                return call()
            with forced_fused_config(config):
                return call()
        return run
    return build

def C(s, h, w, blocks, stages):
    return FusedConfig(s, h, w, True, True, blocks, stages)

T = [C(2, 16, 4, 1, 1), C(2, 8, 4, 1, 1), C(2, 8, 4, 4, 2), C(2, 8, 4, 4, 3), C(2, 8, 4, 8, 3), C(2, 16, 4, 4, 2),
     C(2, 16, 4, 4, 3), C(1, 8, 4, 8, 3), C(1, 16, 4, 8, 3), C(2, 8, 4, 16, 4)]
rows = []
for name in a.cases.split(","):
    builders = {"default": variant(None)}
    for config in T:
        builders[f"{config.block_s}x{config.block_h}w{config.num_warps}b{config.token_blocks}s{config.stages}"] = variant(config)
    builders["default2"] = variant(None)
    case_rows = F.run_case(by[name], builders, timer, "cuda", ceiling_gbps=ceiling, log=lambda *_: None)
    base = None
    print(name, flush=True)
    for r in case_rows:
        if r.get("graph_us") is None:
            print(f"   {r['impl']:18s} {r['status']}", flush=True)
            continue
        base = base or r["graph_us"]
        print(f"   {r['impl']:18s} {r['graph_us']:8.2f} us  {floor_bytes(by[name]) / (ceiling * 1e3) / r['graph_us'] * 100:5.1f}%  "
              f"x{r['graph_us'] / base:.4f}  {r['status']}", flush=True)
    rows += case_rows
Path(a.out).write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), ceiling=ceiling, argv=sys.argv, rows=rows),
                                  indent=1, default=str))
