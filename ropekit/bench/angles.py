"""Angles without a table: how accurate they are and when they are faster than the float64-angle table.

    python -m ropekit.bench.angles --out DIR             # on a GPU: accuracy at 1e3, 1e6, 1e7, then the timings
    python -m ropekit.bench.angles --out DIR --no-speed  # accuracy only (on a CPU: the Triton interpreter and native)

**Accuracy.** For positions ``p0 .. p0 + window - 1`` (``p0`` = 1e3, 1e6, 1e7) and two bases, the truth is cos and
sin of the float64 angle ``position * inv_freq`` (``ropekit.reference.angles``), which ``torch.cos`` reduces mod 2π
in float64 (then cos/sin in float64). A float32 probe ``q`` holds 1 in each pair's first channel and 0 in its second,
so that ``apply_rope`` writes back exactly the cos (first channel) and sin (second) the kernel rotated by. Three rows
per point: the table (``apply_rope`` reading the float64-angle table's rows at those positions, bit-identical to
``cos_sin_table``'s), table-free (``apply_rope(inv_freq=...)``), and for comparison the alternative the kernel does
not take: float32 cos/sin of the reduced angle rounded to float32 (evaluated here with torch's float32 cos/sin, not
in the kernel). Errors are absolute and in units of one float32 ulp of the true value. Under the Triton interpreter
the kernel's float64 cos/sin are numpy's (on a GPU: libdevice's ``__nv_cos``/``__nv_sin``).

**Speed** (CUDA only). Llama-3-8B attention shapes (32 q / 8 kv heads x 128, bf16, out of place): decode b64 with
per-sequence offsets below 8192 and near 1e6 (a table of 8192 or 1,048,576 rows), small prefill b1 s512, prefill b4
s4096; and ``rope_and_cache`` (q rotated, k rotated and v copied into a paged bf16 cache by slot mapping, one launch) at
the two decode steps. Each call is captured back to back in a CUDA graph and replayed
(``ropekit.bench.timing.GpuTimer``); the table and the table-free graphs of a case replay in interleaved rounds. The
table is built once, outside the timing. Prints one line a case saying which wins, and writes ``angles.json`` to
``--out``.
"""

from __future__ import annotations

import math
import sys

import torch

import ropekit
from ropekit import reference
from ropekit.bench import study
from ropekit.frequencies import cos_sin_at, inverse_frequencies

__all__ = ["accuracy", "speed", "main"]

START_POSITIONS = (1_000, 1_000_000, 10_000_000)
BASES = (10_000.0, 500_000.0)


def _probe(window: int, rotary_dim: int, device) -> torch.Tensor:
    """(1, window, 1, rotary_dim) float32: 1 in every pair's first channel (NeoX: the first half), 0 in its second."""
    q = torch.zeros(1, window, 1, rotary_dim, device=device)
    q[..., : rotary_dim // 2] = 1.0
    return q


def _errors(got: torch.Tensor, truth: torch.Tensor) -> dict:
    """Max absolute error and max error in float32 ulps of the true value."""
    err = (got.double().cpu() - truth).abs()
    ulp = torch.abs(torch.nextafter(truth.float(), torch.tensor(math.inf)).double() - truth.float().double())
    return {"max_abs": float(err.max()), "max_ulp": float((err / ulp).max())}


def accuracy(device, backend: str | None = None, rotary_dim: int = 128, window: int = 4096) -> list[dict]:
    """Rows ``{start, base, path, cos: {max_abs, max_ulp}, sin: {...}}`` for the table, table-free and the
    float32-reduced alternative at each start position and base."""
    rows = []
    half = rotary_dim // 2
    probe = _probe(window, rotary_dim, device)
    ids = torch.arange(window, device=device)[None]
    for start in START_POSITIONS:
        positions = torch.arange(start, start + window, dtype=torch.int64)
        for base in BASES:
            inv_freq = inverse_frequencies(rotary_dim, base)
            theta = reference.angles(positions, inv_freq)  # float64, (window, half)
            truth = {"cos": torch.cos(theta), "sin": torch.sin(theta)}
            cos, sin = cos_sin_at(positions, inv_freq, device=device)  # the float64-angle table's rows
            table_out, _ = ropekit.apply_rope(probe, None, cos, sin, positions=ids, backend=backend)
            free_out, _ = ropekit.apply_rope(probe, None, inv_freq=inv_freq.to(device), positions=start,
                                             backend=backend)
            # the alternative: the reduced angle in (-π, π] (from the truth's own cos and sin, atan2 in float64),
            # rounded to float32, cos/sin in float32
            reduced32 = torch.atan2(truth["sin"], truth["cos"]).float()
            outputs = {"table": table_out[0, :, 0], "table-free": free_out[0, :, 0],
                       "fp32-reduced-angle": torch.cat((torch.cos(reduced32), torch.sin(reduced32)), -1)}
            for path, out in outputs.items():
                rows.append({"start": start, "base": base, "path": path,
                             "cos": _errors(out[:, :half], truth["cos"]), "sin": _errors(out[:, half:], truth["sin"]),
                             "values_unlike_the_table": int((out.cpu() != outputs["table"].cpu()).sum())})
    return rows


def _llama_case(name: str, batch: int, seqlen: int, *, offsets_below: int | None = None, offsets_from: int = 0,
                op: str = "apply_rope"):
    return {"name": name, "batch": batch, "seqlen": seqlen, "offsets_below": offsets_below,
            "offsets_from": offsets_from, "op": op}


CASES = (
    _llama_case("decode-b64-pos<8192", 64, 1, offsets_below=8192),
    _llama_case("decode-b64-pos~1e6", 64, 1, offsets_below=1 << 20, offsets_from=(1 << 20) - 8192),
    _llama_case("small-prefill-b1-s512", 1, 512),
    _llama_case("llama3-8b-prefill-b4-s4096", 4, 4096),
    _llama_case("cache-decode-b64-pos<8192", 64, 1, offsets_below=8192, op="rope_and_cache"),
    _llama_case("cache-decode-b64-pos~1e6", 64, 1, offsets_below=1 << 20, offsets_from=(1 << 20) - 8192,
                op="rope_and_cache"),
)


def _calls(case: dict, q, k, cos, sin, inv_freq, positions) -> dict:
    """The table and the table-free call of a case: ``apply_rope``, or ``rope_and_cache`` into a paged cache (16-row
    blocks, a slot a token) whose v is k-shaped."""
    if case["op"] == "apply_rope":
        return {"table": lambda: ropekit.apply_rope(q, k, cos, sin, positions=positions),
                "table-free": lambda: ropekit.apply_rope(q, k, inv_freq=inv_freq, positions=positions)}
    v = torch.randn_like(k)
    tokens = k.shape[0] * k.shape[1]
    k_cache, v_cache = (torch.zeros(-(-tokens // 16) + 1, 16, *k.shape[2:], device=k.device, dtype=k.dtype)
                        for _ in range(2))
    cache = dict(k_cache=k_cache, v_cache=v_cache, positions=positions, write_k=True,
                 slot_mapping=torch.randperm(tokens, device=k.device))
    return {"table": lambda: ropekit.rope_and_cache(q, k, v, cos, sin, **cache),
            "table-free": lambda: ropekit.rope_and_cache(q, k, v, inv_freq=inv_freq, **cache)}


def speed(device, timer=None, cases=CASES) -> list[dict]:
    """Graph-replay µs per call of the table and the table-free rotation for each case (``timer``: a
    ``ropekit.bench.timing`` timer, the GPU's by default)."""
    from ropekit.bench.timing import GpuTimer, Settings

    timer = timer or GpuTimer(Settings())
    rotary_dim, heads_q, heads_k = 128, 32, 8
    inv_freq = inverse_frequencies(rotary_dim, 500_000.0).to(device)
    rows = []
    for case in cases:
        b, s = case["batch"], case["seqlen"]
        q = torch.randn(b, s, heads_q, rotary_dim, device=device, dtype=torch.bfloat16)
        k = torch.randn(b, s, heads_k, rotary_dim, device=device, dtype=torch.bfloat16)
        if case["offsets_below"] is not None:
            table_rows = case["offsets_below"] + s
            positions = torch.randint(case["offsets_from"], case["offsets_below"], (b,), device=device)
        else:
            table_rows, positions = s, None
        cos, sin = ropekit.cos_sin_table(table_rows, rotary_dim, inv_freq=inv_freq, device=device)
        calls = _calls(case, q, k, cos, sin, inv_freq, positions)
        want, got = calls["table"](), calls["table-free"]()
        agree = max(float((w.float() - g.float()).abs().max()) for w, g in zip(want, got))
        moved = 2 * (q.numel() + k.numel()) * q.element_size()
        estimate_us = moved / 3.0e6  # bytes over ~3 TB/s: only sizes the graph
        graphs = {path: timer.capture([fn], estimate_us) for path, fn in calls.items()}
        timings = timer.replay_rounds(list(graphs.values()))
        row = {**case, "table_rows": table_rows, "table_bytes": 2 * cos.numel() * cos.element_size(),
               "max_abs_difference": agree}
        for path, (median_us, spread, n_calls) in zip(graphs, timings):
            row[path] = {"graph_us": median_us, "spread": spread, "calls_per_graph": n_calls}
        rows.append(row)
    return rows


def _report_accuracy(rows: list[dict]) -> str:
    lines = ["start       base      path                 cos max abs / ulp     sin max abs / ulp     values unlike "
             "the table"]
    for r in rows:
        lines.append(f"{r['start']:<11d} {r['base']:<9.0f} {r['path']:<20s} {r['cos']['max_abs']:.3e} / "
                     f"{r['cos']['max_ulp']:.3f}   {r['sin']['max_abs']:.3e} / {r['sin']['max_ulp']:.3f}   "
                     f"{r['values_unlike_the_table']}")
    verdicts = []
    for start in START_POSITIONS:
        for base in BASES:
            by_path = {r["path"]: r for r in rows if r["start"] == start and r["base"] == base}
            worse = [f for f in ("cos", "sin")
                     if by_path["table-free"][f]["max_abs"] > by_path["table"][f]["max_abs"]]
            verdicts.append(f"position {start:.0e} base {base:.0f}: table-free "
                            + (f"WORSE than the table in {', '.join(worse)}" if worse else "no worse than the table"))
    return "\n".join(lines + verdicts)


def _report_speed(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        table, free = r["table"]["graph_us"], r["table-free"]["graph_us"]
        winner = "table-free" if free < table else "table"
        lines.append(f"{r['name']:<28s} table {table:8.2f} us  table-free {free:8.2f} us  -> {winner} wins "
                     f"({max(table, free) / min(table, free):.2f}x; table {r['table_bytes'] / 2**20:.1f} MiB, "
                     f"outputs differ by <= {r['max_abs_difference']:.1e})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = study.parser("angles", __doc__, "angles.json", "accuracy only")
    parser.add_argument("--window", type=int, default=4096, help="positions per start position (accuracy)")
    args = parser.parse_args(argv)
    device = ropekit.device.DEVICE
    backends = ["triton"] if device == "cuda" else ["triton", "native"]
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter, native)",
              "accuracy": {}, "speed": None}
    for backend in backends:
        rows = accuracy(device, backend, window=args.window)
        result["accuracy"][backend] = rows
        print(f"== accuracy against float64 position x inv_freq, backend {backend} on {result['device']}")
        print(_report_accuracy(rows))
    return study.finish(args, result, device, "angles.json", speed, _report_speed)

if __name__ == "__main__":
    sys.exit(main())
