"""The fused benchmark's cases: shapes, byte floors, fresh random inputs with a shuffled paged cache, and the check
of an implementation's outputs against the float64 reference (:mod:`ropekit.reference`) on a sample of tokens.

Bytes: the floor counts each activation and cache tensor read once and written once (q, k, v read; q written in
place, k and v written to the cache, one byte per element for a float8 cache; the backward reads q, k and both output
gradients and writes both input gradients). The per-token metadata (positions, slots, cos/sin rows) is reported by
:func:`meta_bytes` and not counted, as in the published targets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from .. import reference
from ..frequencies import cos_sin_table

__all__ = ["FusedCase", "CASES", "tiny", "floor_bytes", "meta_bytes", "Data", "make_data", "expected", "actual",
           "check", "TABLE_POSITIONS", "BLOCK_SIZE", "EPS", "FP8"]

TABLE_POSITIONS, BLOCK_SIZE, EPS = 8192, 16, 1e-6
K_SCALE, V_SCALE = 0.05, 0.02  # float8 scales: the normalised, rotated keys and unit-variance values use e4m3's range
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class FusedCase:
    """One shape. ``kind``: "cache" (rope [+ QK-norm] + paged cache write), "mla" (q_pe/k_pe rope + latent cache
    write) or "backward" (QK-norm + RoPE backward). Tokens: ``batch`` sequences of ``seqlen`` (decode: 1).
    ``page_table``: the fused call addresses the cache through FlashInfer's page table (int32 ``kv_indices``,
    ``kv_indptr``, a request and a position per token) instead of a slot mapping; the same rows either way."""

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
    fp8: bool = False
    latent: int = 0  # MLA: kv_lora_rank
    page_table: bool = False

    @property
    def tokens(self) -> int:
        return self.batch * self.seqlen

    @property
    def decode(self) -> bool:
        return self.seqlen == 1


_LLAMA = dict(heads_q=32, heads_kv=8, head_dim=128)
CASES = (
    FusedCase("decode-b64", "Llama-3-8B decode b64, paged bf16", "cache", 64, 1, **_LLAMA),
    FusedCase("prefill-b4-s4096", "Llama-3-8B prefill b4 s4096, paged bf16", "cache", 4, 4096, **_LLAMA),
    FusedCase("decode-b64-qknorm", "Qwen3-8B decode b64 + QK-norm", "cache", 64, 1, qk_norm=True, **_LLAMA),
    FusedCase("prefill-b4-s4096-qknorm", "Qwen3-8B prefill b4 s4096 + QK-norm", "cache", 4, 4096, qk_norm=True,
              **_LLAMA),
    FusedCase("decode-b64-fp8", "Llama-3-8B decode b64, paged float8 e4m3", "cache", 64, 1, fp8=True, **_LLAMA),
    FusedCase("prefill-b4-s4096-fp8", "Llama-3-8B prefill b4 s4096, paged float8 e4m3", "cache", 4, 4096, fp8=True,
              **_LLAMA),
    FusedCase("decode-b64-page-table", "Llama-3-8B decode b64, paged bf16 by FlashInfer's page table", "cache", 64, 1,
              page_table=True, **_LLAMA),
    FusedCase("prefill-b4-s4096-page-table", "Llama-3-8B prefill b4 s4096, paged bf16 by FlashInfer's page table",
              "cache", 4, 4096, page_table=True, **_LLAMA),
    FusedCase("mla-decode-b64", "DeepSeek MLA decode b64 (128 heads, rope 64, latent 512)", "mla", 64, 1, 128, 1,
              64, latent=512),
    FusedCase("qknorm-backward-b4-s4096", "Qwen3-8B QK-norm + RoPE backward b4 s4096", "backward", 4, 4096,
              qk_norm=True, **_LLAMA),
)


def tiny(case: FusedCase) -> FusedCase:
    """The same case at interpreter sizes (dry runs and tests): 2 sequences, 4/2 heads of 32 (MLA: 4 heads, latent
    32, rope 16), prefill 8 tokens."""
    mla = case.kind == "mla"
    return dataclasses.replace(case, title=case.title + " (tiny shapes)", batch=2, seqlen=1 if case.decode else 8,
                               heads_q=4, heads_kv=1 if mla else 2, head_dim=16 if mla else 32,
                               latent=32 if mla else 0)


def floor_bytes(case: FusedCase) -> int:
    """Bytes the op must move: each activation/cache tensor read once and written once."""
    act = case.dtype.itemsize
    cache = 1 if case.fp8 else act
    t, d = case.tokens, case.head_dim
    q, kv = t * case.heads_q * d, t * case.heads_kv * d
    if case.kind == "cache":
        return (q + 2 * kv) * act + q * act + 2 * kv * cache
    if case.kind == "mla":  # read q_pe, k_pe, kv_c; write q_pe, k_pe (in place) and the cache row [kv_c | k_pe]
        return (2 * q + 2 * t * d + t * case.latent) * act + t * (case.latent + d) * cache
    return 3 * (q + kv) * act  # backward: read q, k and the gradients of their outputs; write dq, dk


def meta_bytes(case: FusedCase) -> int:
    """Per-token metadata the floor leaves out: positions and slots (int64), the cos/sin rows (float32)."""
    per_token = 8 + (8 if case.kind != "backward" else 0) + 2 * (case.head_dim // 2) * 4
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
    scales: tuple  # (k_scale, v_scale) or ()
    cos: torch.Tensor
    sin: torch.Tensor
    page_table: Optional[dict] = None  # kv_indices, kv_indptr, batch_indices, cache_positions: the slots' rows

    @property
    def token_positions(self) -> torch.Tensor:
        return (self.offsets[:, None] + torch.arange(self.case.seqlen, device=self.offsets.device)).reshape(-1)

    def split(self):
        c = self.case
        return self.qkv.split([c.heads_q, c.heads_kv, c.heads_kv], dim=2)


def make_data(case: FusedCase, device, seed: int) -> Data:
    """Fresh random inputs: positions spread over the table (decode) or from 0 (prefill), a shuffled block table."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=case.dtype)

    t, d = case.tokens, case.head_dim
    offsets = (torch.randint(0, TABLE_POSITIONS - case.seqlen, (case.batch,), generator=g) if case.decode
               else torch.zeros(case.batch, dtype=torch.int64)).to(device)
    cos, sin = cos_sin_table(TABLE_POSITIONS, d, device=device)
    grads, slots, k_cache, v_cache, extra, page_table = (), None, None, None, None, None
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
        cache_dtype = FP8 if case.fp8 else case.dtype
        if case.kind == "mla":
            qkv, extra = randn(t, case.heads_q, d), randn(t, case.latent + d)
            k_cache = torch.zeros(table.numel(), BLOCK_SIZE, case.latent + d, dtype=cache_dtype, device=device)
        else:
            qkv = randn(case.batch, case.seqlen, case.heads_q + 2 * case.heads_kv, d)
            shape = (table.numel(), BLOCK_SIZE, case.heads_kv, d)
            k_cache = torch.zeros(shape, dtype=cache_dtype, device=device)
            v_cache = torch.zeros_like(k_cache)
    weights = ((1 + 0.2 * randn(d), 1 + 0.2 * randn(d)) if case.qk_norm else ())
    scales = (torch.tensor([K_SCALE], device=device), torch.tensor([V_SCALE], device=device)) if case.fp8 else ()
    return Data(case, qkv, extra, grads, offsets, slots, k_cache, v_cache, weights, scales, cos, sin, page_table)


def _sample(case: FusedCase) -> torch.Tensor:
    """The tokens the check compares (every token of a small case, 64 spread over a large one)."""
    return torch.linspace(0, case.tokens - 1, min(case.tokens, 64)).round().long().unique()


def expected(data: Data) -> dict:
    """float64 references on the sampled tokens, computed from the inputs before any call."""
    c, rows = data.case, _sample(data.case)
    pos = data.token_positions.cpu()[rows]

    def rope(x, w=None, interleaved=False):
        x = x.reshape(c.tokens, -1, x.shape[-1])[rows.to(x.device)]
        x = reference.rms_norm(x, w, eps=EPS) if w is not None else x.double().cpu()
        return reference.rope_table(x, data.cos, data.sin, pos, interleaved=interleaved)

    w_q, w_k = data.weights or (None, None)
    if c.kind == "backward":
        # the leaves are float64 copies on the CPU (rows and positions are CPU tensors): autograd never mixes the
        # inputs' device with the reference's
        q, k = (x.detach().reshape(c.tokens, -1, c.head_dim)[rows.to(x.device)].cpu().double().requires_grad_(True)
                for x in (data.qkv, data.extra))
        out = [reference.rope_table(reference.rms_norm(x, w, eps=EPS), data.cos, data.sin, pos) for x, w in
               ((q, w_q), (k, w_k))]
        gq, gk = (g.reshape(c.tokens, -1, c.head_dim)[rows.to(g.device)].double().cpu() for g in data.grads)
        return dict(zip(("dq", "dk"), torch.autograd.grad(out, (q, k), (gq, gk))))
    if c.kind == "mla":
        latent = data.extra[:, :c.latent].reshape(c.tokens, 1, -1)[rows.to(data.extra.device)].double().cpu()
        k_pe = rope(data.extra[:, None, c.latent:], interleaved=True)
        return dict(q=rope(data.qkv, interleaved=True), cache=torch.cat([latent, k_pe], -1)[:, 0])
    q, k, v = data.split()
    return dict(q=rope(q, w_q), k_cache=rope(k, w_k),
                v_cache=v.reshape(c.tokens, c.heads_kv, -1)[rows.to(v.device)].double().cpu())


def actual(data: Data, result) -> dict:
    """An implementation's outputs on the sampled tokens: ``result`` is what it returned (the rotated q, or the
    input gradients), the caches are read back at the tokens' slots (dequantised)."""
    c, rows = data.case, _sample(data.case).to(data.qkv.device)
    if c.kind == "backward":
        return {name: g.reshape(c.tokens, -1, c.head_dim)[rows] for name, g in zip(("dq", "dk"), result)}
    slots = data.slots[rows]
    out = {"q": result.reshape(c.tokens, -1, c.head_dim)[rows]}
    if c.kind == "mla":
        out["cache"] = _rows(data.k_cache, (c.latent + c.head_dim,), slots)
    else:
        for name in ("k_cache", "v_cache"):
            out[name] = _rows(getattr(data, name), (c.heads_kv, c.head_dim), slots)
    for name, scale in zip(("k_cache", "v_cache") if c.kind == "cache" else ("cache",), data.scales):
        out[name] = (out[name].float() * scale).to(torch.float64)
    return out


def _rows(cache: torch.Tensor, row_shape, slots: torch.Tensor) -> torch.Tensor:
    """The cache rows at ``slots`` (a float8 cache gathered as its bits: indexing has no float8 kernel everywhere)."""
    if cache.dtype == FP8:
        return cache.view(torch.uint8).reshape(-1, *row_shape)[slots].view(FP8)
    return cache.reshape(-1, *row_shape)[slots]


def check(data: Data, want: dict, got: dict) -> dict:
    """Largest error as a multiple of the allowance: the dtype's tolerance (bf16: rtol = atol = 1.6e-2 on these
    unit-scale values; float32 1e-5), and for a float8 cache the e4m3 spacing at the value (``e4m3_ulps``: 0.5 is
    exact rounding of the float64 value)."""
    tol = 1.6e-2 if data.case.dtype in (torch.bfloat16, torch.float16) else 1e-5
    worst, ulps = 0.0, 0.0
    for name, ref in want.items():
        out = got[name].double().cpu()
        fp8 = data.case.fp8 and "cache" in name
        if fp8:
            scale = float(data.scales[0 if name in ("k_cache", "cache") else 1])
            x = (ref / scale).abs().clamp(min=2.0 ** -6)
            spacing = torch.exp2(torch.floor(torch.log2(x)) - 3)
            ulps = max(ulps, float(((out - ref).abs() / scale / spacing).max()))
        else:
            worst = max(worst, float(((out - ref).abs() / (tol + tol * ref.abs())).max()))
    return {"error_ratio": worst, "e4m3_ulps": ulps if data.case.fp8 else None,
            "ok": worst <= 1.0 and (not data.case.fp8 or ulps <= 1.0)}
