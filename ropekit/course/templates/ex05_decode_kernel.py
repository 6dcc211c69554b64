import triton
import triton.language as tl


@triton.jit
def rope_decode_kernel(X, COS, SIN, OUT, OFFSETS, seq_len, n_heads,
                       HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, CONJUGATE: tl.constexpr):
    """Rotate row ``program_id(0)`` of the contiguous (batch * seq * heads, HEAD_DIM) view of X into OUT.

    Decode: token s of sequence b sits at position OFFSETS[b] + s (OFFSETS: each sequence's KV-cache length).
    Partial rotary: only the first ROTARY_DIM channels turn, NeoX pairs (i, i + ROTARY_DIM/2); the other channels
    are copied unchanged. CONJUGATE: rotate by -θ (the backward pass). COS/SIN: float32 tables
    (table_len, ROTARY_DIM/2). float32 X and OUT; ROTARY_DIM and HEAD_DIM - ROTARY_DIM are powers of two.
    """
    row = tl.program_id(0)
    token = (row // n_heads) % seq_len
    batch = row // (n_heads * seq_len)
    # Your code: the position, the cos/sin row (negated sin for CONJUGATE), the rotation, the tail copy.
