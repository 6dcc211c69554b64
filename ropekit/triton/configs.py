"""What a launch choice is: the configurations of the kernels, and the shapes they are chosen for.

:mod:`ropekit.triton.choice` turns a shape into a configuration (the performance model, refined by a bounded
autotune cached on disk); the launchers (:mod:`ropekit.triton.launch`, :mod:`ropekit.triton.fused`) turn a
configuration into a grid and a kernel's block sizes.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["TileConfig", "FlatConfig", "FusedConfig", "RopeShape", "FusedShape", "next_pow2", "cdiv", "flat_half_width",
           "flat_rows"]


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1). Plain Python: the host path calls it on every plan, and
    triton.next_power_of_2 / triton.cdiv are constexpr functions in some Triton versions, microseconds from host code."""
    return 1 << (max(n, 1) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """a / b rounded up."""
    return -(-a // b)


class TileConfig(NamedTuple):
    """The tile kernel (``ropekit.triton.v4``): a program rotates ``block_s`` tokens x ``block_h`` heads."""

    block_s: int  # tokens a program
    block_h: int  # heads a program (with fused_qk: at least q's head count, and k's heads beside them)
    num_warps: int
    fused_qk: bool = False  # one program takes every head of q and of k for its tokens (cos/sin fetched once)
    evict_first: bool = False  # the streaming cache hint on q/k loads and stores
    heads_inner: bool = False  # launch order: the head blocks of one token block next to each other


class FlatConfig(NamedTuple):
    """The flat kernel (``ropekit.triton.v4_flat``): a program rotates the consecutive head vectors ``block``
    elements hold (at least one; each half of a vector padded to a power of two)."""

    block: int  # elements a program (of q, then of k; with paired, of each of q and k)
    num_warps: int
    paired: bool = False  # the same block of q and of k in one program (q and k of one shape)
    streaming: bool = False  # the streaming cache hint on loads and stores


def flat_half_width(head_dim: int) -> int:
    """The flat kernel's lanes for one half of a head vector: ``head_dim / 2`` padded to a power of two (a tensor's
    extent in Triton; the padding is masked)."""
    return next_pow2(head_dim // 2)


def flat_rows(block: int, head_dim: int) -> int:
    """Head vectors a flat program takes: as many as ``block`` elements hold with each half of a vector padded to
    :func:`flat_half_width` (the kernel's tile), at least one."""
    return max(1, block // (2 * flat_half_width(head_dim)))


class FusedConfig(NamedTuple):
    """The fused kernels (``ropekit.triton.fused``): a program takes ``block_s`` tokens x ``block_h`` heads of q, or
    of k with the same heads of v (with ``v_apart``, of k, or of v)."""

    block_s: int
    block_h: int
    num_warps: int
    evict_first: bool = False  # the streaming hint on activation loads and on every store
    heads_inner: bool = False  # launch order: the head blocks of one token block next to each other
    token_blocks: int = 1  # backward: token blocks a program walks, its weight-gradient terms summed in registers
    stages: int = 1  # backward: software-pipeline stages of that walk
    # forward with a cache write of v: v's head blocks in programs of their own, after k's, instead of in k's programs
    v_apart: bool = False


class RopeShape(NamedTuple):
    """What a RoPE launch choice depends on."""

    n_tokens: int  # batch x seq (packed tokens for varlen)
    n_heads_q: int
    n_heads_k: int  # 0 without k
    head_dim: int
    rotary_dim: int
    element_size: int  # bytes of one q element
    cos_per_token: bool  # full-width cos/sin rows per token instead of a table read at positions
    flat_ok: bool  # the flat kernel can run this call (contiguous, out of place, NeoX over the whole head, table)
    same_shape: bool = True  # k has q's shape (the flat kernel may pair them)
    varlen: bool = False  # packed sequences: the grid covers the longest one for each
    # cos/sin computed in the kernel (table-free angles, a NoPE layer's temperature) or read at a position a pair
    # (M-RoPE): work a program's heads share
    computed_angles: bool = False


class FusedShape(NamedTuple):
    """What a fused launch choice depends on."""

    n_tokens: int
    n_heads: int  # the larger of q's and k's head counts
    width: int  # the widest head vector a program holds (k's, or v's)
    element_size: int
    norm: bool = False  # QK-norm
    backward: bool = False  # the QK-norm + RoPE backward
    norm_over_heads: bool = False  # the norm runs over all heads of a token: a program holds every head
    # the formats written, each with its own costs (a float8 or an int8 rounding, NVFP4's packing, a scale reduced
    # per (token, head)): the cache's format and scales and q's output format (ropekit.triton.fused_tiles' codes,
    # 0 being PLAIN: a cache in its own dtype, or none)
    cache_format: int = 0
    cache_scales: int = 0
    q_format: int = 0
    # the rotated head vectors' width (q's, k's) where v is wider and sets ``width`` (MLA's latent beside its rope
    # part); 0: ``width`` itself
    head_dim: int = 0

    @property
    def rotated_width(self) -> int:
        """The width of the head vectors q's programs hold: what a prefill program's tile streams (q is most of the
        bytes), where ``width`` bounds the registers of the widest program."""
        return self.head_dim or self.width

    @property
    def quantised_cache(self) -> bool:
        """A quantised cache is written (float8, int8 or NVFP4: a byte an element or less, and a rounding)."""
        return self.cache_format != 0

    @property
    def reduces_scales(self) -> bool:
        """The cache's store reduces its scales itself: per (token, head) or per 16 channels (the cache's scales code
        2 or 3, ``fused_tiles.PER_TOKEN_HEAD``, NVFP4's ``PER_BLOCK``)."""
        return self.cache_scales in (2, 3)

    @property
    def per_token_head_scales(self) -> bool:
        """The cache's scales are computed one a (token, head) from the head vector (``fused_tiles.PER_TOKEN_HEAD``):
        a reduction over each head vector of k and of v."""
        return self.cache_scales == 2

    @property
    def heavy_store(self) -> bool:
        """The store does per-head arithmetic beyond a cast: the cache's scales reduced (:attr:`reduces_scales`), or
        q quantised (every q head rounded)."""
        return self.reduces_scales or self.q_format != 0
