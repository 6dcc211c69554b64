"""The fused kernel's launch sweep: graph time of ``ropekit-fused`` under a bounded set of launch configurations
(tokens a program x heads a program x warps, the streaming hint, the launch order) on the fused benchmark's cases,
against the copy ceiling measured in the same run: how the launch choice (``ropekit.triton.choice.choose_fused``, the
model's) compares with its neighbours on a GPU (docs/tuning.md#fused-launch-table).

    python -m ropekit.bench.fused_tune --out DIR --time-budget 150   # on a GPU: fused_tune.json + a table on stdout
    python -m ropekit.bench.fused_tune --out DIR --dry-run           # anywhere: tiny shapes, every config checked

Every configuration runs through the public op (``ropekit.fused``) inside
:func:`ropekit.triton.fused.forced_fused_config`, on fresh random inputs, and is checked against the float64
reference before it is timed; a configuration that gives a wrong result is reported, not timed. The graphs of one
case (the launch choice among them) are replayed in interleaved rounds (:mod:`ropekit.bench.timing`).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from typing import Optional

import torch

from ..fused.kv_cache import quant_codes
from ..triton.fused import FusedConfig, FusedShape, forced_fused_config, fused_config_for
from .fused import checked_call, cli_parser, impls, stream_for
from .fused_cases import CASES, floor_bytes, tiny

__all__ = ["SWEEP", "TUNED_CASES", "case_shape", "candidates", "tune_case", "tune", "main"]

# FusedConfig fields tried per shape class (block_s, block_h, num_warps[, evict_first, heads_inner[, token_blocks
# [, stages]]]), the table's own choice added first: prefill varies the tile (tokens x heads a program, warps sharing
# it), the streaming hint and the launch order; a decode step has one token per sequence (one token block), so only
# heads, warps and the switches; the backward also the token blocks a program walks (its weight-gradient terms summed
# in registers, one reduction a program) and the software-pipeline stages of that walk.
_E, _I = (True, False), (True, True)  # the hint; the hint with head blocks inner
SWEEP = {
    "prefill": [(2, 8, 4), (8, 8, 4), (4, 8, 8), (8, 8, 8), (16, 4, 8), (4, 8, 4, *_E), (4, 8, 4, False, True),
                (4, 8, 4, *_I), (2, 8, 4, *_I), (8, 8, 4, *_I), (8, 8, 8, *_I), (4, 4, 4, *_I), (4, 4, 2, *_I),
                (8, 4, 4, *_I), (2, 4, 2, *_I), (4, 8, 2, *_I), (2, 4, 4, *_I), (16, 2, 4, *_I),
                # more heads a program: the tile's cos/sin rows are read from L2 once for more heads
                (1, 16, 4, *_I), (2, 16, 4, *_I), (2, 16, 8, *_I), (4, 16, 4, *_I), (4, 16, 8, *_I), (1, 32, 4, *_I),
                (1, 32, 8, *_I), (2, 32, 4, *_I), (2, 32, 8, *_I)],
    "decode": [(1, 2, 2), (1, 4, 4), (1, 8, 2), (1, 8, 8), (1, 8, 4, *_I), (1, 16, 4), (1, 32, 4), (1, 32, 8),
               (1, 64, 8)],
    "backward": [(4, 8, 4, *_I, 1), (4, 8, 4, *_I, 4), (2, 8, 4, *_I, 8), (1, 8, 4, *_I, 8), (1, 8, 4, *_I, 32),
                 (1, 4, 1, *_I, 16), (1, 16, 4, *_I, 16), (1, 8, 8, *_I, 16), (1, 8, 4, *_E, 16),
                 (1, 8, 4, *_I, 16, 1), (1, 8, 4, *_I, 16, 2), (1, 8, 4, *_I, 16, 4), (1, 8, 4, *_I, 4, 3),
                 (1, 8, 4, *_I, 8, 3), (1, 8, 4, *_I, 32, 3), (1, 4, 1, *_I, 16, 3), (1, 4, 2, *_I, 16, 3),
                 (1, 8, 2, *_I, 16, 3), (2, 8, 4, *_I, 8, 3), (1, 16, 4, *_I, 16, 3), (1, 8, 8, *_I, 16, 3),
                 (1, 8, 4, *_E, 16, 3), (1, 8, 4, False, False, 16, 3),
                 # around the rule's step of 16-byte copies (1 x 16 heads of 128 bf16 channels, four stages)
                 (1, 16, 4, *_I, 16, 3), (1, 16, 4, *_I, 16, 5), (1, 16, 4, *_I, 32, 4), (1, 32, 4, *_I, 16, 4)],
}
# most telling first: a sweep cut short by its time budget has measured these
TUNED_CASES = ("qknorm-backward-b4-s4096", "mla-decode-b64", "prefill-b4-s4096", "prefill-b4-s4096-fp8",
               "prefill-b4-s4096-qknorm", "decode-b64", "decode-b64-fp8")


def _kind(case) -> str:
    return "backward" if case.kind == "backward" else "decode" if case.decode else "prefill"


def _width(case) -> int:
    """The widest head vector a program of ``case`` holds: k's, or v's (MLA: the latent row)."""
    return max(case.head_dim, case.latent or 0)


def case_shape(case) -> FusedShape:
    """The shape the library's plan asks the launch choice for on ``case``'s call, the formats written included (k's:
    an fp8_ds_mla entry's k_pe is in the model's dtype)."""
    cache_format, cache_scales = quant_codes(case.dtype if case.ds_mla else case.cache_dtype,
                                             per_head=case.per_head_scales, per_token_head=case.token_head_scales)
    return FusedShape(case.tokens, max(case.heads_q, case.heads_kv), _width(case), case.dtype.itemsize,
                      norm=case.qk_norm, backward=case.kind == "backward",
                      norm_over_heads=case.qk_norm and case.norm_over == "heads", cache_format=cache_format,
                      cache_scales=cache_scales, q_format=quant_codes(case.q_dtype)[0],
                      head_dim=case.head_dim if _width(case) > case.head_dim else 0)


def _table_choice(case) -> FusedConfig:
    """What the launch choice picks for ``case`` outside the interpreter's fixed tiles (on the current device), before
    it counts registers: past the L2 the library compiles this tile for the call and may take twice its heads
    (docs/tuning.md#how-the-library-chooses), which the sweep's neighbours include."""
    return fused_config_for(case_shape(case), None)


def candidates(case) -> list[FusedConfig]:
    """The sweep's configurations for ``case`` (block_h capped at the case's heads), the launch choice's first; a
    forward case whose cache reduces its scales takes each also with v's programs apart (``v_apart``)."""
    heads = max(case.heads_q, case.heads_kv)
    apart = (False, True) if _kind(case) != "backward" and case_shape(case).reduces_scales else (False,)
    choice = _table_choice(case)
    swept = (FusedConfig(*fields) for fields in SWEEP[_kind(case)])
    tiles = [choice] + [c._replace(block_h=min(c.block_h, 1 << (heads - 1).bit_length())) for c in swept]
    out = [choice]
    for config in (tile._replace(v_apart=v_apart) for tile in tiles for v_apart in apart):
        if config not in out:
            out.append(config)
    return out


def tune_case(case, timer, device, ceiling_gbps: Optional[float], seed: int = 0, log=print) -> list[dict]:
    """One row per configuration: checked, then (with a timer) captured; the case's graphs replayed together."""
    build = impls()["ropekit-fused"]
    floor_us = floor_bytes(case) / (ceiling_gbps * 1e3) if ceiling_gbps else None
    table = _table_choice(case)
    rows, pending = [], []
    for i, config in enumerate(candidates(case)):
        row = dict(case=case.name, shape=case_shape(case)._asdict(),
                   **config._asdict(), table=config == table, status="ok", graph_us=None)
        rows.append(row)
        try:
            with forced_fused_config(config), stream_for(case, device):
                # fresh inputs for each configuration: the op rotates q in place
                result, data, fn = checked_call(case, build, device, seed + 1000 * i)
                row.update(result)
                if not row["ok"]:
                    row["status"] = "wrong result"
                elif timer is not None:  # the inputs stay alive while the graph may replay
                    pending.append((row, timer.capture([fn], floor_us or 1.0), (data, fn)))
        except Exception as error:  # noqa: BLE001  (one configuration's failure must not end the sweep)
            row.update(status="error", reason=f"{type(error).__name__}: {error}"[:400])
    if pending:
        for (row, _, _), (median, spread, calls) in zip(pending, timer.replay_rounds([g for _, g, _ in pending])):
            row.update(graph_us=median, graph_spread=spread, graph_calls=calls,
                       floor_pct=100 * floor_us / median if floor_us else None)
    for row in rows:
        log(_line(row))
    return rows


def _line(row: dict) -> str:
    us = f"{row['graph_us']:9.2f}" if row.get("graph_us") is not None else " " * 9
    pct = f"{row['floor_pct']:6.1f}%" if row.get("floor_pct") is not None else " " * 7
    flags = ("E" if row["evict_first"] else "-") + ("I" if row["heads_inner"] else "-") + \
        ("V" if row.get("v_apart") else "-") + ("*" if row["table"] else " ")
    return (f"{row['case']:26s} s={row['block_s']:<3d} h={row['block_h']:<2d} w={row['num_warps']:<2d} "
            f"g={row.get('token_blocks', 1):<2d} p={row.get('stages', 1)}{flags} "
            f"{us} us {pct}  {row['status']}")


def tune(cases, timer, device, *, budget_s: Optional[float] = None, log=print) -> dict:
    """The sweep as one JSON-ready document; once ``budget_s`` seconds have passed no new case starts (its rows are
    "not run"), so a sweep cut short still reports what it measured."""
    start = time.perf_counter()
    ceiling = timer.copy_ceiling() if timer is not None else None
    gbps = ceiling["gbps"] if ceiling else None
    log(f"copy ceiling: {gbps:.0f} GB/s" if gbps else "dry run: checked, not timed")
    rows = []
    for case in cases:
        if budget_s and time.perf_counter() - start > budget_s:
            rows.append(dict(case=case.name, status="not run", reason=f"time budget of {budget_s:g} s used up"))
            log(f"{case.name:26s} not run (time budget)")
            continue
        rows += tune_case(case, timer, device, gbps, log=log)
    best = {}
    for row in rows:
        if row.get("graph_us") is not None and (row["case"] not in best
                                                or row["graph_us"] < best[row["case"]]["graph_us"]):
            best[row["case"]] = row
    for row in best.values():
        log("best " + _line(row))
    return {"benchmark": "fused launch sweep", "environment": _environment(),
            "copy_ceiling": ceiling,
            "cases": [dict(name=c.name, tokens=c.tokens, heads_q=c.heads_q, heads_kv=c.heads_kv, head_dim=c.head_dim,
                           fp8=c.fp8, qk_norm=c.qk_norm, floor_bytes=floor_bytes(c),
                           floor_us=floor_bytes(c) / (gbps * 1e3) if gbps else None) for c in cases],
            "rows": rows, "best": best}


def _environment() -> dict:
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(), "gpu": gpu}


def main(argv=None) -> int:
    from .timing import QUICK, GpuTimer, Settings

    parser = cli_parser("python -m ropekit.bench.fused_tune", __doc__, "fused_tune.json", 150.0)
    parser.add_argument("--cases", nargs="*", default=None, help=f"case names (default {list(TUNED_CASES)})")
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    names = args.cases or list(TUNED_CASES)
    unknown = set(names) - set(by_name)
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}")
    gpu = torch.cuda.is_available() and not args.dry_run
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = [by_name[n] if gpu else tiny(by_name[n]) for n in names]
    timer = GpuTimer(QUICK if args.quick else Settings()) if gpu else None
    doc = tune(cases, timer, device, budget_s=args.time_budget)
    doc["command"] = "python -m ropekit.bench.fused_tune " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fused_tune.json").write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {args.out / 'fused_tune.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
