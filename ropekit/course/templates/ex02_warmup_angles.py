import triton
import triton.language as tl


@triton.jit
def angles_kernel(INV_FREQ, OUT, n_positions, n_pairs, BLOCK_P: tl.constexpr, BLOCK_I: tl.constexpr):
    """OUT[p, i] = p * INV_FREQ[i] for the BLOCK_P positions p of program_id(0) and every pair i.

    OUT: contiguous float32 (n_positions, n_pairs). BLOCK_I is the power of two >= n_pairs; n_positions need not
    be a multiple of BLOCK_P. Positions along the block's rows, pairs along its columns.
    """
    positions = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)  # (BLOCK_P,)
    pairs = tl.arange(0, BLOCK_I)  # (BLOCK_I,)
    # Your code: load INV_FREQ (masked), a (BLOCK_P, BLOCK_I) block of angles by broadcasting, a 2-D mask, a store.
