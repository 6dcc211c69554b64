"""The tile kernel with angles computed in the kernel (and, for comparison, from a table) at Llama-3-8B's prefill
(b4 s4096, 32 q / 8 kv heads x 128, bf16), compiled for sm_90 on a machine without a GPU (tools/compile_sm90.py):
registers a thread, SASS instructions, float64 instructions (D*), local-memory loads and stores, calls; all static
counts over the cubin, libdevice's functions included. Run from the repository root:
python docs/gpu-runs/table-free-and-mrope/cpu/tf_sass.py"""
import sys, re, collections
sys.path.insert(0, "tools")
import compile_sm90 as cs
import torch
from ropekit.triton import launch
from ropekit.positions import resolve_positions

q = torch.empty(4, 4096, 32, 128, dtype=torch.bfloat16)
k = torch.empty(4, 4096, 8, 128, dtype=torch.bfloat16)
inv = torch.empty(64, dtype=torch.float32)
spec = resolve_positions(batch=4, seqlen=4096, positions=None)
table = torch.empty(8192, 64)
for angles in (True, False):
    for config in (launch.TileConfig(1, 8, 4, evict_first=True, heads_inner=True),
                   launch.TileConfig(2, 1, 16, fused_qk=True, evict_first=True), launch.TileConfig(4, 1, 16, fused_qk=True, evict_first=True)):
        with launch.recorded_launches() as records:
            kw = dict(inv_freq=inv) if angles else {}
            plan = launch.plan_rope(q, k, None if angles else table, None if angles else table, out_q=torch.empty_like(q),
                                    out_k=torch.empty_like(k), positions=spec, rotary_dim=128, config=config, **kw)
            plan.launch()
        r = records[0]
        regs, text = cs.sass(cs.compile_record(r))
        ops = collections.Counter(m.group(1).split(".")[0] for m in
                                  re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", text))
        d = sum(v for o, v in ops.items() if o.startswith("D"))
        print("angles" if angles else "table ", config, "warps", r.num_warps, "regs", regs, "instr", sum(ops.values()),
              "fp64", d, "LDL/STL", ops.get("LDL", 0), ops.get("STL", 0), "CALL", ops.get("CALL", 0), flush=True)
