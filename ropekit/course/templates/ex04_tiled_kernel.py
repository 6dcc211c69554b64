import triton
import triton.language as tl


@triton.jit
def rope_tiled_kernel(X, COS, SIN, OUT, seq_len, n_heads,
                      stride_xb, stride_xs, stride_xh, stride_ob, stride_os, stride_oh,
                      HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program (i, b) rotates tokens i*BLOCK_S ... i*BLOCK_S + BLOCK_S - 1 of sequence b, every head at once.

    The tile is [BLOCK_S tokens, BLOCK_H heads, HEAD_DIM/2 pairs]; seq_len and n_heads need not be multiples of
    BLOCK_S and BLOCK_H (BLOCK_H is the power of two >= n_heads). Load the tile's cos/sin rows [BLOCK_S, HEAD_DIM/2]
    once and let every head use them. float32 X and OUT, channels contiguous (head-dim stride 1), NeoX pairs, a token's
    position is its index in the sequence; COS/SIN: contiguous float32 tables (table_len, HEAD_DIM/2).
    """
    tokens = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    batch = tl.program_id(1)
    heads = tl.arange(0, BLOCK_H)
    pairs = tl.arange(0, HEAD_DIM // 2)
    # Your code: masks for tokens and heads, cos/sin [BLOCK_S, 1, HALF], x [BLOCK_S, BLOCK_H, HALF], rotate, store.
