import triton
import triton.language as tl


@triton.jit
def copy_kernel(SRC, DST, n, BLOCK: tl.constexpr):
    """Copy the n elements of SRC to DST; program p copies elements p * BLOCK ... p * BLOCK + BLOCK - 1.

    The grid has cdiv(n, BLOCK) programs, so n need not be a multiple of BLOCK: the last program's block runs past
    the end, and its lanes there must neither load nor store.
    """
    pid = tl.program_id(0)
    # Your code: the block of offsets this program owns, a mask for the ones below n, a masked load and store.
