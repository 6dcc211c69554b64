"""Time the Triton ladder on the GPU and measure v3's tile candidates (run on the H100; prints tables, writes JSON).

    python tools/time_ladder.py                 # ~3-4 min on an H100: every candidate on every case
    python tools/time_ladder.py --quick         # ~1 min: a thinned candidate grid
    python tools/time_ladder.py --out $OUT/time_ladder.json

For each benchmark shape it times q then k (one launch each, as the benchmark harness calls v1..v3) on the
harness's graph clock (``ropekit.bench.timing``: calls captured back to back in a CUDA graph, median of replays;
the large cases stream from DRAM, the small prefill is L2-resident):

* ``copy``: ``out.copy_(x)`` for q and k, the same bytes as a RoPE pass (the floor for these shapes);
* v1 (float32 cases only), v2, v3 with its current ``launch_config``;
* v3 with every ``(BLOCK_S, BLOCK_H, num_warps)`` candidate, to choose ``ropekit.triton.v3.GPU_TABLE`` by
  measurement. The last lines print the best candidate per table key in the form of ``GPU_TABLE``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import triton

import ropekit
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.triton.v1 import rope_v1
from ropekit.triton.v2 import rope_v2
from ropekit.triton.v3 import V3Config, launch_config, rope_v3

DEVICE = "cuda"  # tests run the script's control flow on the CPU with a fake clock by changing this
# name: (batch, seq, q heads, k heads, head_dim, dtype) — the benchmark's cases that v1..v3 can run (positions 0..S-1)
CASES = {
    "llama3-8b-prefill": (4, 4096, 32, 8, 128, torch.bfloat16),
    "mha-fp16": (8, 2048, 64, 64, 128, torch.float16),
    "fp32": (2, 2048, 32, 32, 64, torch.float32),
    "small-prefill": (1, 512, 32, 8, 128, torch.bfloat16),
}


def graph_median_us(fn, estimate_us: float = 50.0) -> float:
    """Median µs of one call of ``fn`` on the harness's graph clock (``GpuTimer.graph_us``)."""
    return GpuTimer(Settings()).graph_us([fn], estimate_us)[0]


def candidates(n_heads: int, head_dim: int, quick: bool) -> list[V3Config]:
    block_half = triton.next_power_of_2(head_dim // 2)
    heads_pow2 = triton.next_power_of_2(n_heads)
    block_s = (1, 2, 4, 8, 16, 32)
    block_h = tuple(h for h in (1, 2, 4, 8, 16, 32) if h <= heads_pow2)
    warps = (4, 8) if quick else (2, 4, 8)
    out = [V3Config(s, h, w) for s, h, w in itertools.product(block_s, block_h, warps)
           if 512 <= 2 * block_half * s * h <= 8192]  # elements rotated per loop step
    return out[::2] if quick else out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "time_ladder.json"))
    parser.add_argument("--quick", action="store_true", help="a thinned candidate grid (about a third)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    args = parser.parse_args()
    if ropekit.device.DEVICE != DEVICE:
        raise SystemExit("time_ladder.py needs a CUDA GPU (the Triton interpreter is not a benchmark)")
    torch.manual_seed(0)
    report = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE, "torch": torch.__version__,
              "triton": triton.__version__,
              "method": "ropekit.bench.timing graph clock of q and k launches", "cases": {}}
    print(f"{report['gpu']}  torch {report['torch']}  triton {report['triton']}  ({report['method']})", flush=True)
    best_per_key: dict[tuple[int, int], list] = {}
    for name in args.cases.split(","):
        batch, seqlen, hq, hk, head_dim, dtype = CASES[name]
        q = torch.randn(batch, seqlen, hq, head_dim, device=DEVICE, dtype=dtype)
        k = torch.randn(batch, seqlen, hk, head_dim, device=DEVICE, dtype=dtype)
        out_q, out_k = torch.empty_like(q), torch.empty_like(k)
        cos, sin = ropekit.cos_sin_table(seqlen, head_dim, device=DEVICE)
        moved = 2 * (q.numel() + k.numel()) * q.element_size()  # read q, k once and write them once

        def pair(launch, **kw):
            return lambda: (launch(q, cos, sin, out_q, **kw), launch(k, cos, sin, out_k, **kw))

        row = {"shape": [batch, seqlen, hq, hk, head_dim, str(dtype)], "bytes": moved}
        row["copy_us"] = graph_median_us(lambda: (out_q.copy_(q), out_k.copy_(k)))
        if dtype == torch.float32:
            row["v1_us"] = graph_median_us(pair(rope_v1), estimate_us=row["copy_us"])
        row["v2_us"] = graph_median_us(pair(rope_v2), estimate_us=row["copy_us"])
        default = launch_config(batch, seqlen, max(hq, hk), head_dim, q.element_size())
        row["v3_default"] = {"config": list(default),
                             "us": graph_median_us(pair(rope_v3), estimate_us=row["copy_us"])}
        timed = {}
        for config in candidates(max(hq, hk), head_dim, args.quick):
            try:
                timed[config] = graph_median_us(pair(rope_v3, config=config), estimate_us=row["copy_us"])
            except Exception as error:  # noqa: BLE001  (a config the compiler rejects, e.g. out of registers)
                print(f"  {name} {tuple(config)}: {type(error).__name__}: {error}"[:160], flush=True)
        ranked = sorted(timed.items(), key=lambda kv: kv[1])
        row["v3_candidates"] = [{"config": list(c), "us": t} for c, t in ranked]
        report["cases"][name] = row

        def pct(us):
            return f"{us:8.1f} us {moved / (us * 1e-6) / 1e9:7.0f} GB/s {100 * row['copy_us'] / us:5.1f}% of copy"
        print(f"\n{name}: b{batch} s{seqlen} {hq}q/{hk}k x {head_dim} {str(dtype)[6:]}, {moved / 1e6:.0f} MB moved",
              flush=True)
        print(f"  copy           {pct(row['copy_us'])}")
        if "v1_us" in row:
            print(f"  v1             {pct(row['v1_us'])}")
        print(f"  v2             {pct(row['v2_us'])}")
        print(f"  v3 {str(tuple(default)):12s}{pct(row['v3_default']['us'])}   (current launch_config)")
        for config, us in ranked[:8]:
            print(f"  v3 {str(tuple(config)):12s}{pct(us)}")
        if ranked:
            key = (triton.next_power_of_2(head_dim // 2), q.element_size())
            best_per_key.setdefault(key, []).append((name, ranked[0][0], ranked[0][1], timed))
    print("\nbest per GPU_TABLE key (BLOCK_HALF, element size); with several cases per key, the config with the "
          "smallest summed time over them:")
    for key, entries in best_per_key.items():
        common = set.intersection(*(set(e[3]) for e in entries))
        choice = min(common, key=lambda c: sum(e[3][c] for e in entries))
        print(f"    {key}: V3Config(block_s={choice.block_s}, block_h={choice.block_h}, num_warps={choice.num_warps}),"
              f"  # {', '.join(e[0] for e in entries)}")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
