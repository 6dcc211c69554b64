"""M-RoPE chosen inside the kernel against materialised per-token rows: the bytes each moves and the time it takes.

    python -m ropekit.bench.mrope --out DIR             # on a GPU: the byte model, then the timings
    python -m ropekit.bench.mrope --out DIR --no-speed  # the byte model only (what a CPU can say)

**The paths**, for the same call (q and k of a Qwen-VL attention layer, (3, batch, seq) temporal, height and width
position ids, a float32 half-width table of ``rotary_dim/2`` columns):

* ``in-kernel``: ``apply_rope(q, k, cos, sin, positions=ids, mrope_section=..., mrope_interleaved=...)``. One launch;
  each pair reads the table row of its own axis' position.
* ``rows: rotate``: the per-token rows built beforehand by ``ropekit.mrope_cos_sin`` (full width, float32, both halves
  equal: transformers' layout), then ``apply_rope(..., per_token=True)``. What each layer pays when a model builds the
  rows once a step and shares them between its layers (transformers does).
* ``rows: build + rotate``: building the rows and rotating. What a layer pays when the rows are not shared, and what
  the step pays once on top of its layers' rotations when they are.
* ``text``: the ordinary rotation at one position per token (``(batch, seq)`` ids), for scale: what M-RoPE would cost
  if choosing the axis were free.

**The byte model** (per call; ``T`` tokens, ``R`` = rotary_dim, ``e`` the bytes of q's dtype):

* q and k: ``2 T (Hq + Hk) D e`` (read and written), the same on every path.
* ``in-kernel``: the ids, ``3 T x 8`` (int64), and per token one float32 cos and one sin per pair, ``T (R/2) 2 x 4``,
  read from a table of ``rows (R/2) 2 x 4`` bytes that stays in L2 when it fits (a text rotation reads as much).
* ``rows: rotate``: both columns of every pair from the token's own row, ``T R 2 x 4``: twice the table values, and
  from DRAM, since no two tokens share a row.
* ``rows: build``: at least the rows written once, ``T R 2 x 4``, and the ids read (the gathers, masks and the
  concatenation of ``mrope_cos_sin`` add their own intermediates on top: a lower bound).
* Memory: the rows, ``T R 2 x 4`` bytes held for the step, which the in-kernel path never allocates.

**Host work of the build** (any machine): the PyTorch operators ``mrope_cos_sin`` dispatches for one call, counted
with a ``TorchDispatchMode``, and how many of them read a device value on the host (``aten._local_scalar_dense``: a
host sync on a GPU, outside CUDA-graph capture). The in-kernel path dispatches none of them.

**Timing** (CUDA only): each call captured back to back in a CUDA graph and replayed
(``ropekit.bench.timing.GpuTimer``), the paths of a case in interleaved rounds; q, k, the table and the rows fit in
L2 or not as the case's size decides (no rotation of buffers): the numbers are labelled with the case's bytes.
Writes ``mrope.json`` to ``--out``.
"""

from __future__ import annotations

import sys

import torch

import ropekit
from ropekit.bench import study

__all__ = ["CASES", "vision_ids", "byte_model", "build_operators", "speed", "main"]

_HEAD_DIM = 128


def _case(name: str, model: str, batch: int, seqlen: int, heads_q: int, heads_k: int, section: tuple,
          interleaved: bool) -> dict:
    return {"name": name, "model": model, "batch": batch, "seqlen": seqlen, "heads_q": heads_q, "heads_k": heads_k,
            "mrope_section": list(section), "mrope_interleaved": interleaved}


# Qwen2.5-VL-7B (28 q / 4 kv heads x 128, sections 16/24/24) and Qwen3-VL-8B (32 / 8 x 128, 24/20/20 interleaved),
# bf16: decode with the cache at positions below 8192, a small prefill, and a long multimodal prefill
CASES = tuple(
    _case(f"{short}-{shape}", model, batch, seqlen, hq, hk, section, interleaved)
    for short, model, hq, hk, section, interleaved in (
        ("qwen2.5vl", "Qwen2.5-VL-7B", 28, 4, (16, 24, 24), False),
        ("qwen3vl", "Qwen3-VL-8B", 32, 8, (24, 20, 20), True))
    for shape, batch, seqlen in (("decode-b64", 64, 1), ("prefill-b1-s512", 1, 512), ("prefill-b1-s16384", 1, 16384))
)


def vision_ids(batch: int, seqlen: int, *, decode_below: int = 8192, generator=None) -> torch.Tensor:
    """(3, batch, seq) int64 ids shaped like Qwen-VL's: a decode step (one token) at a random position below
    ``decode_below`` whose three axes differ (an image's grid position, the worst case for table rows); a prefill of
    64 text tokens (the three axes equal, 0..63) and then an image of seq - 64 tokens on a grid 32 patches wide (its
    temporal id fixed at 64, height 64 + row, width 64 + column)."""
    if seqlen == 1:
        return torch.randint(0, decode_below, (3, batch, 1), generator=generator)
    text = min(64, seqlen)
    ids = torch.arange(text).expand(3, text)
    patch = torch.arange(seqlen - text)
    image = torch.stack((torch.full_like(patch, text), text + patch // 32, text + patch % 32))
    return torch.cat((ids, image), dim=1)[:, None].expand(3, batch, seqlen).contiguous()


def byte_model(case: dict, dtype: torch.dtype = torch.bfloat16, table_rows: int | None = None) -> dict:
    """The byte model of the module docstring for one case: bytes per call of each path, and the rows' memory."""
    tokens = case["batch"] * case["seqlen"]
    rotary, element = _HEAD_DIM, torch.empty(0, dtype=dtype).element_size()
    table_rows = table_rows or _table_rows(case)
    qk = 2 * tokens * (case["heads_q"] + case["heads_k"]) * _HEAD_DIM * element
    ids = 3 * tokens * 8
    table_values = tokens * (rotary // 2) * 2 * 4
    rows = tokens * rotary * 2 * 4
    return {"q_and_k": qk, "ids": ids, "table_bytes": table_rows * (rotary // 2) * 2 * 4,
            "in-kernel": qk + ids + table_values, "rows: rotate": qk + rows,
            "rows: build (at least)": ids + rows, "rows: build + rotate (at least)": qk + ids + 2 * rows,
            "rows_memory": rows}


def build_operators(device, case: dict = CASES[1]) -> dict:
    """The PyTorch operators one ``mrope_cos_sin`` call dispatches (views included) and the host reads among them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    cos, sin = ropekit.cos_sin_table(_table_rows(case), _HEAD_DIM, device=device)
    ids = vision_ids(case["batch"], case["seqlen"]).to(device)
    with _Count() as count:
        ropekit.mrope_cos_sin(cos, sin, ids, case["mrope_section"], interleaved=case["mrope_interleaved"])
    return {"operators": len(count.names), "host_reads": count.names.count("aten._local_scalar_dense.default"),
            "names": count.names}


def _table_rows(case: dict) -> int:
    return max(8192, case["seqlen"] + 64)


def speed(device, timer=None, cases=CASES) -> list[dict]:
    """Graph-replay µs per call of each path for each case (``timer``: a ``ropekit.bench.timing`` timer, the GPU's
    by default), with the largest difference between the in-kernel and the materialised outputs."""
    from ropekit.bench.timing import GpuTimer, Settings

    timer = timer or GpuTimer(Settings())
    generator = torch.Generator().manual_seed(0)
    rows = []
    for case in cases:
        b, s = case["batch"], case["seqlen"]
        q = torch.randn(b, s, case["heads_q"], _HEAD_DIM, device=device, dtype=torch.bfloat16)
        k = torch.randn(b, s, case["heads_k"], _HEAD_DIM, device=device, dtype=torch.bfloat16)
        table_rows = _table_rows(case)
        cos, sin = ropekit.cos_sin_table(table_rows, _HEAD_DIM, base=1_000_000.0, device=device)
        ids = vision_ids(b, s, generator=generator).to(device)
        section, interleaved = case["mrope_section"], case["mrope_interleaved"]
        row_cos, row_sin = ropekit.mrope_cos_sin(cos, sin, ids, section, interleaved=interleaved)
        text_ids = ids[0]

        def build_and_rotate():
            c, s_ = ropekit.mrope_cos_sin(cos, sin, ids, section, interleaved=interleaved)
            return ropekit.apply_rope(q, k, c, s_, per_token=True)

        calls = {
            "in-kernel": lambda: ropekit.apply_rope(q, k, cos, sin, positions=ids, mrope_section=section,
                                                    mrope_interleaved=interleaved),
            "rows: rotate": lambda: ropekit.apply_rope(q, k, row_cos, row_sin, per_token=True),
            "rows: build + rotate": build_and_rotate,
            "text": lambda: ropekit.apply_rope(q, k, cos, sin, positions=text_ids),
        }
        want, got = calls["rows: rotate"](), calls["in-kernel"]()
        agree = max(float((w.float() - g.float()).abs().max()) for w, g in zip(want, got))
        model = byte_model(case, q.dtype, table_rows)
        estimate_us = model["in-kernel"] / 3.0e6  # bytes over ~3 TB/s: only sizes the graphs
        graphs = {path: timer.capture([fn], estimate_us) for path, fn in calls.items()}
        timings = timer.replay_rounds(list(graphs.values()))
        row = {**case, "table_rows": table_rows, "bytes": model, "max_abs_difference": agree}
        for path, (median_us, spread, n_calls) in zip(graphs, timings):
            row[path] = {"graph_us": median_us, "spread": spread, "calls_per_graph": n_calls}
        rows.append(row)
    return rows


def _mib(n: int) -> str:
    return f"{n / 2**20:8.2f} MiB"


def _report_bytes(cases=CASES) -> str:
    lines = [f"{'case':<28s} {'q and k':>12s} {'angles: in-kernel':>18s} {'angles: rows':>13s} {'rows: build':>12s} "
             f"{'rows memory':>12s}   (bytes per call; in-kernel: ids + table values, mostly from L2; build: a lower "
             "bound)"]
    for case in cases:
        m = byte_model(case)
        lines.append(f"{case['name']:<28s} {_mib(m['q_and_k'])} {_mib(m['in-kernel'] - m['q_and_k']):>18s} "
                     f"{_mib(m['rows: rotate'] - m['q_and_k']):>13s} {_mib(m['rows: build (at least)'])} "
                     f"{_mib(m['rows_memory'])}")
    return "\n".join(lines)


def _report_speed(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        us = {path: r[path]["graph_us"] for path in ("in-kernel", "rows: rotate", "rows: build + rotate", "text")}
        lines.append(f"{r['name']:<28s} in-kernel {us['in-kernel']:8.2f} us   rows: rotate {us['rows: rotate']:8.2f} us"
                     f" ({us['rows: rotate'] / us['in-kernel']:.2f}x)   rows: build + rotate "
                     f"{us['rows: build + rotate']:8.2f} us ({us['rows: build + rotate'] / us['in-kernel']:.2f}x)   "
                     f"text {us['text']:8.2f} us   (outputs differ by <= {r['max_abs_difference']:.1e})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = study.parser("mrope", __doc__, "mrope.json", "the byte model only").parse_args(argv)
    device = ropekit.device.DEVICE
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "bytes": {case["name"]: byte_model(case) for case in CASES}, "speed": None,
              "build_operators": build_operators(device)}
    print("== byte model (bf16 q and k, float32 table and rows, rotary_dim 128)")
    print(_report_bytes())
    ops = result["build_operators"]
    print(f"== building the rows (ropekit.mrope_cos_sin, one call): {ops['operators']} PyTorch operators, "
          f"{ops['host_reads']} of them host reads of a device value; the in-kernel path: none")
    return study.finish(args, result, device, "mrope.json", speed, _report_speed)

if __name__ == "__main__":
    sys.exit(main())
