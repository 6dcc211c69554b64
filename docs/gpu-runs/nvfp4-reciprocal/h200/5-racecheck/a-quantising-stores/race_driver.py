"""The sanitize driver's quantising-store launches (QK-norm), one at a time, each line flushed before the next
launch, so that racecheck's report follows the launch it belongs to."""
import sys, torch
import ropekit
from ropekit import device as _device
from ropekit.reliability.sanitize_fused import QUANTISED_CACHES, check_quantised_cache
print("ropekit from", ropekit.__file__, flush=True)
with _device.set_backend("triton"):
    for cache_dtype, scales in QUANTISED_CACHES:
        if scales not in sys.argv[1:]:
            continue
        result = check_quantised_cache(cache_dtype, scales, "cuda")
        torch.cuda.synchronize()
        print(f"LAUNCHED {cache_dtype} {scales}: {result}", flush=True)
