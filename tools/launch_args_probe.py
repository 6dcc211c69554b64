"""Does a kernel's argument count change its time in CUDA-graph replay? (the small prefill's L2 question)

v4 passes 8 pointers and ~30 integers a launch; Liger's rope kernel about a dozen arguments. On an L2-resident
3 µs kernel a per-launch cost of the parameter block would show. This probe times one copy kernel over the small
prefill's bytes (q and k of b1 s512, 32 + 8 heads x 128, bf16: 5.2 MB in, 5.2 MB out, L2-resident) with 48 extra
integer arguments that are either all 1 (Triton specialises them away: they are not passed) or all 17 (passed: 4
bytes each), or 2**33 + 1 (8 bytes each), in graphs of 128 calls replayed in interleaved rounds.

Then it replays ropekit's and Liger's small-prefill graphs for two seconds each while ``nvidia-smi`` samples the
SM clock and the power draw: whether the GPU clocks down more under one of them.

    python tools/launch_args_probe.py     # on the GPU; prints a table, writes $OUT/launch_args_probe.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time

import torch
import triton
import triton.language as tl

from probe_host_l2 import builders, graph_calls_us  # tools/ is on sys.path when this file runs as a script
from ropekit.bench.cases import select_cases
from tune_v4 import graph_of

OUT = os.environ.get("OUT", ".")
N_EXTRA = 48


def _extra_names(n: int) -> list[str]:
    return [f"a{i}" for i in range(n)]


# one kernel with N_EXTRA extra integer arguments, generated so that the signature is spelled out (Triton's JIT
# needs named parameters); their xor decides a uniform early exit (never taken) so that none is dead code without
# touching what the compiler knows of n (its divisibility by 16 is what lets the copy use 16-byte accesses: run44
# folded the xor into the mask and measured unvectorised copies)
_SOURCE = f'''
@triton.jit
def copy_kernel(X, Y, n, {", ".join(_extra_names(N_EXTRA))}, BLOCK: tl.constexpr):
    salt = {" ^ ".join(_extra_names(N_EXTRA))}
    if salt == 123456789:
        return
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(Y + offs, tl.load(X + offs, mask=mask), mask=mask)
'''
_namespace = {"triton": triton, "tl": tl}
_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ropekit_launch_args_kernel.py")
with open(_path, "w") as f:  # Triton reads a jitted function's source from its file
    f.write("import triton\nimport triton.language as tl\n" + _SOURCE)
exec(compile(_SOURCE, _path, "exec"), _namespace)
copy_kernel = _namespace["copy_kernel"]


def main():
    n = (32 + 8) * 128 * 512
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    block = 2048
    grid = (triton.cdiv(n, block),)
    variants = {
        "48 extra ints = 1 (specialised away: 3 arguments passed)": [1] * N_EXTRA,
        "16 passed (4 bytes each), 32 = 1": [17] * 16 + [1] * 32,
        "32 passed (4 bytes each), 16 = 1": [17] * 32 + [1] * 16,
        "48 passed (4 bytes each)": [17] * N_EXTRA,
        "48 passed (8 bytes each)": [2**33 + 1] * N_EXTRA,
    }
    fns = {}
    for name, extra in variants.items():
        fn = lambda extra=extra: copy_kernel[grid](x, y, n, *extra, BLOCK=block, num_warps=4)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        assert torch.equal(x, y), name
        fns[name] = fn
    samples = {name: [] for name in fns}
    for _ in range(7):
        for name, fn in fns.items():
            samples[name].append(graph_calls_us([fn], 128))
    rows = {name: statistics.median(values) for name, values in samples.items()}
    base = rows[next(iter(rows))]
    for name, us in rows.items():
        print(f"{name:58s} {us:6.3f} us [{min(samples[name]):.3f}-{max(samples[name]):.3f}] {us - base:+.3f}",
              flush=True)
    clocks = clock_samples()
    with open(os.path.join(OUT, "launch_args_probe.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "median_us": rows, "samples_us": samples, "clocks": clocks},
                  f, indent=1)


def clock_samples(seconds: float = 2.0) -> dict:
    """SM clock (MHz) and power (W) sampled by nvidia-smi while each implementation's graph replays."""
    case = select_cases(names=["small-prefill"])[0]
    make, _ = builders(case, {"liger", "ropekit"})
    out = {}
    for name in ("ropekit", "liger", "ropekit", "liger"):
        if name not in make:
            continue
        graph = graph_of(make[name](5).fn, 128)
        torch.cuda.synchronize()
        sampler = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                    "-lms", "50"], stdout=subprocess.PIPE, text=True)
        start = time.perf_counter()
        replays = 0
        while time.perf_counter() - start < seconds:
            for _ in range(50):
                graph.replay()
            replays += 50
            torch.cuda.synchronize()
        sampler.terminate()
        lines = [line.split(",") for line in sampler.communicate()[0].splitlines() if "," in line]
        sm = [float(a) for a, _ in lines[2:]]  # the first samples may predate the replays
        power = [float(b) for _, b in lines[2:]]
        us = (time.perf_counter() - start) / (replays * 128) * 1e6
        row = {"sm_mhz_median": statistics.median(sm) if sm else None,
               "power_w_median": statistics.median(power) if power else None, "us_per_call_wall": us,
               "samples": len(sm)}
        out.setdefault(name, []).append(row)
        print(f"clocks {name:10s} {row}", flush=True)
    return out


if __name__ == "__main__":
    main()
