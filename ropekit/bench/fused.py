"""The fused pre-processing benchmark: RoPE (+ QK-norm) + paged KV-cache write (bf16, or quantised on write: float8
e4m3 or e5m2, int8; static scales a tensor or a kv head, or scales computed per (token, head); NVFP4; a float8 q
output), DeepSeek MLA's decoupled RoPE + latent-cache write, and the QK-norm + RoPE backward, against the pipelines a
user builds without the fused op.

    python -m ropekit.bench.fused --out DIR            # on a GPU: JSON + markdown + PNG (a few minutes)
    python -m ropekit.bench.fused --out DIR --dry-run  # anywhere: tiny shapes, every implementation checked, no clock

Implementations per case: ``ropekit-fused`` (one launch of :mod:`ropekit.fused`); the unfused pipelines from the
single-op pieces (``F.rms_norm`` + :func:`ropekit.apply_rope` in place + torch's quantise: the per-(token, head)
``amax`` and scale, the division, the clamp and the cast; for NVFP4 the ``amax`` per 16 channels, the e4m3 block
scale, the e2m1 rounding and the packing of two nibbles a byte, in float32 torch ops, + the cache (and scale-cache)
write with ``index_copy_`` or ``index_put_``); ``torch.compile`` of the whole chain written in PyTorch. FlashInfer
is not measured: its wheel alone (62 MB) exceeds what can be carried to the GPU machine with the tree, and that
machine has no network.

How it measures (the conventions of :mod:`ropekit.bench.timing`): every implementation gets fresh random inputs,
is checked against the float64 reference (:mod:`ropekit.reference`) on a sample of tokens before it is timed, and is
captured in a CUDA graph; the graphs of one case are replayed in interleaved rounds and the median per call is
reported. The copy ceiling is measured in the same run. The byte floor counts each activation and cache tensor once
read and once written (q, k, v read; q written in place or as float8, k and v written to the cache in its format,
the per-(token, head) scales or NVFP4's block scales written; the backward reads q, k and both output gradients
and writes both input gradients); the per-token metadata (positions, slots, cos/sin rows) is reported beside it
and not counted, as in the published targets. A decode call is bound by a chain of dependent steps more than by its
bytes: the decode cases also time the launch-chain floor (:mod:`ropekit.bench.floor`) in the same rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..api import apply_rope
from ..reference import DS_MLA_TILE, E2M1_VALUES, NVFP4_BLOCK
from ..fused import mla_rope_and_cache, qk_norm_rope, rope_and_cache
from . import floor
from .fused_cases import (BLOCK_SIZE, CASES, EPS, FORMAT_MAX, FP8, NOPE_TEMPERATURE, Data, FusedCase, actual, check,
                          expected, floor_bytes, make_data, meta_bytes, scale_bytes, static_scale_bytes, tiny)

__all__ = ["CASES", "IMPL_NAMES", "COPY_REFERENCE", "LAUNCH_FLOOR", "LAUNCH_FLOOR_DEPENDENT", "impls", "checked_call",
           "stream_for", "run_case", "copy_of_floor", "torch_nvfp4", "torch_ds_mla", "run", "cli_parser", "main"]


# --- the implementations: each builds, from one case's data, a call that returns the rotated q (or the gradients) ---

def _fused(data: Data) -> Callable:
    c, cos, sin = data.case, data.cos, data.sin
    if c.kind == "backward":
        return _autograd(lambda q, k, w_q, w_k: qk_norm_rope(q, k, cos, sin, w_q, w_k, eps=EPS,
                                                             norm_over=c.norm_over), data)
    if c.kind == "mla":
        latent, positions = data.extra, data.token_positions
        scale = data.scales[0] if data.scales else None
        # k_pe and kv_c split from the projection once, as q, k and v below: the model splits it, whatever RoPE does
        k_pe, kv_c = latent[:, c.latent:], latent[:, :c.latent]
        # (each form its own call, the common one as an engine writes it: the eager benchmark times these calls)
        if c.angles == "inv_freq":
            return lambda: mla_rope_and_cache(data.qkv, k_pe, kv_c, data.k_cache, data.slots, positions,
                                              inv_freq=data.inv_freq, interleaved=True, inplace=True,
                                              kv_cache_scale=scale)[0]
        if c.ds_mla:
            return lambda: mla_rope_and_cache(data.qkv, k_pe, kv_c, data.k_cache, data.slots, positions, cos, sin,
                                              interleaved=True, inplace=True, kv_cache_dtype="fp8_ds_mla")[0]
        return lambda: mla_rope_and_cache(data.qkv, k_pe, kv_c, data.k_cache, data.slots, positions, cos, sin,
                                          interleaved=True, inplace=True, kv_cache_scale=scale)[0]
    q, k, v = data.split()
    # a float8 q output is a new tensor: q is rotated in place otherwise
    kwargs = dict(k_cache=data.k_cache, v_cache=data.v_cache, positions=data.offsets, inplace=c.q_dtype is None,
                  kv_cache_dtype=c.kv_cache_dtype, **(data.page_table or dict(slot_mapping=data.slots)))
    if data.weights:
        kwargs.update(q_weight=data.weights[0], k_weight=data.weights[1], eps=EPS, norm_over=c.norm_over)
    if data.scales:
        kwargs.update(k_scale=data.scales[0], v_scale=data.scales[1])
    if data.scale_caches:
        kwargs.update(k_scale_cache=data.scale_caches[0], v_scale_cache=data.scale_caches[1])
    if c.q_dtype is not None:
        kwargs.update(q_dtype=c.q_dtype, q_scale=data.q_scale)
    kwargs.update(_angles(data))
    return lambda: rope_and_cache(q, k, v, **kwargs)[0]


def _angles(data: Data) -> dict:
    """The case's angle arguments, as ropekit's calls take them: the table's rows, the inverse frequencies, or the
    NoPE layer's temperature."""
    if data.case.angles == "nope":
        return dict(nope_temperature=NOPE_TEMPERATURE)
    if data.case.angles == "inv_freq":
        return dict(inv_freq=data.inv_freq)
    return dict(cos=data.cos, sin=data.sin)


def _autograd(forward: Callable, data: Data) -> Callable:
    """``torch.autograd.grad`` through a forward recorded once (retain_graph: each call replays the backward)."""
    leaves = [t.detach().requires_grad_(True) for t in (data.qkv, data.extra, *data.weights)]
    with torch.enable_grad():
        outs = forward(*leaves)
    return lambda: torch.autograd.grad(outs, leaves[:2], data.grads, retain_graph=True)


class NotApplicable(Exception):
    """An implementation that has nothing to measure in a case (a row marked "skipped")."""


def _quantised(x: torch.Tensor, scale: Optional[torch.Tensor], fmt: torch.dtype) -> torch.Tensor:
    """torch's quantise: x itself with no scale, else ``x / scale`` in format ``fmt`` (float8: saturated at its
    largest value, then cast, which rounds to nearest even; int8: rounded to nearest even, then saturated)."""
    if scale is None:
        return x
    y = x.float() / scale
    if fmt == torch.int8:
        y = y.round().clamp(-128.0, 127.0)
    else:
        y = y.clamp(-FORMAT_MAX[fmt], FORMAT_MAX[fmt])
    return y.to(fmt)


def _rows(x: torch.Tensor, scale: Optional[torch.Tensor], fmt: torch.dtype) -> torch.Tensor:
    """Cache rows as :func:`_flat` holds them: quantised ones as their bytes."""
    x = _quantised(x, scale, fmt)
    return x.view(torch.uint8) if x.element_size() == 1 else x


def _token_head_scale(x: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """torch's per-(token, head) scale of head vectors ``x`` ``(..., D)``: ``max|x| / format max``, floored at the
    smallest normal float32; ``(..., 1)`` float32."""
    amax = x.float().abs().amax(-1, keepdim=True)
    return (amax / FORMAT_MAX[fmt]).clamp_min(torch.finfo(torch.float32).tiny)


# e2m1's magnitudes by code (reference.E2M1_VALUES): a magnitude's code is how many of the midpoints between
# neighbouring magnitudes lie below it, a tie going to the even code (in values 0.25 -> 0, 0.75 -> 1, ..., 5 -> 4):
# the tie between codes i and i + 1 rounds up where i is odd; (midpoint, whether a tie rounds up)
_E2M1_MIDPOINTS = tuple(((low + high) / 2, i % 2 == 1)
                        for i, (low, high) in enumerate(zip(E2M1_VALUES, E2M1_VALUES[1:])))
E2M1_MAX = E2M1_VALUES[-1]  # a block's amax lands on e2m1's largest magnitude


def torch_nvfp4(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's NVFP4 quantiser, in float32: head vectors ``x`` ``(..., D)`` at a one-element global scale -> (the
    e2m1 bytes ``(..., D / 2)``, channel 2i in the low nibble; the e4m3 block-scale bytes ``(..., D / 16)``). Each 16
    channels get the block scale ``e4m3(amax / (6 * global))`` and each value the e2m1 code of ``x / (block *
    global)`` (a block scale of zero: zeros of the values' signs)."""
    blocks = x.float().unflatten(-1, (-1, NVFP4_BLOCK))
    g = global_scale.reshape(())
    block_scale = (blocks.abs().amax(-1, keepdim=True) / (E2M1_MAX * g)).clamp(max=FORMAT_MAX[FP8]).to(FP8)
    dequant = block_scale.float() * g
    magnitude = torch.where(dequant > 0, blocks.abs() / dequant, 0.0)  # a zero block scale: zeros
    code = sum(((magnitude >= t) if up else (magnitude > t)).to(torch.uint8) for t, up in _E2M1_MIDPOINTS)
    nibble = (code | (blocks.signbit().to(torch.uint8) << 3)).flatten(-2)
    return nibble[..., 0::2] | (nibble[..., 1::2] << 4), block_scale[..., 0].view(torch.uint8)


def torch_ds_mla(rows: torch.Tensor, latent: int) -> torch.Tensor:
    """torch's fp8_ds_mla writer: projection rows ``(tokens, latent + rope_dim)`` ``[kv_c | rotated k_pe]`` in the
    model's dtype -> the entries' bytes ``(tokens, latent + 4 * tiles + rope_dim * itemsize)``: each 128-channel tile
    of kv_c at the scale ``max|x| / 448`` (floored at the smallest normal float32) in e4m3, the tiles' float32
    scales, k_pe's bytes."""
    tiles = rows[:, :latent].unflatten(-1, (-1, DS_MLA_TILE))
    scale = _token_head_scale(tiles, FP8)  # (a tile for the head vector)
    values = _rows(tiles, scale, FP8).flatten(-2)
    return torch.cat((values, scale[..., 0].contiguous().view(torch.uint8),
                      rows[:, latent:].contiguous().view(torch.uint8)), -1)


def _cache_rows(rows: torch.Tensor, scale: Optional[torch.Tensor], c: FusedCase):
    """torch's quantise of cache rows ``(tokens, ..., D)`` in the model's dtype for case ``c``'s cache: (the rows as
    the flat cache holds them, the scale cache's rows or None). ``scale``: the static scale (NVFP4: the global one),
    or None."""
    if c.nvfp4:
        return torch_nvfp4(rows, scale)
    if c.ds_mla:
        return torch_ds_mla(rows, c.latent), None
    fmt = c.cache_dtype
    if c.token_head_scales:
        computed = _token_head_scale(rows, fmt)
        return _rows(rows, computed, fmt), computed[..., 0]
    return _rows(rows, scale, fmt), None


def _flat(cache: torch.Tensor) -> torch.Tensor:
    """The cache (or scale cache) as one row per slot (a one-byte cache as its uint8 bits: index_copy_ has no float8
    kernel everywhere)."""
    cache = cache.view(torch.uint8) if cache.element_size() == 1 else cache
    return cache.view(-1, *cache.shape[2:])


def _static_scales(data: Data) -> tuple:
    """The static (k, v) scales as they broadcast against ``(tokens, Hkv, D)`` rows (one a tensor or one a kv head),
    or (None, None)."""
    return tuple(s.view(-1, 1) for s in data.scales) if data.scales else (None, None)


def _unfused(write: str) -> Callable:
    """ropekit's single-op rope + F.rms_norm + torch's quantise + the cache write with ``index_copy_`` or
    ``index_put_`` (with per-(token, head) scales, the scales computed from the rotated rows and written to the scale
    caches at the same slots)."""
    def put(flat, slots, rows):
        if write == "index_copy_":
            flat.index_copy_(0, slots, rows)
        else:
            flat.index_put_((slots,), rows)

    def store(flat, slots, rows, scale, c, scale_flat=None):
        cache_rows, scale_rows = _cache_rows(rows, scale, c)
        if scale_flat is not None:
            put(scale_flat, slots, scale_rows)
        put(flat, slots, cache_rows)

    def build(data: Data) -> Callable:
        c, cos, sin = data.case, data.cos, data.sin
        if c.kind == "backward":
            if write != "index_copy_":
                raise NotApplicable("the backward writes no cache (one unfused row)")
            return _autograd(lambda q, k, w_q, w_k: apply_rope(_rms_norm(q, w_q, c), _rms_norm(k, w_k, c), cos, sin),
                             data)
        k_scale, v_scale = _static_scales(data)
        if c.kind == "mla":
            latent, positions = data.extra, data.token_positions[None]
            flat = _flat(data.k_cache)
            q_pe, k_pe = data.qkv[None], latent[None, :, None, c.latent:]  # (split once, as the fused call's)

            def mla():
                apply_rope(q_pe, k_pe, positions=positions, interleaved=True, inplace=True, **_angles(data))
                store(flat, data.slots, latent, k_scale, c)  # [kv_c | k_pe] are adjacent in the projection
                return data.qkv
            return mla
        q, k, v = data.split()
        k_flat, v_flat = (_flat(cache) for cache in (data.k_cache, data.v_cache))
        k_scales, v_scales = tuple(_flat(s) for s in data.scale_caches) or (None, None)
        heads = (-1, c.heads_kv, c.head_dim)

        def chain():
            q_, k_ = q, k
            if data.weights:
                q_, k_ = _rms_norm(q, data.weights[0], c), _rms_norm(k, data.weights[1], c)
            # (a NoPE layer scales q and leaves k as it is)
            apply_rope(q_, None if c.angles == "nope" else k_, positions=data.offsets, inplace=True, **_angles(data))
            store(k_flat, data.slots, k_.reshape(heads), k_scale, c, k_scales)
            store(v_flat, data.slots, v.reshape(heads), v_scale, c, v_scales)
            if c.q_dtype is not None:
                return _quantised(q_, data.q_scale, c.q_dtype)
            return q_
        return chain
    return build


def _rows_at(data: Data, positions: torch.Tensor) -> tuple:
    """The compiled chain's angles at ``positions``, in PyTorch: ``(cos, sin, None)`` rows from the table, or
    computed from the inverse frequencies (in float64: the positions lie near a million, where a float32 product
    is off by a hundredth of a radian); ``(None, None, temperature)`` for a NoPE layer, in float32."""
    c = data.case
    if c.angles == "nope":
        floor_scale, attn_scale = NOPE_TEMPERATURE
        turns = torch.div(positions + 1, floor_scale, rounding_mode="floor").float()
        return None, None, torch.log(turns + 1) * attn_scale + 1
    if c.angles == "inv_freq":
        theta = positions.double()[..., None] * data.inv_freq.double()
        return torch.cos(theta).float(), torch.sin(theta).float(), None
    return data.cos[positions], data.sin[positions], None


def _rotate(x, cos, sin, interleaved: bool):
    """PyTorch's rotation of float32 ``x`` by broadcastable half-width rows (the compiled chain's)."""
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)
    x1, x2 = x.chunk(2, -1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)


def _rms_norm(x, w, c: FusedCase):
    """``F.rms_norm`` of each head vector, or (``c.norm_over`` "heads") of each token's whole projection."""
    if c.norm_over == "heads":
        return F.rms_norm(x.flatten(-2), (x.shape[-2] * x.shape[-1],), w, EPS).view_as(x)
    return F.rms_norm(x, (c.head_dim,), w, EPS)


def _norm(x, w, over_heads: bool = False):  # transformers' RMSNorm: float32 math (over_heads: the whole projection)
    if over_heads:
        return _norm(x.flatten(-2), w).unflatten(-1, x.shape[-2:])
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.float()


def _compiled(backend: str) -> Callable:
    """``torch.compile`` of the whole chain written in PyTorch (norm, rotation, quantise, cache write), compiled for
    each case's shapes: dynamo is reset as a case's chain is built (as ``bench.impls``' compiled formula does), else
    past its recompile limit a later case's chain would run uncompiled under this row's name."""
    def build(data: Data) -> Callable:
        torch._dynamo.reset()
        c, cos, sin = data.case, data.cos, data.sin
        over_heads = c.norm_over == "heads"
        if c.kind == "backward":
            def fwd(q, k, w_q, w_k):
                p = torch.arange(c.seqlen, device=q.device)
                rows = (cos[p][:, None, :], sin[p][:, None, :])
                return tuple(_rotate(_norm(x, w, over_heads), *rows, False).to(x.dtype)
                             for x, w in ((q, w_q), (k, w_k)))
            return _autograd(torch.compile(fwd, backend=backend, dynamic=False), data)
        k_scale, v_scale = _static_scales(data)
        if c.kind == "mla":
            flat = _flat(data.k_cache)

            def mla(q_pe, latent, positions, slots):
                cos_rows, sin_rows, _ = _rows_at(data, positions)
                rows = (cos_rows[:, None, :], sin_rows[:, None, :])
                q_pe.copy_(_rotate(q_pe.float(), *rows, True).to(q_pe.dtype))
                k_pe = _rotate(latent[:, None, c.latent:].float(), *rows, True)[:, 0].to(latent.dtype)
                flat.index_copy_(0, slots, _cache_rows(torch.cat((latent[:, :c.latent], k_pe), -1), k_scale, c)[0])
                return q_pe
            compiled = torch.compile(mla, backend=backend, dynamic=False)
            positions = data.token_positions
            return lambda: compiled(data.qkv, data.extra, positions, data.slots)
        k_flat, v_flat = (_flat(cache) for cache in (data.k_cache, data.v_cache))
        k_scales, v_scales = tuple(_flat(s) for s in data.scale_caches) or (None, None)
        w_q, w_k = data.weights or (None, None)

        def store(flat, slots, x, scale, scale_flat):
            """x: rows (tokens, Hkv, D) in the model's dtype, written in the cache's format (with scale caches, the
            per-(token, head) scales or NVFP4's block scales computed here and written at the same slots)."""
            cache_rows, scale_rows = _cache_rows(x, scale, c)
            if scale_flat is not None:
                scale_flat.index_copy_(0, slots, scale_rows)
            flat.index_copy_(0, slots, cache_rows)

        def chain(qkv, positions, slots):
            q, k, v = qkv.split([c.heads_q, c.heads_kv, c.heads_kv], dim=2)
            cos_rows, sin_rows, temperature = _rows_at(data, positions)
            q_in = _norm(q, w_q, over_heads) if w_q is not None else q.float()
            k_in = _norm(k, w_k, over_heads) if w_k is not None else k.float()
            if temperature is not None:  # a NoPE layer: q scaled, k as it is
                q_rot, k_rot = q_in * temperature[..., None, None], k
            else:
                rows = (cos_rows[..., None, :], sin_rows[..., None, :])
                q_rot, k_rot = _rotate(q_in, *rows, False), _rotate(k_in, *rows, False).to(k.dtype)
            store(k_flat, slots, k_rot.reshape(-1, c.heads_kv, c.head_dim), k_scale, k_scales)
            store(v_flat, slots, v.reshape(-1, c.heads_kv, c.head_dim), v_scale, v_scales)
            if c.q_dtype is not None:  # float8 attention's q: quantised from the float32 rotation
                return _quantised(q_rot, data.q_scale, c.q_dtype)
            q.copy_(q_rot.to(q.dtype))
            return q
        compiled = torch.compile(chain, backend=backend, dynamic=False)
        positions = data.token_positions.view(c.batch, c.seqlen)
        return lambda: compiled(data.qkv, positions, data.slots)
    return build


IMPL_NAMES = ("ropekit-fused", "unfused (index_copy_)", "unfused (index_put_)", "torch.compile")
# not an implementation: a plain device copy that moves the case's byte floor, timed with them
COPY_REFERENCE = "copy of the floor's bytes"
# not an implementation either: the decode cases' launch-chain floor (ropekit.bench.floor), timed with them
LAUNCH_FLOOR = floor.NAME
LAUNCH_FLOOR_DEPENDENT = floor.NAME_DEPENDENT


def impls(compile_backend: str = "inductor") -> dict:
    """name -> builder; ``compile_backend``: torch.compile's backend (a dry run on the CPU may pick "aot_eager")."""
    return dict(zip(IMPL_NAMES, (_fused, _unfused("index_copy_"), _unfused("index_put_"),
                                 _compiled(compile_backend))))


# --- the runner ------------------------------------------------------------------------------------------------

def checked_call(case: FusedCase, build: Callable, device, seed: int) -> tuple[dict, Data, Callable]:
    """Fresh random inputs for ``case`` (``seed``), the call ``build`` makes of them, run once and checked against the
    float64 reference: (the check's fields, the inputs, the call). Keep the inputs alive while a graph of the call
    may replay."""
    data = make_data(case, device, seed)
    want = expected(data)
    fn = build(data)
    return check(data, want, actual(data, fn())), data, fn


def run_case(case: FusedCase, builders: dict, timer, device, seed: int = 0, ceiling_gbps: Optional[float] = None,
             log=print) -> list[dict]:
    """Check every implementation of ``case``, capture each in a CUDA graph, replay them in interleaved rounds.

    ``timer``: :class:`ropekit.bench.timing.GpuTimer` (or a fake with ``capture``/``replay_rounds``), or None for a
    dry run (checked, not timed). A failing implementation gives an error row; the others go on. A timed run adds
    the row ``COPY_REFERENCE`` (status "reference"): a plain copy of the case's byte floor in the same rounds; and
    for a decode case the row ``LAUNCH_FLOOR`` (status "reference"): the launch-chain floor, in the same rounds, and
    on a GPU that launches grids programmatically ``LAUNCH_FLOOR_DEPENDENT``, the same chain launched that way.
    """
    rows, pending = [], []
    floor_us = floor_bytes(case) / (ceiling_gbps * 1e3) if ceiling_gbps else 1.0
    for i, (name, build) in enumerate(builders.items()):
        row = {"case": case.name, "impl": name, "status": "ok", "graph_us": None}
        rows.append(row)
        try:
            with stream_for(case, device):
                result, data, fn = checked_call(case, build, device, seed + 1000 * i)
                row.update(result)
                if not row["ok"]:
                    row["status"] = "wrong result"
                elif timer is not None:
                    pending.append((row, timer.capture([fn], floor_us), (data, fn)))
        except NotApplicable as reason:
            row.update(status="skipped", reason=str(reason))
        except Exception as error:  # noqa: BLE001  (one implementation's failure must not end the run)
            row.update(status="error", reason=f"{type(error).__name__}: {error}"[:400])
        log(f"{case.name:28s} {name:24s} {row['status']}")
    if timer is not None:
        row = {"case": case.name, "impl": COPY_REFERENCE, "status": "reference", "graph_us": None}
        rows.append(row)
        copy = copy_of_floor(case, device)
        pending.append((row, timer.capture([copy], floor_us), copy))
        if case.decode:
            # the floor, and where ropekit's small grids launch programmatically the same chain launched that way
            for name, _, dependent in floor.floors(device):
                row = {"case": case.name, "impl": name, "status": "reference", "graph_us": None}
                rows.append(row)
                try:
                    chain = floor.launch_chain(device, seed, dependent)
                    pending.append((row, timer.capture([chain], floor_us), chain))
                except Exception as error:  # noqa: BLE001  (a floor is context; its failure must not end the run)
                    row.update(status="error", reason=f"{type(error).__name__}: {error}"[:400])
    if pending:
        results = timer.replay_rounds([captured for _, captured, _ in pending])
        for (row, _, _), (median, spread, calls) in zip(pending, results):
            row.update(graph_us=median, graph_spread=spread, graph_calls=calls)
    return rows


def copy_of_floor(case: FusedCase, device) -> Callable:
    """A device-to-device copy of fresh random bytes that moves the case's byte floor (half read, half written):
    what moving the floor costs on the implementations' clock, its start and end included."""
    src = torch.randint(0, 256, (floor_bytes(case) // 2,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def stream_for(case: FusedCase, device):
    """Backward rows run on a side stream (autograd replays a backward on its forward's stream; a CUDA graph can
    capture a side stream, not the default one)."""
    if case.kind != "backward" or torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.Stream())


def run(cases, builders: dict, timer, device, *, log=print, budget_s: Optional[float] = None) -> dict:
    """The whole run as one JSON-ready document (the copy ceiling first, then the cases). Once ``budget_s`` seconds
    have passed, the remaining cases get "not run" rows, so that a run cut short still writes what it measured."""
    start = time.perf_counter()
    ceiling = timer.copy_ceiling() if timer is not None else None
    gbps = ceiling["gbps"] if ceiling else None
    rows = []
    for case in cases:
        if budget_s and time.perf_counter() - start > budget_s:
            rows += [{"case": case.name, "impl": name, "status": "not run", "graph_us": None,
                      "reason": f"time budget of {budget_s:g} s used up (--time-budget)"} for name in builders]
            continue
        rows += run_case(case, builders, timer, device, ceiling_gbps=gbps, log=log)
    return {
        "benchmark": "fused pre-processing",
        "environment": _environment(device),
        "copy_ceiling": ceiling,
        "cases": [dict(name=c.name, title=c.title, kind=c.kind, batch=c.batch, seqlen=c.seqlen, heads_q=c.heads_q,
                       heads_kv=c.heads_kv, head_dim=c.head_dim, latent=c.latent, dtype=str(c.dtype)[6:],
                       qk_norm=c.qk_norm, fp8=c.fp8, decode=c.decode, block_size=BLOCK_SIZE,
                       kv_cache_dtype=c.kv_cache_dtype, per_head_scales=c.per_head_scales,
                       q_dtype=str(c.q_dtype)[6:] if c.q_dtype is not None else None, quantised=c.quantised,
                       format=c.format, floor_bytes=floor_bytes(c), scale_bytes=scale_bytes(c),
                       static_scale_bytes=static_scale_bytes(c), meta_bytes=meta_bytes(c),
                       floor_us=floor_bytes(c) / (gbps * 1e3) if gbps else None)
                  for c in cases],
        "rows": rows,
    }


def _environment(device) -> dict:
    import triton

    env = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "device": str(device)}
    if torch.device(device).type == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    return env


def cli_parser(prog: str, doc: str, outputs: str, time_budget_s: float) -> argparse.ArgumentParser:
    """The fused benchmarks' shared options: ``--out``, ``--dry-run``, ``--quick``, ``--time-budget``."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help=f"folder for {outputs}")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, checks only, no clock (any machine)")
    parser.add_argument("--quick", action="store_true", help="shorter timing (smoke run on a GPU)")
    parser.add_argument("--time-budget", type=float, default=time_budget_s,
                        help="seconds after which no new case starts (0: no limit); outputs are written either way")
    return parser


def main(argv=None) -> int:
    from .fused_report import publish
    from .timing import QUICK, GpuTimer, Settings

    parser = cli_parser("python -m ropekit.bench.fused", __doc__, "benchmarks_fused.{json,md,png}", 480.0)
    parser.add_argument("--cases", nargs="*", default=None, help=f"case names (default all): {[c.name for c in CASES]}")
    parser.add_argument("--compile-backend", default=None, help="torch.compile backend (inductor; dry run aot_eager)")
    args = parser.parse_args(argv)
    unknown = set(args.cases or ()) - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}")
    cases = [c for c in CASES if args.cases is None or c.name in args.cases]
    gpu = torch.cuda.is_available() and not args.dry_run
    device = "cuda" if torch.cuda.is_available() else "cpu"
    timer = GpuTimer(QUICK if args.quick else Settings()) if gpu else None
    if not gpu:
        cases = [tiny(c) for c in cases]
    backend = args.compile_backend or ("inductor" if gpu else "aot_eager")
    doc = run(cases, impls(backend), timer, device, budget_s=args.time_budget)
    doc["command"] = "python -m ropekit.bench.fused " + " ".join(argv if argv is not None else sys.argv[1:])
    publish(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
