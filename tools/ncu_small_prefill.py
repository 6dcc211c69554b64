"""One small-prefill call (b1 s512, 32 q / 8 kv heads x 128, bf16) of a v4 tile or Liger, repeated, for Nsight Compute:

    ncu -k regex:rope --launch-skip 3 --launch-count 1 --section SpeedOfLight --section LaunchStats \
        --section Occupancy --section WarpStateStats --section InstructionStats \
        python tools/ncu_small_prefill.py v4-2-16-4

Names: liger, or v4-S-H-W[-fused] (a LaunchConfig of BLOCK_S, BLOCK_H, num_warps).
"""

import sys

import torch

from ropekit.bench.cases import select_cases
from ropekit.bench.impls import make_impls
from ropekit.bench.inputs import make_data, make_tables
from ropekit.positions import resolve_positions
from ropekit.triton import v4
from ropekit.triton.v4 import LaunchConfig

case = select_cases(names=["small-prefill"])[0]
tables = make_tables(case, "cuda")
data = make_data(case, "cuda", 1)
name = sys.argv[1]
if name == "liger":
    fn = {i.name: i for i in make_impls(".peers")}["liger"].build(case, tables, data, "forward").fn
else:
    parts = name.split("-")
    config = LaunchConfig(int(parts[1]), int(parts[2]), int(parts[3]), fused_qk=parts[-1] == "fused")
    out_q, out_k = torch.empty_like(data.q), torch.empty_like(data.k)
    spec = resolve_positions(batch=case.batch, seqlen=case.seqlen, positions=None)

    def fn():
        v4.rope_v4(data.q, data.k, tables.cos_half, tables.sin_half, out_q=out_q, out_k=out_k, positions=spec,
                   rotary_dim=case.rotary, config=config)
for _ in range(6):
    fn()
torch.cuda.synchronize()
