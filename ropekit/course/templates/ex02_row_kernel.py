import triton
import triton.language as tl


@triton.jit
def rope_row_kernel(X, COS, SIN, OUT, seq_len, n_heads, HEAD_DIM: tl.constexpr):
    """Rotate row ``program_id(0)`` of the contiguous (batch * seq * heads, HEAD_DIM) view of X into OUT.

    NeoX pairs (i, i + HEAD_DIM/2). The row's token sits at position (row // n_heads) % seq_len; COS/SIN are
    half-width float32 tables (table_len, HEAD_DIM/2) whose row p holds cos/sin of position p.
    """
    row = tl.program_id(0)
    # Your code: load the row's two halves and its token's cos/sin row, rotate, store both halves.
