"""The fused forward with a norm across all heads after the rotation (the sanitize driver's
check_norm(device, "after", True, "heads")), launched N times on fresh random inputs, each launch flushed, so that
racecheck's per-hazard report (--racecheck-report all: the threads, the address, the values written) follows it."""
import sys, torch
from ropekit import device as _device
from ropekit.reliability.sanitize_fused import check_norm
n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
with _device.set_backend("triton"):
    for i in range(n):
        torch.manual_seed(i)
        result = check_norm("cuda", "after", True, "heads")
        torch.cuda.synchronize()
        print(f"LAUNCHED {i}: {result!r}", flush=True)
