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
    mask = pairs < HEAD_DIM // 2  # lanes past the last pair do nothing
    x_row = X + batch * stride_xb + token * stride_xs + head * stride_xh
    out_row = OUT + batch * stride_ob + token * stride_os + head * stride_oh
    x_a = tl.load(x_row + pairs * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x_b = tl.load(x_row + (pairs + HEAD_DIM // 2) * stride_xd, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(COS + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    sin = tl.load(SIN + token * (HEAD_DIM // 2) + pairs, mask=mask, other=0.0)
    # One rounding, at the store, to OUT's dtype.
    tl.store(out_row + pairs * stride_od, (x_a * cos - x_b * sin).to(OUT.dtype.element_ty), mask=mask)
    tl.store(out_row + (pairs + HEAD_DIM // 2) * stride_od, (x_b * cos + x_a * sin).to(OUT.dtype.element_ty),
             mask=mask)
