"""Why are one-row programs (v1, v2) slow? Three suspects, each changed alone: cos/sin traffic, program size, and
how many programs an SM holds."""

from __future__ import annotations

import torch

from ... import frequencies
from ...triton import v1, v2
from .. import perf_model
from .kernels import rows_rope
from .registry import experiment

ROWS_PER_PROGRAM = (1, 2, 4, 8, 16)


def _variants(lab, x, cos, sin, out, package_name: str, package_call) -> list[dict]:
    batch, seq, heads, head_dim = x.shape
    n_rows, size = batch * seq * heads, x.element_size()
    moved = 2 * x.nbytes
    rows = [lab.time(package_name, package_call, moved, perf_model.row_launch(n_rows, head_dim, size))]
    for per_program in ROWS_PER_PROGRAM:
        rows.append(lab.time(f"{per_program} row(s) a program", lambda r=per_program: rows_rope(x, cos, sin, out, r),
                             moved, perf_model.row_launch(n_rows, head_dim, size, rows_per_program=per_program),
                             rows_per_program=per_program, tables=True, num_warps=4))
    rows.append(lab.time("1 row a program, no cos/sin loads", lambda: rows_rope(x, cos, sin, out, 1, False), moved,
                         perf_model.row_launch(n_rows, head_dim, size), rows_per_program=1, tables=False))
    rows.append(lab.time("1 row a program, 1 warp (more programs per SM)",
                         lambda: rows_rope(x, cos, sin, out, 1, True, num_warps=1), moved,
                         perf_model.row_launch(n_rows, head_dim, size, num_warps=1), rows_per_program=1,
                         tables=True))
    return rows


@experiment("row_programs", "Why do v1 and v2 reach only a quarter of the copy ceiling?")
def row_programs(lab) -> dict:
    """The package's v1 (float32, head_dim 64) and v2 (bfloat16, head_dim 128), next to the ablation's row kernel
    with one switch changed at a time: rows per program (1 = v1/v2's work), the cos/sin loads removed, one warp per
    program instead of four (twice as many programs resident per SM)."""
    out, share = {}, {}
    for name, shape, dtype, kernel in (("fp32", ((4, 4096, 32, 64), (1, 3, 4, 8)), torch.float32, v1.rope_v1),
                                       ("bf16", ((4, 4096, 32, 128), (1, 3, 4, 8)), torch.bfloat16, v2.rope_v2)):
        batch, seq, heads, head_dim = lab.shape(*shape)
        x = lab.randn((batch, seq, heads, head_dim), dtype)
        y = torch.empty_like(x)
        cos, sin = frequencies.cos_sin_table(seq, head_dim, device=lab.device)
        label = f"{kernel.__name__.split('_')[-1]} (package)"
        rows = _variants(lab, x, cos, sin, y, label, lambda: kernel(x, cos, sin, y))
        for r in rows:
            r["case"] = f"{name} {tuple(x.shape)}"
        out[name] = rows
        # cos/sin bytes the one-row programs request, per byte of x they must move (all L2 hits after the first)
        share[name] = perf_model.rope_bytes(batch * seq, heads, head_dim, x.element_size(),
                                            table_rows_per_token=heads)["tables_per_floor_byte"]
    return {"rows": out["fp32"] + out["bf16"], "table_bytes_per_floor_byte": share}
