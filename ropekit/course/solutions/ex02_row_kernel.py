import triton
import triton.language as tl


@triton.jit
def rope_row_kernel(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    """Rotate row ``program_id(0)`` of the contiguous (batch * seq * heads, HEAD_DIM) view of X into OUT.

    NeoX pairs (i, i + HEAD_DIM/2). The row's token sits at position (row // n_heads) % seq_len; COS/SIN are
    half-width float32 tables (table_len, HEAD_DIM/2) whose row p holds cos/sin of position p.
    """
    row = tl.program_id(0)
    position = (row // n_heads) % seq_len
    pairs = tl.arange(0, HEAD_DIM // 2)  # HEAD_DIM is a power of two: no mask needed
    x_a = tl.load(X + row * HEAD_DIM + pairs)
    x_b = tl.load(X + row * HEAD_DIM + HEAD_DIM // 2 + pairs)
    cos = tl.load(COS + position * (HEAD_DIM // 2) + pairs)
    sin = tl.load(SIN + position * (HEAD_DIM // 2) + pairs)
    tl.store(OUT + row * HEAD_DIM + pairs, x_a * cos - x_b * sin)
    tl.store(OUT + row * HEAD_DIM + HEAD_DIM // 2 + pairs, x_b * cos + x_a * sin)
