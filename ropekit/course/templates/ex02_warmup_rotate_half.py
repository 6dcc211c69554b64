import triton
import triton.language as tl


@triton.jit
def rotate_half_kernel(X, OUT, D: tl.constexpr):
    """Row program_id(0) of the contiguous (rows, D) tensor X: OUT's row = cat(-x[D/2:], x[:D/2]).

    D is a power of two. This is transformers' rotate_half: with it, RoPE is x * cos + rotate_half(x) * sin.
    """
    row = tl.program_id(0)
    # Your code: a block of D/2 lanes, the two half-rows of X, and OUT's two half-rows.
