import triton
import triton.language as tl


@triton.jit
def rope_tiled_kernel(X, COS, SIN, OUT, seq_len, n_heads,
                      stride_xb, stride_xs, stride_xh, stride_ob, stride_os, stride_oh,
                      HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program (i, b) rotates tokens i*BLOCK_S ... i*BLOCK_S + BLOCK_S - 1 of sequence b, every one of its heads.

    A step of the program rotates a [BLOCK_S tokens, BLOCK_H heads, HEAD_DIM/2 pairs] block. BLOCK_H is smaller than
    n_heads, so the program walks the heads in a loop, BLOCK_H at a time; the tile's cos/sin rows
    [BLOCK_S, HEAD_DIM/2] are loaded once, before the loop, and every step reuses them. seq_len and n_heads need not
    be multiples of BLOCK_S and BLOCK_H: mask tokens and heads. float32 X and OUT, channels contiguous (head-dim
    stride 1), NeoX pairs, a token's position is its index in the sequence; COS/SIN: contiguous float32 tables
    (table_len, HEAD_DIM/2).
    """
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    HALF: tl.constexpr = HEAD_DIM // 2  # pairs per head vector: a block length, so a constexpr (notebook 02, 1.2)
    pairs = tl.arange(0, HALF)
    token_ok = tokens < seq_len  # the last tile may stick out of the sequence
    # cos/sin once per tile: [BLOCK_S, HALF], then a head axis of size 1 that broadcasts over BLOCK_H heads.
    table = tokens[:, None] * HALF + pairs[None, :]
    cos = tl.load(COS + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    sin = tl.load(SIN + table, mask=token_ok[:, None], other=0.0)[:, None, :]
    for first_head in range(0, n_heads, BLOCK_H):  # the head loop: every step reuses the same cos/sin
        heads = first_head + tl.arange(0, BLOCK_H)
        mask = (token_ok[:, None] & (heads < n_heads)[None, :])[:, :, None]  # [BLOCK_S, BLOCK_H, 1]
        x = X + batch * stride_xb + tokens[:, None, None] * stride_xs + heads[None, :, None] * stride_xh \
            + pairs[None, None, :]
        out = OUT + batch * stride_ob + tokens[:, None, None] * stride_os + heads[None, :, None] * stride_oh \
            + pairs[None, None, :]
        x_a = tl.load(x, mask=mask, other=0.0)
        x_b = tl.load(x + HALF, mask=mask, other=0.0)
        tl.store(out, x_a * cos - x_b * sin, mask=mask)
        tl.store(out + HALF, x_b * cos + x_a * sin, mask=mask)
