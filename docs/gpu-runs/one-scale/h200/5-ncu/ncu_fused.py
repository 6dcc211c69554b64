"""Launch the fused benchmark's ropekit-fused call on named cases (for ncu): each case's call run 3 times."""
import sys
import torch
from ropekit.bench.fused import _fused
from ropekit.bench.fused_cases import CASES, make_data
names = sys.argv[1].split(",")
for case in CASES:
    if case.name in names:
        data = make_data(case, torch.device("cuda"), 0)
        call = _fused(data)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        print("ran", case.name, flush=True)
