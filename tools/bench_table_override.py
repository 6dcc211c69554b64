"""``python -m ropekit bench`` with one entry of v4's launch table replaced: a candidate measured in the harness's own
conditions (every implementation's buffer sets alive, graphs replayed in interleaved rounds), which a probe cannot
reproduce (run35: ropekit's fp32 rows read 47.0 µs alone and 47.8 with the other implementations' buffers).

The override applies to prefill-sized calls (4096 tokens or more) of one element size:

    python tools/bench_table_override.py --element-size 4 --set flat=1024,flat_warps=4,flat_paired=1 -- \\
        --cases fp32 --peers .peers --out /tmp/b
    python tools/bench_table_override.py --element-size 4 --best-of flat_probe.json --case fp32 -- ...

``--best-of`` takes the paired candidate of ``tools/flat_probe.py --paired --json`` with the lowest forward +
conjugate median on that case.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from ropekit.bench import cli
from ropekit.triton import v4

_LABEL = re.compile(r"paired (\d+)/(\d+)w( ef)?$")


def best_of(probe_json: str, case: str) -> dict:
    """The paired candidate of a ``flat_probe.py --paired`` run with the lowest forward + conjugate median."""
    medians = json.load(open(probe_json))["median_us"][case]
    best = min((medians[label] + medians[label + " conj"], label) for label in medians
               if _LABEL.match(label) and label + " conj" in medians)
    block, warps, hint = _LABEL.match(best[1]).groups()
    print(f"bench_table_override: best paired candidate on {case}: {best[1]} ({best[0] / 2:.2f} µs a direction)")
    return dict(flat=int(block), flat_warps=int(warps), flat_paired=True, flat_streaming=bool(hint))


def parse_set(text: str) -> dict:
    defaults = v4.LaunchConfig(1, 1, 1)  # the field's type, from a value (v4's annotations are postponed)
    out = {}
    for item in text.split(","):
        name, value = item.split("=")
        out[name] = type(getattr(defaults, name))(int(value))
    return out


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser()
    parser.add_argument("--element-size", type=int, required=True)
    parser.add_argument("--set", help="LaunchConfig fields, e.g. flat=1024,flat_warps=4,flat_paired=1")
    parser.add_argument("--best-of", help="a flat_probe.py --paired --json file")
    parser.add_argument("--case", default="fp32", help="the probe's case for --best-of")
    args = parser.parse_args(argv[:split])
    override = best_of(args.best_of, args.case) if args.best_of else parse_set(args.set)
    table = v4.launch_config

    def launch_config(n_tokens, n_heads_q, n_heads_k, head_dim, rotary_dim, cos_per_token=False, element_size=2):
        config = table(n_tokens, n_heads_q, n_heads_k, head_dim, rotary_dim, cos_per_token, element_size)
        if element_size == args.element_size and n_tokens >= 4096:
            config = config._replace(**override)
        return config

    v4.launch_config = launch_config
    print(f"bench_table_override: element size {args.element_size}, prefills: {override}", flush=True)
    return cli.main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main())
