import triton
import triton.language as tl


@triton.jit
def rotate_half_kernel(X, OUT, D: tl.constexpr):
    """Row program_id(0) of the contiguous (rows, D) tensor X: OUT's row = cat(-x[D/2:], x[:D/2]).

    D is a power of two. This is transformers' rotate_half: with it, RoPE is x * cos + rotate_half(x) * sin.
    """
    row = tl.program_id(0)
    HALF: tl.constexpr = D // 2  # a block length must be a compile-time constant: declare it one
    lanes = tl.arange(0, HALF)
    first = tl.load(X + row * D + lanes)
    second = tl.load(X + row * D + HALF + lanes)
    tl.store(OUT + row * D + lanes, -second)
    tl.store(OUT + row * D + HALF + lanes, first)
