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
    inv_freq = tl.load(INV_FREQ + pairs, mask=pairs < n_pairs, other=0.0)
    angles = positions[:, None].to(tl.float32) * inv_freq[None, :]  # (BLOCK_P, 1) * (1, BLOCK_I)
    inside = (positions[:, None] < n_positions) & (pairs[None, :] < n_pairs)  # a 2-D mask, broadcast the same way
    tl.store(OUT + positions[:, None] * n_pairs + pairs[None, :], angles, mask=inside)
