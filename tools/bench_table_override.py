"""``python -m ropekit bench`` with one entry of v4's launch table replaced: a candidate measured in the harness's own
conditions (every implementation's buffer sets alive, graphs replayed in interleaved rounds), which a probe cannot
reproduce (run35: ropekit's fp32 rows read 47.0 µs alone and 47.8 with the other implementations' buffers).

The override applies to calls of one element size and, by default, prefill size (4096 tokens or more;
``--min-tokens``/``--max-tokens`` move the range):

    python tools/bench_table_override.py --element-size 4 --set flat=1024,flat_warps=4,flat_paired=1 -- \\
        --cases fp32 --peers .peers --out /tmp/b
    python tools/bench_table_override.py --element-size 4 --best-of flat_probe.json --case fp32 -- ...

``--best-of`` takes the paired candidate of ``tools/flat_probe.py --paired --json`` with the lowest forward +
conjugate median on that case, or the fastest v4 configuration of ``tools/small_prefill_ladder.py --configs``
(its JSON lists them):

    python tools/bench_table_override.py --element-size 2 --min-tokens 129 --max-tokens 4095 \\
        --best-of small_prefill_ladder.json -- --cases small-prefill --peers .peers --out /tmp/b
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
    """The paired candidate of a ``flat_probe.py --paired`` run with the lowest forward + conjugate median, or the
    fastest configuration of a ``small_prefill_ladder.py --configs`` run."""
    probe = json.load(open(probe_json))
    if "configs" in probe:
        best = min(probe["configs"], key=lambda label: probe["median_us"][label])
        print(f"bench_table_override: fastest configuration: {best} ({probe['median_us'][best]:.2f} µs)")
        return probe["configs"][best]
    medians = probe["median_us"][case]
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
    parser.add_argument("--min-tokens", type=int, default=4096, help="smallest call (batch x seq) overridden")
    parser.add_argument("--max-tokens", type=int, default=2**62, help="largest call (batch x seq) overridden")
    parser.add_argument("--table-only", action="store_true",
                        help="leave calls with per-token cos/sin rows (ropekit-rows) on the table's configuration")
    args = parser.parse_args(argv[:split])
    override = best_of(args.best_of, args.case) if args.best_of else parse_set(args.set)
    table = v4.launch_config

    def launch_config(n_tokens, n_heads_q, n_heads_k, head_dim, rotary_dim, cos_per_token=False, element_size=2):
        config = table(n_tokens, n_heads_q, n_heads_k, head_dim, rotary_dim, cos_per_token, element_size)
        if (element_size == args.element_size and args.min_tokens <= n_tokens <= args.max_tokens
                and not (args.table_only and cos_per_token)):
            config = config._replace(**override)
        return config

    v4.launch_config = launch_config
    print(f"bench_table_override: element size {args.element_size}, {args.min_tokens}-{args.max_tokens} tokens: "
          f"{override}", flush=True)
    return cli.main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main())
