"""For ncu: a named fused case's ropekit-fused call (or 'chain': the launch-chain floor, or 'copy': the copy of
decode-b64's byte floor), each run 3 times."""
import sys
import torch
from ropekit.bench import floor
from ropekit.bench.fused import _fused, copy_of_floor
from ropekit.bench.fused_cases import CASES, make_data
dev = torch.device("cuda")
for name in sys.argv[1].split(","):
    if name == "chain":
        call = floor.launch_chain(dev)
    elif name == "copy":
        call = copy_of_floor(next(c for c in CASES if c.name == "decode-b64"), dev)
    else:
        case = next(c for c in CASES if c.name == name)
        call = _fused(make_data(case, dev, 0))
    for _ in range(3):
        call()
    dev.type == "cuda" and torch.cuda.synchronize()
    print("ran", name, flush=True)
