"""The sanitize driver's fused launches with a QK-norm, one at a time, each line flushed before the next launch, so
that racecheck's report follows the launch it belongs to."""
import sys, torch
import ropekit
from ropekit import device as _device
from ropekit.reliability.sanitize_fused import QUANTISED_CACHES, check_quantised_cache, check_norm, NORM_PLACES
print("ropekit from", ropekit.__file__, flush=True)
with _device.set_backend("triton"):
    for cache_dtype, scales in QUANTISED_CACHES:
        if scales in ("tensor", "head"):
            result = check_quantised_cache(cache_dtype, scales, "cuda")
            torch.cuda.synchronize()
            print(f"LAUNCHED {cache_dtype} {scales}: {result}", flush=True)
    for weighted in (False, True):
        result = check_norm("cuda", "after", weighted)
        torch.cuda.synchronize()
        print(f"LAUNCHED norm after weighted={weighted}: {result}", flush=True)
    for place in NORM_PLACES:
        result = check_norm("cuda", place, True, "heads")
        torch.cuda.synchronize()
        print(f"LAUNCHED norm over heads {place}: {result}", flush=True)
