"""Per prefill case: the model's tile without registers (the rule) and with the compiled kernel's registers (the
public op's first call, autotune off, the choice's registers function kept), the registers of each tile, and the
tiles timed together by ropekit.bench.fused_tune's harness (checked, graph replay, interleaved rounds, the copy
ceiling of the same process)."""
import argparse, json, os, sys
import torch
from ropekit.bench import fused_tune as ft
from ropekit.bench.fused import checked_call, impls
from ropekit.bench.fused_cases import CASES
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton import choice, model
from ropekit.triton.configs import FusedConfig
from ropekit.triton.launch import plans

p = argparse.ArgumentParser()
p.add_argument("--cases", nargs="+", required=True)
p.add_argument("--out", required=True)
a = p.parse_args()
by = {c.name: c for c in CASES}
facts = choice.device_facts("cuda")  # the copy bandwidth measured (the autotune is allowed here)
print(f"facts: {facts}", flush=True)
os.environ["ROPEKIT_AUTOTUNE"] = "0"
seen = {}
real = choice.choose_fused
def spy(shape, device=None, bench=None, registers=None):
    config = real(shape, device, bench=bench, registers=registers)
    seen["last"] = (config, registers)
    return config
choice.choose_fused = spy
timer = GpuTimer(Settings(graph_ms=30.0, graph_rounds=5))
ceiling = timer.copy_ceiling()["gbps"]
print(f"copy ceiling: {ceiling:.0f} GB/s; Little's law asks {facts.needed_bytes_in_flight_per_sm:.0f} B an SM", flush=True)
picks, rows = {}, []
for name in a.cases:
    case = by[name]
    shape = choice.fused_bucket(ft.case_shape(case))
    rule = model.model_fused(facts, shape)
    plans.clear(); seen.clear()
    checked_call(case, impls()["ropekit-fused"], "cuda", 7)
    new, registers = seen["last"]
    tiles = [rule, new]
    for heads in (rule.block_h * 2, rule.block_h // 2):
        other = rule._replace(block_h=heads)
        if 1 <= heads <= 32 and model.is_valid_fused(other, shape):
            tiles.append(other)
    tiles = list(dict.fromkeys(tiles))
    regs = {}
    for t in tiles:
        try:
            regs[str(tuple(t)[:3])] = registers(t) if registers else None
        except Exception as error:
            regs[str(tuple(t)[:3])] = f"{type(error).__name__}: {error}"[:200]
    inflight = {k: (model.fused_bytes_in_flight_per_sm(facts, shape, FusedConfig(*eval(k)), v) if isinstance(v, int) else None) for k, v in regs.items()}
    picks[name] = dict(rule=rule._asdict(), model=new._asdict(), registers=regs, in_flight=inflight)
    print(f"{name}: rule {tuple(rule)[:3]} model {tuple(new)[:3]} registers {regs} in flight {inflight}", flush=True)
    ft.SWEEP["prefill"] = [tuple(t) for t in tiles]
    rows += ft.tune_case(case, timer, "cuda", ceiling)
doc = dict(command=" ".join(sys.argv), gpu=torch.cuda.get_device_name(), facts=str(facts), ceiling=ceiling, picks=picks, rows=rows)
open(a.out, "w").write(json.dumps(doc, indent=1, default=str))
