import triton
import triton.language as tl


@triton.jit
def rope_strided_kernel(X, COS, SIN, OUT, seq_len, n_heads,
                        stride_xb, stride_xs, stride_xh, stride_xd,
                        stride_ob, stride_os, stride_oh, stride_od,
                        HEAD_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Rotate head vector ``program_id(0)`` (numbered batch-major, heads fastest) of X into OUT.

    X and OUT are (batch, seq, heads, HEAD_DIM) views with any strides and a float dtype (float32, float16 or
    bfloat16); compute in float32. HEAD_DIM need not be a power of two: BLOCK_HALF is the power of two >= HEAD_DIM/2.
    NeoX pairs (i, i + HEAD_DIM/2); COS/SIN: contiguous float32 tables (table_len, HEAD_DIM/2), row p = position p.
    """
    row = tl.program_id(0)
    head = row % n_heads
    token = (row // n_heads) % seq_len  # also its position
    batch = row // (n_heads * seq_len)
    pairs = tl.arange(0, BLOCK_HALF)
    # Your code: a mask for the pairs, addresses from the strides, loads, float32 math, stores in OUT's dtype.
