"""The fused benchmark's cases: shapes, byte floors, fresh random inputs with a shuffled paged cache, and the check
of an implementation's outputs against the float64 reference (:mod:`ropekit.reference`) on a sample of tokens.

Bytes: the floor counts each activation and cache tensor read once and written once (q, k, v read; q written in
place, or as one byte an element for a float8 q output; k and v written to the cache, one byte an element for a
quantised cache, half a byte for NVFP4 (``head_dim / 2`` bytes a head vector); the scales written beside it,
:func:`scale_bytes`: a float32 per (token, head), or NVFP4's e4m3 block scale per 16 channels (``head_dim / 16``
bytes a head vector); the backward reads q, k and both output gradients and writes both input gradients). The
per-token metadata (positions, slots, cos/sin rows) is reported by :func:`meta_bytes` and not counted, as in the
published targets, nor are the static scales read (one float32 a tensor or a kv head, or NVFP4's global scale a
cache, :func:`static_scale_bytes`).

Formats (a case's ``kv_cache_dtype``, vLLM's names): ``"auto"`` (the model's dtype), ``"fp8"`` (float8 e4m3, a
scale a tensor, or a kv head with ``per_head_scales``), ``"fp8_e5m2"``, ``"fp8_per_token_head"`` and
``"int8_per_token_head"`` (a scale per token and kv head, computed on write into scale caches), ``"nvfp4"``
(e2m1 values two a byte, an e4m3 block scale per 16 channels computed on write into block-scale caches, one float32
global scale a cache); ``q_dtype``: a float8 q output at one scale. Every quantised output is checked by the reader's
round trip: its stored values times their scales, against the float64 truth, in units of the format's spacing at the
value (NVFP4: the e2m1 spacing at the block's scale, ``block scale x global scale``), and the scales computed on
write against the reference's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from .. import reference
from ..frequencies import cos_sin_table, inverse_frequencies
from ..fused.validate import KV_CACHE_DTYPES, ds_mla_entry_bytes

__all__ = ["FusedCase", "CASES", "tiny", "floor_bytes", "scale_bytes", "static_scale_bytes", "meta_bytes", "Data",
           "Stored", "StoredNvfp4", "StoredDsMla", "make_data", "expected", "actual", "check", "spacing",
           "TABLE_POSITIONS", "BLOCK_SIZE", "EPS", "FP8", "FORMAT_MAX", "NVFP4_GLOBAL_SCALE", "FAR_POSITIONS",
           "NOPE_TEMPERATURE"]

TABLE_POSITIONS, BLOCK_SIZE, EPS = 8192, 16, 1e-6
# the table-free cases' positions: a sequence starts anywhere below a million (a long context), where no table reaches
FAR_POSITIONS = 1_000_000
# Llama 4's NoPE layer (floor_scale, attn_scale): transformers' floor_scale 8192 and attn_scale 0.1
NOPE_TEMPERATURE = (8192, 0.1)
# static scales: the normalised, rotated keys, unit-variance values and queries use the format's range
K_SCALE, V_SCALE, Q_SCALE = 0.05, 0.02, 0.05
# NVFP4's global scale, k's and v's (both unit-variance): over a prefill cache's million blocks, a block's amax over
# its 16 values lies between about 0.45 and the tensor's largest value, about 5.4, so at 2**-8 the block scales
# amax / (6 * 2**-8) lie between about 19 and 231: normal e4m3 numbers (full precision, far above the smallest normal
# 2**-6) below e4m3's 448, and no value below 448 * 6 * 2**-8 = 10.5 saturates its block scale (which would leave it
# further than half an e2m1 spacing from what is read back); a power of two keeps 6 * g and block * g exact
NVFP4_GLOBAL_SCALE = 2.0**-8
FP8 = torch.float8_e4m3fn
# each quantised format: the largest value it stores (a per-(token, head) scale is max|x| over it)
FORMAT_MAX = {fmt: largest for fmt, (_, largest) in reference.CACHE_FORMATS.items()}


@dataclass(frozen=True)
class FusedCase:
    """One shape. ``kind``: "cache" (rope [+ QK-norm] + paged cache write), "mla" (q_pe/k_pe rope + latent cache
    write) or "backward" (QK-norm + RoPE backward). Tokens: ``batch`` sequences of ``seqlen`` (decode: 1).
    ``page_table``: the fused call addresses the cache through FlashInfer's page table (int32 ``kv_indices``,
    ``kv_indptr``, a request and a position per token) instead of a slot mapping; the same rows either way.
    ``kv_cache_dtype``: the cache's format, vLLM's name (``"auto"``: the model's dtype); ``per_head_scales``: its
    static scales one a kv head instead of one a tensor; ``q_dtype``: a float8 q output (out of place, at
    ``Q_SCALE``) instead of q rotated in place; ``norm_over``: the QK-norm's extent, ``"heads"`` all heads of q and of k
    together (OLMo-2's, weights ``(heads * head_dim,)``). ``angles``: ``"table"`` (cos/sin rows read from a table),
    ``"inv_freq"`` (computed in the kernel from the inverse frequencies, no table) or ``"nope"`` (a Llama 4 NoPE layer
    at ``NOPE_TEMPERATURE``: q times its token's temperature, nothing rotated); without a table the positions lie
    anywhere below ``FAR_POSITIONS``."""

    name: str
    title: str
    kind: str
    batch: int
    seqlen: int
    heads_q: int
    heads_kv: int
    head_dim: int  # the rotated width (MLA: rope_dim)
    dtype: torch.dtype = torch.bfloat16
    qk_norm: bool = False
    kv_cache_dtype: str = "auto"
    latent: int = 0  # MLA: kv_lora_rank
    page_table: bool = False
    per_head_scales: bool = False
    q_dtype: Optional[torch.dtype] = None
    norm_over: str = "head"
    angles: str = "table"

    @property
    def tokens(self) -> int:
        return self.batch * self.seqlen

    @property
    def decode(self) -> bool:
        return self.seqlen == 1

    @property
    def cache_dtype(self) -> torch.dtype:
        """What the cache holds: the format's dtype, or the model's (fp8_ds_mla: the entry's bytes)."""
        if self.ds_mla:
            return torch.uint8
        return KV_CACHE_DTYPES[self.kv_cache_dtype][0] or self.dtype

    @property
    def fp8(self) -> bool:
        """A cache format other than the model's own dtype is named (``kv_cache_dtype`` not "auto"): every such case
        of the benchmark writes a quantised cache (float8 or int8)."""
        return self.kv_cache_dtype != "auto"

    @property
    def token_head_scales(self) -> bool:
        """Scales computed on write, one a token and kv head, stored in scale caches beside the caches."""
        return not self.ds_mla and KV_CACHE_DTYPES[self.kv_cache_dtype][1]

    @property
    def ds_mla(self) -> bool:
        """MLA's cache is DeepSeek's fp8_ds_mla entry: kv_c in e4m3 at a scale a 128-channel tile, computed and
        written in the entry, and the rotated k_pe in the model's dtype."""
        return self.kv_cache_dtype == "fp8_ds_mla"

    @property
    def entry_bytes(self) -> int:
        """MLA: one token's cache entry, in bytes."""
        if self.ds_mla:
            return ds_mla_entry_bytes(self.latent, self.head_dim, self.dtype)
        return (self.latent + self.head_dim) * self.cache_dtype.itemsize

    @property
    def nvfp4(self) -> bool:
        """The caches are NVFP4: ``head_dim / 2`` bytes a head vector, block-scale caches of ``head_dim / 16``."""
        return self.kv_cache_dtype == "nvfp4"

    @property
    def quantised(self) -> bool:
        """Some output is quantised (the cache or q): the case is judged by the formats' targets."""
        return self.fp8 or self.q_dtype is not None

    @property
    def format(self) -> str:
        """The quantised outputs in words ("" for none), e.g. "float8 e4m3 cache per (token, head)"."""
        names = {torch.float8_e4m3fn: "float8 e4m3", torch.float8_e5m2: "float8 e5m2", torch.int8: "int8"}
        parts = []
        if self.nvfp4:
            parts.append("NVFP4 cache (e2m1, an e4m3 scale per 16 channels, a global scale)")
        elif self.ds_mla:
            parts.append("fp8_ds_mla cache (kv_c float8 e4m3 per 128-channel tile, k_pe in the model's dtype)")
        elif self.fp8:
            scales = ("per (token, head)" if self.token_head_scales else "per kv head" if self.per_head_scales
                      else "per tensor")
            parts.append(f"{names[self.cache_dtype]} cache {scales}")
        if self.q_dtype is not None:
            parts.append(f"{names[self.q_dtype]} q")
        return ", ".join(parts)


_LLAMA = dict(heads_q=32, heads_kv=8, head_dim=128)
_SCOUT_NOPE = dict(heads_q=40, heads_kv=8, head_dim=128, angles="nope")  # Llama-4-Scout's NoPE layers
_OLMO2 = dict(heads_q=32, heads_kv=32, head_dim=128, qk_norm=True, norm_over="heads")  # OLMo-2-7B: MHA


def _formats(suffix: str, what: str, **fields) -> tuple:
    """The Llama-3-8B decode b64 and prefill b4 s4096 cases of one format."""
    return (FusedCase(f"decode-b64-{suffix}", f"Llama-3-8B decode b64, paged {what}", "cache", 64, 1, **fields,
                      **_LLAMA),
            FusedCase(f"prefill-b4-s4096-{suffix}", f"Llama-3-8B prefill b4 s4096, paged {what}", "cache", 4, 4096,
                      **fields, **_LLAMA))


CASES = (
    FusedCase("decode-b64", "Llama-3-8B decode b64, paged bf16", "cache", 64, 1, **_LLAMA),
    FusedCase("prefill-b4-s4096", "Llama-3-8B prefill b4 s4096, paged bf16", "cache", 4, 4096, **_LLAMA),
    FusedCase("decode-b64-qknorm", "Qwen3-8B decode b64 + QK-norm", "cache", 64, 1, qk_norm=True, **_LLAMA),
    FusedCase("prefill-b4-s4096-qknorm", "Qwen3-8B prefill b4 s4096 + QK-norm", "cache", 4, 4096, qk_norm=True,
              **_LLAMA),
    *_formats("fp8", "float8 e4m3", kv_cache_dtype="fp8"),
    FusedCase("decode-b64-page-table", "Llama-3-8B decode b64, paged bf16 by FlashInfer's page table", "cache", 64, 1,
              page_table=True, **_LLAMA),
    FusedCase("prefill-b4-s4096-page-table", "Llama-3-8B prefill b4 s4096, paged bf16 by FlashInfer's page table",
              "cache", 4, 4096, page_table=True, **_LLAMA),
    FusedCase("mla-decode-b64", "DeepSeek MLA decode b64 (128 heads, rope 64, latent 512)", "mla", 64, 1, 128, 1,
              64, latent=512),
    FusedCase("mla-prefill-b4-s4096", "DeepSeek MLA prefill b4 s4096 (128 heads, rope 64, latent 512)", "mla", 4,
              4096, 128, 1, 64, latent=512),
    FusedCase("qknorm-backward-b4-s4096", "Qwen3-8B QK-norm + RoPE backward b4 s4096", "backward", 4, 4096,
              qk_norm=True, **_LLAMA),
    # the QK-norm across all heads (OLMo-2's: one program holds a token's 32 heads)
    FusedCase("decode-b64-olmo2", "OLMo-2-7B decode b64 + QK-norm across all heads", "cache", 64, 1, **_OLMO2),
    FusedCase("prefill-b4-s4096-olmo2", "OLMo-2-7B prefill b4 s4096 + QK-norm across all heads", "cache", 4, 4096,
              **_OLMO2),
    FusedCase("olmo2-backward-b4-s4096", "OLMo-2-7B QK-norm across all heads + RoPE backward b4 s4096", "backward",
              4, 4096, **_OLMO2),
    # the quantise-on-write formats
    *_formats("e5m2", "float8 e5m2", kv_cache_dtype="fp8_e5m2"),
    *_formats("int8-token-head", "int8 per (token, head) (vLLM's int8_per_token_head)",
              kv_cache_dtype="int8_per_token_head"),
    *_formats("fp8-token-head", "float8 e4m3 per (token, head) (vLLM's fp8_per_token_head)",
              kv_cache_dtype="fp8_per_token_head"),
    *_formats("fp8-head", "float8 e4m3, static per-head scales", kv_cache_dtype="fp8", per_head_scales=True),
    *_formats("fp8-q", "float8 e4m3 + a float8 e4m3 q output (FlashInfer's rope_quantize_fp8)",
              kv_cache_dtype="fp8", q_dtype=FP8),
    *_formats("nvfp4", "NVFP4 (e2m1, e4m3 scales per 16 channels, a global scale)", kv_cache_dtype="nvfp4"),
    # DeepSeek's fp8_ds_mla entry (V3.2's sparse attention reads it)
    FusedCase("mla-decode-b64-ds-mla", "DeepSeek MLA decode b64, fp8_ds_mla cache (kv_c e4m3 per 128-channel tile)",
              "mla", 64, 1, 128, 1, 64, latent=512, kv_cache_dtype="fp8_ds_mla"),
    FusedCase("mla-prefill-b4-s4096-ds-mla", "DeepSeek MLA prefill b4 s4096, fp8_ds_mla cache", "mla", 4, 4096, 128,
              1, 64, latent=512, kv_cache_dtype="fp8_ds_mla"),
    # no table: MLA's angles from its inverse frequencies, and Llama 4's NoPE layer
    FusedCase("mla-decode-b64-no-table", "DeepSeek MLA decode b64, angles computed from inv_freq (no table)", "mla",
              64, 1, 128, 1, 64, latent=512, angles="inv_freq"),
    FusedCase("decode-b64-nope", "Llama-4-Scout NoPE layer decode b64, paged bf16", "cache", 64, 1, **_SCOUT_NOPE),
    FusedCase("prefill-b4-s4096-nope", "Llama-4-Scout NoPE layer prefill b4 s4096, paged bf16", "cache", 4, 4096,
              **_SCOUT_NOPE),
)


def tiny(case: FusedCase) -> FusedCase:
    """The same case at interpreter sizes (dry runs and tests): 2 sequences, 4/2 heads of 32 (MLA: 4 heads, latent
    32, or one 128-channel tile for fp8_ds_mla, rope 16), prefill 8 tokens."""
    mla = case.kind == "mla"
    return dataclasses.replace(case, title=case.title + " (tiny shapes)", batch=2, seqlen=1 if case.decode else 8,
                               heads_q=4, heads_kv=1 if mla else 2, head_dim=16 if mla else 32,
                               latent=(128 if case.ds_mla else 32) if mla else 0)


def floor_bytes(case: FusedCase) -> int:
    """Bytes the op must move: each activation/cache tensor read once and written once, the scales written."""
    act = case.dtype.itemsize
    cache = case.cache_dtype.itemsize
    t, d = case.tokens, case.head_dim
    q, kv = t * case.heads_q * d, t * case.heads_kv * d
    if case.kind == "cache":
        q_out = case.q_dtype.itemsize if case.q_dtype is not None else act
        cached = kv // 2 if case.nvfp4 else kv * cache  # NVFP4: two e2m1 values a byte
        return (q + 2 * kv) * act + q * q_out + 2 * cached + scale_bytes(case)
    if case.kind == "mla":  # read q_pe, k_pe, kv_c; write q_pe, k_pe (in place) and the cache entry
        return (2 * q + 2 * t * d + t * case.latent) * act + t * case.entry_bytes
    return 3 * (q + kv) * act  # backward: read q, k and the gradients of their outputs; write dq, dk


def scale_bytes(case: FusedCase) -> int:
    """The scales the floor counts, written for k and for v: per-(token, head) scales, one float32 a token and kv
    head; NVFP4's block scales, one e4m3 byte a 16 channels (none for static scales)."""
    if case.nvfp4:
        return 2 * case.tokens * case.heads_kv * (case.head_dim // reference.NVFP4_BLOCK)
    return 2 * case.tokens * case.heads_kv * 4 if case.token_head_scales else 0


def static_scale_bytes(case: FusedCase) -> int:
    """The static scales a call reads (one float32 a tensor or a kv head, for each cache and a float8 q; NVFP4's
    global scales), a few bytes the floor leaves out as it leaves out the metadata."""
    caches = 0 if not case.fp8 or case.token_head_scales or case.ds_mla else 1 if case.kind == "mla" else 2
    per_cache = case.heads_kv if case.per_head_scales else 1
    return 4 * (caches * per_cache + (case.q_dtype is not None))


def meta_bytes(case: FusedCase) -> int:
    """Per-token metadata the floor leaves out: positions and slots (int64), the cos/sin rows (float32; none
    without a table)."""
    table_rows = 2 * (case.head_dim // 2) * 4 if case.angles == "table" else 0
    per_token = 8 + (8 if case.kind != "backward" else 0) + table_rows
    return case.tokens * per_token


# --- inputs and the reference ------------------------------------------------------------------------------------

@dataclass
class Data:
    case: FusedCase
    qkv: torch.Tensor  # cache: (B, S, Hq + 2 Hkv, D); mla: q_pe (T, H, d); backward: q
    extra: Optional[torch.Tensor]  # mla: the latent projection (T, latent + d); backward: k
    grads: tuple  # backward: (dq_out, dk_out)
    offsets: torch.Tensor  # (B,) first position of each sequence
    slots: Optional[torch.Tensor]  # (T,) int64
    k_cache: Optional[torch.Tensor]
    v_cache: Optional[torch.Tensor]
    weights: tuple  # (q_weight, k_weight) or ()
    scales: tuple  # static (k_scale, v_scale): (1,) or (Hkv,) float32 (NVFP4: the global scales, (1,)); or ()
    cos: torch.Tensor
    sin: torch.Tensor
    page_table: Optional[dict] = None  # kv_indices, kv_indptr, batch_indices, cache_positions: the slots' rows
    # written scales (k_scale_cache, v_scale_cache): per (token, head) float32 (num_blocks, block_size, Hkv); NVFP4's
    # e4m3 block scales (num_blocks, block_size, Hkv, D / 16)
    scale_caches: tuple = ()
    q_scale: Optional[torch.Tensor] = None  # a float8 q output's scale, (1,) float32
    inv_freq: Optional[torch.Tensor] = None  # angles="inv_freq": float32 (head_dim / 2,), the table's frequencies

    @property
    def token_positions(self) -> torch.Tensor:
        return (self.offsets[:, None] + torch.arange(self.case.seqlen, device=self.offsets.device)).reshape(-1)

    def split(self):
        c = self.case
        return self.qkv.split([c.heads_q, c.heads_kv, c.heads_kv], dim=2)


@dataclass
class Stored:
    """A quantised output as its reader sees it: the stored values (float8 or int8) and the scales they are read
    back with (broadcast against them)."""

    values: torch.Tensor
    scale: torch.Tensor

    def read(self) -> torch.Tensor:
        """The attention's reader: the stored values times their scales, float64."""
        return reference.dequantise(self.values, self.scale)

    def step(self, truth: torch.Tensor) -> torch.Tensor:
        """The format's spacing at each float64 ``truth``, at its scale."""
        scale = self.scale.double().cpu()
        return scale * spacing(truth / scale, self.values.dtype)


@dataclass
class StoredNvfp4:
    """An NVFP4 cache's head vectors as its reader sees them: the e2m1 bytes ``(..., D / 2)``, the e4m3 block scales
    ``(..., D / 16)``, the global scale (one element)."""

    values: torch.Tensor
    block_scales: torch.Tensor
    global_scale: torch.Tensor

    def read(self) -> torch.Tensor:
        """The attention's reader: ``e2m1 x block scale x global scale``, float64 ``(..., D)``."""
        return reference.nvfp4_dequantise(self.values, self.block_scales, self.global_scale.cpu())

    def step(self, truth: torch.Tensor) -> torch.Tensor:
        """The e2m1 spacing at each float64 ``truth``, at its block's scale (block scale x global scale)."""
        scale = (self.block_scales.cpu().view(FP8).double() * float(self.global_scale)).repeat_interleave(
            reference.NVFP4_BLOCK, -1)
        return scale * reference.e2m1_spacing(truth / scale)


@dataclass
class StoredDsMla:
    """fp8_ds_mla entries (uint8 ``(tokens, entry)``) as their reader sees them: kv_c's e4m3 values times their
    tile's float32 scale, then k_pe in the model's dtype."""

    entries: torch.Tensor
    latent: int
    dtype: torch.dtype

    def read(self) -> torch.Tensor:
        """The attention's reader: ``[kv_c | k_pe]``, float64."""
        return torch.cat(reference.ds_mla_read(self.entries, self.latent, self.dtype), -1)

    def step(self, truth: torch.Tensor) -> torch.Tensor:
        """Each value's spacing at its float64 ``truth``: e4m3's at the tile's scale, the model dtype's for k_pe."""
        tiles = self.latent // reference.DS_MLA_TILE
        entries = self.entries.cpu().contiguous()
        scale = entries[:, self.latent:self.latent + 4 * tiles].view(torch.float32).double()
        scale = scale.repeat_interleave(reference.DS_MLA_TILE, -1)
        latent, k_pe = truth[:, :self.latent], truth[:, self.latent:]
        return torch.cat((scale * spacing(latent / scale, FP8), spacing(k_pe, self.dtype)), -1)


def make_data(case: FusedCase, device, seed: int) -> Data:
    """Fresh random inputs: positions spread over the table (decode) or from 0 (prefill), a shuffled block table,
    the format's scales (static ones, or zeroed scale caches the call fills; NVFP4: both, the global scales and
    the block-scale caches)."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=case.dtype)

    t, d = case.tokens, case.head_dim
    offsets = (torch.randint(0, TABLE_POSITIONS - case.seqlen, (case.batch,), generator=g) if case.decode
               else torch.zeros(case.batch, dtype=torch.int64)).to(device)
    cos, sin = cos_sin_table(TABLE_POSITIONS, d, device=device)
    grads, slots, k_cache, v_cache, extra, page_table = (), None, None, None, None, None
    scales, scale_caches = (), ()
    if case.kind == "backward":
        qkv, extra = randn(case.batch, case.seqlen, case.heads_q, d), randn(case.batch, case.seqlen, case.heads_kv, d)
        grads = (torch.randn_like(qkv), torch.randn_like(extra))
    else:
        per_seq = -(-TABLE_POSITIONS // BLOCK_SIZE)
        table = torch.randperm(case.batch * per_seq, generator=g).view(case.batch, per_seq).to(device)
        pos = (offsets[:, None] + torch.arange(case.seqlen, device=device)).reshape(-1)
        seq = torch.arange(case.batch, device=device).repeat_interleave(case.seqlen)
        slots = table[seq, pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
        if case.page_table:  # request b's pages are table[b]: the same rows as the slots
            page_table = {name: t.to(torch.int32) for name, t in (
                ("kv_indices", table.reshape(-1)), ("kv_indptr", torch.arange(case.batch + 1, device=device) * per_seq),
                ("batch_indices", seq), ("cache_positions", pos))}
        if case.kind == "mla":
            qkv, extra = randn(t, case.heads_q, d), randn(t, case.latent + d)
            k_cache = torch.zeros(table.numel(), BLOCK_SIZE, case.entry_bytes // case.cache_dtype.itemsize,
                                  dtype=case.cache_dtype, device=device)
        else:
            qkv = randn(case.batch, case.seqlen, case.heads_q + 2 * case.heads_kv, d)
            shape = (table.numel(), BLOCK_SIZE, case.heads_kv, d // 2 if case.nvfp4 else d)
            k_cache = torch.zeros(shape, dtype=case.cache_dtype, device=device)
            v_cache = torch.zeros_like(k_cache)
            if case.token_head_scales:
                scale_caches = tuple(torch.zeros(shape[:3], device=device) for _ in range(2))
            if case.nvfp4:
                scale_caches = tuple(torch.zeros(*shape[:3], d // reference.NVFP4_BLOCK, dtype=FP8, device=device)
                                     for _ in range(2))
    widths = (case.heads_q * d, case.heads_kv * d) if case.norm_over == "heads" else (d, d)
    weights = tuple(1 + 0.2 * randn(width) for width in widths) if case.qk_norm else ()
    if case.nvfp4:
        scales = tuple(torch.tensor([NVFP4_GLOBAL_SCALE], device=device) for _ in range(2))
    elif case.fp8 and not case.token_head_scales and not case.ds_mla:
        # per kv head: scales from half to one and a half times the tensor's, so that each head reads its own
        spread = (0.5 + torch.arange(case.heads_kv) / case.heads_kv) if case.per_head_scales else torch.ones(1)
        scales = tuple((s * spread).to(device=device, dtype=torch.float32) for s in (K_SCALE, V_SCALE))
    q_scale = torch.tensor([Q_SCALE], device=device) if case.q_dtype is not None else None
    inv_freq = None
    if case.angles != "table":  # the cache's rows as above; the positions far out, where no table reaches
        offsets = offsets + torch.randint(0, FAR_POSITIONS - TABLE_POSITIONS, (case.batch,), generator=g).to(device)
        inv_freq = inverse_frequencies(d).to(device) if case.angles == "inv_freq" else None
    return Data(case, qkv, extra, grads, offsets, slots, k_cache, v_cache, weights, scales, cos, sin, page_table,
                scale_caches, q_scale, inv_freq)


def _sample(case: FusedCase) -> torch.Tensor:
    """The tokens the check compares (every token of a small case, 64 spread over a large one)."""
    return torch.linspace(0, case.tokens - 1, min(case.tokens, 64)).round().long().unique()


def expected(data: Data) -> dict:
    """float64 references on the sampled tokens, computed from the inputs before any call (with per-(token, head)
    scales, the scales too: max|x| over the format's largest value; NVFP4's block scales: e4m3 of amax over the 16
    channels / (6 x global scale))."""
    c, rows = data.case, _sample(data.case)
    pos = data.token_positions.cpu()[rows]

    def rope(x, w=None, interleaved=False):
        x = x.reshape(c.tokens, -1, x.shape[-1])[rows.to(x.device)]
        x = reference.rms_norm(x, w, eps=EPS, over_heads=over_heads) if w is not None else x.double().cpu()
        if c.angles == "nope":
            return x
        if c.angles == "inv_freq":  # the float64 angles at the sampled tokens' own positions
            theta = pos.double()[:, None] * data.inv_freq.double().cpu()
            return reference.rope_table(x, torch.cos(theta), torch.sin(theta), torch.arange(len(pos)),
                                        interleaved=interleaved)
        return reference.rope_table(x, data.cos, data.sin, pos, interleaved=interleaved)

    w_q, w_k = data.weights or (None, None)
    over_heads = c.norm_over == "heads"
    if c.kind == "backward":
        # the leaves are float64 copies on the CPU (rows and positions are CPU tensors): autograd never mixes the
        # inputs' device with the reference's
        q, k = (x.detach().reshape(c.tokens, -1, c.head_dim)[rows.to(x.device)].cpu().double().requires_grad_(True)
                for x in (data.qkv, data.extra))
        out = [reference.rope_table(reference.rms_norm(x, w, eps=EPS, over_heads=over_heads), data.cos, data.sin,
                                    pos) for x, w in ((q, w_q), (k, w_k))]
        gq, gk = (g.reshape(c.tokens, -1, c.head_dim)[rows.to(g.device)].double().cpu() for g in data.grads)
        return dict(zip(("dq", "dk"), torch.autograd.grad(out, (q, k), (gq, gk))))
    if c.kind == "mla":
        latent = data.extra[:, :c.latent].reshape(c.tokens, 1, -1)[rows.to(data.extra.device)].double().cpu()
        k_pe = rope(data.extra[:, None, c.latent:], interleaved=True)
        return dict(q=rope(data.qkv, interleaved=True), cache=torch.cat([latent, k_pe], -1)[:, 0])
    q, k, v = data.split()
    want_q = rope(q, w_q)
    if c.angles == "nope":
        want_q = reference.nope_temperature(want_q, pos, *NOPE_TEMPERATURE)
    want = dict(q=want_q, k_cache=rope(k, w_k),
                v_cache=v.reshape(c.tokens, c.heads_kv, -1)[rows.to(v.device)].double().cpu())
    if c.token_head_scales:
        for name in ("k", "v"):
            want[f"{name}_scales"] = reference.token_head_scale(want[f"{name}_cache"], c.cache_dtype)[..., 0]
    if c.nvfp4:
        for name, global_scale in zip(("k", "v"), data.scales):
            want[f"{name}_block_scales"] = reference.nvfp4_quantise(want[f"{name}_cache"], global_scale.cpu())[1]
    return want


def actual(data: Data, result) -> dict:
    """An implementation's outputs on the sampled tokens: ``result`` is what it returned (the rotated q, or the
    input gradients), the caches are read back at the tokens' slots; a quantised output as :class:`Stored` (with
    per-(token, head) scales, the scale caches' entries at those slots as well) or :class:`StoredNvfp4` (its block
    scales, e4m3, as well)."""
    c, rows = data.case, _sample(data.case).to(data.qkv.device)
    if c.kind == "backward":
        return {name: g.reshape(c.tokens, -1, c.head_dim)[rows] for name, g in zip(("dq", "dk"), result)}
    slots = data.slots[rows]
    q = _take(result.reshape(c.tokens, -1, c.head_dim), rows)
    out = {"q": Stored(q, data.q_scale) if c.q_dtype is not None else q}
    if c.kind == "mla":
        entries = _take(data.k_cache.reshape(-1, data.k_cache.shape[-1]), slots)
        if c.ds_mla:
            return {**out, "cache": StoredDsMla(entries, c.latent, c.dtype)}
        caches = {"cache": (entries, 0)}
    else:
        caches = {name: (_take(getattr(data, name).flatten(0, 1), slots), i)
                  for i, name in enumerate(("k_cache", "v_cache"))}
    for name, (stored, i) in caches.items():
        if not c.fp8:
            out[name] = stored
        elif c.nvfp4:  # the reader's block scales: the block-scale cache at the token's slot
            out[f"{name[0]}_block_scales"] = _take(data.scale_caches[i].flatten(0, 1), slots)
            out[name] = StoredNvfp4(stored, out[f"{name[0]}_block_scales"], data.scales[i])
        elif c.token_head_scales:  # the reader's scale: the scale cache at the token's slot, for each head
            out[f"{name[0]}_scales"] = data.scale_caches[i].reshape(-1, c.heads_kv)[slots]
            out[name] = Stored(stored, out[f"{name[0]}_scales"][..., None])
        else:  # a static scale: one a tensor, or one a kv head (broadcast over the channels)
            out[name] = Stored(stored, data.scales[i].view(-1, 1) if c.kind == "cache" else data.scales[i])
    return out


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]`` (a one-byte tensor gathered as its bits: indexing has no float8 kernel everywhere)."""
    if x.element_size() == 1 and x.dtype != torch.uint8:
        return x.view(torch.uint8)[index].view(x.dtype)
    return x[index]


def spacing(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The distance between neighbouring values of the quantised format ``dtype`` at ``x`` (float64): for float8
    the spacing of x's binade (the subnormals' below the smallest normal), for int8 one."""
    if dtype == torch.int8:
        return torch.ones_like(x)
    finfo = torch.finfo(dtype)
    binade = torch.floor(torch.log2(x.abs().clamp(min=finfo.smallest_normal)))
    return torch.exp2(binade) * finfo.eps


def check(data: Data, want: dict, got: dict) -> dict:
    """Largest error as a multiple of the allowance: the dtype's tolerance (bf16: rtol = atol = 1.6e-2 on these
    unit-scale values; float32 1e-5; the per-(token, head) scales too; an e4m3 scale, NVFP4's block scales, one e4m3
    spacing of the reference's: the amax of float32 or bf16 values may round it the other way), and for a quantised
    output (a :class:`Stored` or :class:`StoredNvfp4`) the reader's round trip, what it reads against the float64
    value, in units of the format's spacing at the value at its scale (``quant_ulps``: 0.5 is exact rounding of the
    float64 value)."""
    tol = 1.6e-2 if data.case.dtype in (torch.bfloat16, torch.float16) else 1e-5
    worst, ulps, quantised = 0.0, 0.0, False
    for name, ref in want.items():
        out = got[name]
        if isinstance(out, (Stored, StoredNvfp4, StoredDsMla)):
            quantised = True
            read = out.read()  # the attention's reader
            ulps = max(ulps, _largest(torch.where(read == ref, 0.0, (read - ref).abs() / out.step(ref))))
        elif out.dtype == FP8:
            worst = max(worst, _largest((out.double().cpu() - ref).abs() / spacing(ref, FP8)))
        else:
            out = out.double().cpu()
            worst = max(worst, _largest((out - ref).abs() / (tol + tol * ref.abs())))
    return {"error_ratio": worst, "quant_ulps": ulps if quantised else None, "ok": worst <= 1.0 and ulps <= 1.0}


def _largest(ratios: torch.Tensor) -> float:
    """The largest error ratio, infinite where one is NaN (a NaN output, or a zero scale, is wrong, and Python's
    ``max`` would pass over it)."""
    return float(torch.nan_to_num(ratios, nan=float("inf")).max()) if ratios.numel() else 0.0
