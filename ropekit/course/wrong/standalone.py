"""Deliberately wrong kernels for diagnoses the tests prove on exercises of their own (used by tests/test_course.py).

The tests register a small exercise around each (its launch is here too), so that the diagnosis does not depend on
what a notebook's exercise asks. Each kernel has one mistake, marked ``# MISTAKE``.
"""

import triton
import triton.language as tl


def run_tiles(kernel, inputs):
    """Launch a tiled kernel (tiles of 4 tokens x all heads of one sequence) on the checker's inputs."""
    x, out = inputs.x.view, inputs.out.view
    batch, seq, heads, head_dim = x.shape
    kernel[(triton.cdiv(seq, 4), batch)](x, inputs.cos.view, inputs.sin.view, out, seq, heads,
                                         x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1),
                                         out.stride(2), HEAD_DIM=head_dim, BLOCK_S=4,
                                         BLOCK_H=triton.next_power_of_2(heads))
    return out


@triton.jit
def tile_without_head_axis(X, COS, SIN, OUT, seq_len, n_heads, stride_xb, stride_xs, stride_xh,
                            stride_ob, stride_os, stride_oh,
                            HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    heads = tl.arange(0, BLOCK_H)
    pairs = tl.arange(0, HEAD_DIM // 2)
    token_ok = tokens < seq_len
    table = tokens[:, None] * (HEAD_DIM // 2) + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)  # MISTAKE: no [:, None, :]
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)
    mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]
    x = X + batch * stride_xb + tokens[:, None, None] * stride_xs + heads[None, :, None] * stride_xh \
        + pairs[None, None, :]
    out = OUT + batch * stride_ob + tokens[:, None, None] * stride_os + heads[None, :, None] * stride_oh \
        + pairs[None, None, :]
    x_a = tl.load(x, mask=mask, other=0.0)
    x_b = tl.load(x + HEAD_DIM // 2, mask=mask, other=0.0)
    tl.store(out, x_a * cos - x_b * sin, mask=mask)
    tl.store(out + HEAD_DIM // 2, x_b * cos + x_a * sin, mask=mask)


def run_partial(kernel, inputs):
    """Launch a one-row partial-rotary kernel (contiguous x and out) on the checker's inputs."""
    x, out = inputs.x.view, inputs.out.view
    batch, seq, heads, head_dim = x.shape
    kernel[(batch * seq * heads,)](x, inputs.cos.view, inputs.sin.view, out, seq, heads, HEAD_DIM=head_dim,
                                   ROTARY_DIM=inputs.case.rot)
    return out


@triton.jit
def partner_half_the_head(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr):
    row = tl.program_id(0)
    position = (row // n_heads) % seq_len
    pairs = tl.arange(0, ROTARY_DIM // 2)
    cos = tl.load(COS + position * (ROTARY_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (ROTARY_DIM // 2) + pairs)
    x_a = tl.load(X + row * HEAD_DIM + pairs)
    x_b = tl.load(X + row * HEAD_DIM + HEAD_DIM // 2 + pairs)  # MISTAKE: the partner is i + ROTARY_DIM // 2
    tl.store(OUT + row * HEAD_DIM + pairs, x_a * cos - x_b * sin)
    tl.store(OUT + row * HEAD_DIM + HEAD_DIM // 2 + pairs, x_b * cos + x_a * sin)
    tail = ROTARY_DIM + tl.arange(0, HEAD_DIM - ROTARY_DIM)
    tl.store(OUT + row * HEAD_DIM + tail, tl.load(X + row * HEAD_DIM + tail))
