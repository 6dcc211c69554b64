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
    # Your code: the token mask; cos/sin [BLOCK_S, 1, HEAD_DIM/2], loaded once; then the loop over the heads,
    # for first_head in range(0, n_heads, BLOCK_H): heads, their mask, x [BLOCK_S, BLOCK_H, HALF], rotate, store.
