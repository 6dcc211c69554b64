"""Ladder step 8 — the flat path: blocks of consecutive elements (a teaching copy of step 1 with one idea added).

No tile of tokens x heads at all: q and k are seen as flat runs of elements, and a program takes ``BLOCK``
consecutive elements of q (the first programs) or of k (the rest). Element ``e`` sits in channel ``e % HEAD_DIM``;
its NeoX partner is ``e + HEAD_DIM/2`` (first half) or ``e - HEAD_DIM/2`` (second half), loaded separately. That
second load is served by the cache: the partner lies in a line the same program loads anyway. Every load of a warp
is one long coalesced run and there is no per-tile bookkeeping — the structure of the kernel torch.compile generates
for the eager formula. The package's ``rope_flat_kernel`` (``ropekit.triton.v4_flat``) keeps the flat grid and goes
one step further: a program takes whole head vectors and loads each pair once (notebook 05 measures the step).

It only works where an element's partner is a fixed distance away in memory: **contiguous q, k and outputs, NeoX
pairs over the whole head, out of place** (in place, one program could overwrite a partner another still reads).
Positions are 0..seq-1, as in step 1. The launcher refuses every other call and says so.
"""

import triton
import triton.language as tl

FEATURES = ("q+k",)
BASE = "step1_qk"  # the step this one is a copy of


@triton.jit
def _rotate_block(X, OUT, COS, SIN, block, n_elements, seqlen, n_heads, HEAD_DIM: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Rotate elements [block*BLOCK, +BLOCK) of a contiguous (batch, seq, n_heads, HEAD_DIM) tensor."""
    e = block * BLOCK + tl.arange(0, BLOCK)
    mask = e < n_elements
    channel = e % HEAD_DIM
    first = channel < HEAD_DIM // 2  # the first half of a head vector: x[e] cos - x[partner] sin
    pair = tl.where(first, channel, channel - HEAD_DIM // 2)
    partner = tl.where(first, e + HEAD_DIM // 2, e - HEAD_DIM // 2)
    position = (e // (n_heads * HEAD_DIM)) % seqlen  # the element's token; token s is at position s
    cos = tl.load(COS + position * (HEAD_DIM // 2) + pair, mask=mask, other=0.0)
    sin = tl.load(SIN + position * (HEAD_DIM // 2) + pair, mask=mask, other=0.0)
    x = tl.load(X + e, mask=mask, other=0.0).to(tl.float32)
    x_partner = tl.load(X + partner, mask=mask, other=0.0).to(tl.float32)  # a cache hit: same lines as x's
    tl.store(OUT + e, (x * cos + tl.where(first, -sin, sin) * x_partner).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def rope_step8_kernel(Q, K, OUT_Q, OUT_K, COS, SIN, batch, seqlen, n_heads_q, n_heads_k, HEAD_DIM: tl.constexpr,
                      BLOCK: tl.constexpr):
    """Program p: block p of q's elements, or block p - (q's blocks) of k's."""
    pid = tl.program_id(0)
    n_q = batch * seqlen * n_heads_q * HEAD_DIM
    n_q_blocks = tl.cdiv(n_q, BLOCK)
    if pid < n_q_blocks:  # q's blocks come first on the grid
        _rotate_block(Q, OUT_Q, COS, SIN, pid, n_q, seqlen, n_heads_q, HEAD_DIM, BLOCK)
    else:  # then k's
        _rotate_block(K, OUT_K, COS, SIN, pid - n_q_blocks, batch * seqlen * n_heads_k * HEAD_DIM, seqlen,
                      n_heads_k, HEAD_DIM, BLOCK)


KERNEL = rope_step8_kernel
