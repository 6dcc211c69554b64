"""The fuzzer's targets for the fused ops that write a KV cache: ``ropekit.rope_and_cache`` (every layout, every
address map: a paged cache by slot mapping or by FlashInfer's page table, or a contiguous one with ``cache_offsets``;
QK-norm optional, ``write_k``, float8 caches with their scales) and ``ropekit.mla_rope_and_cache`` (MLA's latent
cache, FlashInfer's two caches ``(ckv_cache, kpe_cache)`` or DeepSeek's fp8_ds_mla entry, by slot mapping or page
table, in place or not). Caches are drawn as engines allocate them (vLLM's ``kv[:, 0]``, FlashInfer's HND passed as
it lies with ``kv_layout="HND"`` or seen transposed, its 5-D ``paged_kv_cache``, padded channels, strided blocks,
uint8 bytes); caches, slot mappings, page tables and scales like the activations: views with guard elements around
them, slots and batch indices that are -1, out of range or (in check mode) repeated, positions past a request's pages,
pages outside the pool, positions past the table. In a share of the cases a written tensor and another tensor of the
call are carved from one byte pool (``Arena.share``): on each other's bytes, an overlap of one of
:data:`OVERLAP_KINDS` that must be refused before anything is written, or apart. The check: every written slot holds
the float64 reference (within the dtype's bound, or one e4m3 spacing of value / scale; v's bits exactly; an
fp8_ds_mla entry's e4m3 bytes and tile scales the reference's bit for bit), every other cache element and every input
is bitwise unchanged (the arena's check), and in check mode a bad slot, offset or position raises."""

from __future__ import annotations

import math
import random
from typing import Callable

import torch

import ropekit
from ropekit import reference as ref
from ropekit.testing import check_close_to_reference

from .arena import overlaps
from .cache_args import CACHE_KINDS, E5M2, FP8, INT8, PAGE_TABLE, draw_page_table, draw_slots, engine_caches
from .cache_readback import as_fp8, cache_problems, nvfp4_problems, refusals, scale_problems, table_rows
from .common import layout_shape
from .fuzz import EITHER, MATCH, RAISE, Arena, Case, same_bits, self_overlapping
from .rope_args import (ANGLE_SCALES, DTYPES, INDEX_KINDS, INPUT_KINDS, angle_rows, draw_angles, draw_mrope_section,
                        from_tokens, pick, position_values, to_tokens)

__all__ = ["TARGETS", "OVERLAP_KINDS", "overlap_kind", "pool_overlaps", "draw_rope_and_cache",
           "draw_mla_rope_and_cache"]

# the quantised caches rope_and_cache writes (e4m3 drawn twice as often: the engines' default), each with the vLLM
# kv_cache_dtype names that may accompany it (per-tensor or per-head scales; per (token, head) scales)
_QUANT_DTYPES = (FP8, FP8, E5M2, INT8)
_KV_CACHE_DTYPES = {FP8: (("auto", "fp8", "fp8_e4m3"), ("auto", "fp8_per_token_head")),
                    E5M2: (("auto", "fp8_e5m2"), ("auto",)), INT8: (("auto",), ("auto", "int8_per_token_head"))}
# the share of quantised caches drawn as NVFP4 (e2m1 bytes with e4m3 block scales over a global scale)
_NVFP4_SHARE = 0.25
# the share of cases whose written tensor is carved from one byte pool with another tensor of the call
_POOL_PROBABILITY = 0.35
# the shares of cases whose angles are computed from inv_freq (no table), and whose positions are M-RoPE's
_ANGLES_SHARE, _MROPE_SHARE = 0.2, 0.2
# the share of cases that are a Llama 4 NoPE layer (nope_temperature: no angles, q times its token's temperature, k
# and v cached as they are); floor_scale small (several temperatures among a few positions), Llama 4's 8192, or an
# integer-valued float (accepted)
_NOPE_SHARE = 0.08
_NOPE_FLOOR_SCALES, _NOPE_ATTN_SCALES = (1, 2, 3, 4, 7, 8192, 4.0), (0.1, 0.5, 1.0)
# a NoPE case as drawn: valid, or with one thing a NoPE layer does not take (each refused by an error naming
# nope_temperature), and why it must raise then
_NOPE_MISUSES = (("valid", 80), ("cos/sin", 3), ("inv_freq", 3), ("norm", 3), ("rotary_dim", 3), ("floor_scale", 3),
                 ("attn_scale", 3), ("mrope_section", 2))
_NOPE_WHY = {"cos/sin": "nope_temperature with cos/sin tables", "inv_freq": "nope_temperature with inv_freq",
             "norm": "nope_temperature with a QK-norm", "rotary_dim": "nope_temperature with rotary_dim < head_dim",
             "floor_scale": "nope_temperature with an invalid floor_scale",
             "attn_scale": "nope_temperature with an invalid attn_scale",
             "mrope_section": "nope_temperature with mrope_section"}
# mla_rope_and_cache's table-free angles (inv_freq, scale): their share of the cases, and a case as drawn: valid, or
# with one thing the angles do not take, each refused by an error naming the argument, and why it must raise then
# (draw_angles adds its own refusals: a half-dtype or 2-D inv_freq, a scale that is not finite)
_MLA_ANGLES_SHARE = 0.15
_MLA_ANGLE_MISUSES = (("valid", 84), ("cos_sin_cache", 4), ("cos/sin", 4), ("short", 4), ("scale with a table", 4))
_MLA_ANGLE_WHY = {"cos_sin_cache": "inv_freq together with cos_sin_cache", "cos/sin": "inv_freq together with cos/sin",
                  "short": "an inv_freq shorter than rope_dim / 2",
                  "scale with a table": "scale other than 1 without inv_freq"}
# the table-free angles' frequencies: in _YARN_SHARE of the cases YaRN's (fast pairs kept, slow ones interpolated by
# its factor) as DeepSeek configures it (attention factor 1.0) or without mscale (attention factor 0.1 ln(40) + 1),
# plain ones otherwise
_YARN_CONFIGS = ({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
                  "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0},
                 {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                  "rope_theta": 10000.0})
_YARN_SHARE = 0.4
# the largest positions the table-free angles are drawn up to, besides the table's rows (no table bounds them):
# DeepSeek's trained context, a ten-million-token one
_ANGLE_POSITION_TOPS = (163_839, 10_000_000)
# DeepSeek-V3.2's fp8_ds_mla entry (kv_cache_dtype="fp8_ds_mla": kv_c in e4m3 at a float32 scale a 128-channel tile
# computed on write, the scales, the rotated k_pe in the model's dtype): about 12 % of the MLA cases, the band just
# above the quantised share of the one draw that decides it (float64 never: the entry holds k_pe in the model's
# dtype), so that every other case draws what it drew before. Inputs bf16, fp16 or float32; latent whole tiles.
_DS_SHARE = 0.12 / 0.9  # (of the cases not in float64, nine in ten)
_DS_DTYPES = ((torch.bfloat16, 4), (torch.float16, 3), (torch.float32, 1))
_DS_LATENTS, _DS_ROPE_DIMS = (128, 256, 512), (8, 16, 64)
# a tile of a token's kv_c as drawn: values spread over 10^-4..10^3; past e4m3's 448 (scaled into it); all zeros
# (the scale's floor, 2^-126); or tiny, normal values below 448 x 2^-126 (the floor with values; not fp16: none
# there). (No bf16 subnormals: Triton's interpreter converts them to float32 wrongly, TRITON_INTERPRET=1 only.)
_DS_TILES = (("spread", 70), ("past 448", 18), ("zero", 7), ("tiny", 5))
# an entry case as drawn: valid, or with one thing the entry does not take, each refused (by an error naming the
# argument) before anything is written, and why it must raise then
_DS_MISUSES = (("valid", 80), ("pair", 4), ("entry size", 4), ("not whole tiles", 4), ("float8 cache", 3),
               ("unaligned", 3), ("misspelt", 2))
_DS_WHY = {"pair": "fp8_ds_mla with the pair (ckv_cache, kpe_cache)",
           "entry size": "an fp8_ds_mla kv_cache whose entry is not latent + 4 * tiles + rope_dim * itemsize bytes",
           "not whole tiles": "fp8_ds_mla with a kv_c that is not whole 128-channel tiles",
           "float8 cache": "fp8_ds_mla with a float8 (not uint8) kv_cache",
           "unaligned": "fp8_ds_mla entries not at multiples of 4 bytes",
           "misspelt": "a kv_cache_dtype that is none of the names"}
_DS_NOT_TILES = (64, 96, 160, 192, 320)  # latents that are not whole tiles (each a multiple of 32: entries aligned)
_DS_MISSPELT = ("fp8_ds-mla", "FP8_DS_MLA", "fp8_ds")

# The tensors of a call, grouped for the overlap kinds' names (docs/fuzzing.md).
_GROUPS = {"q, k or v": ("q", "k", "v", "q_pe", "k_pe", "kv_c"),
           "cos/sin": ("cos", "sin", "cos_sin_cache", "inv_freq"), "norm weights": ("q_weight", "k_weight"),
           "scales": ("k_scale", "v_scale", "kv_cache_scale", "q_scale"),
           "index tensors": ("positions", "slot_mapping", "cu_seqlens", "cache_offsets", "kv_indices", "kv_indptr",
                             "batch_indices", "cache_positions"),
           "a cache": ("k_cache", "v_cache", "kv_cache", "ckv_cache", "kpe_cache", "k_scale_cache", "v_scale_cache")}
OVERLAP_KINDS = ("a cache over q, k or v", "a cache over cos/sin", "a cache over norm weights",
                 "a cache over index tensors", "a cache over scales", "a cache over a cache",
                 "a float8 cache and a bf16 (or wider) q, k or v in one byte pool",
                 "in-place q or k over a read tensor")
"""The overlap kinds the fuzzer draws (``Case.spec["overlap_kind"]``); every one must be refused."""


def overlap_kind(written: str, other: str, a: torch.Tensor, b: torch.Tensor) -> str:
    """The kind (one of :data:`OVERLAP_KINDS`) of a written tensor lying on bytes of another."""
    group = next(g for g, names in _GROUPS.items() if other in names)
    if written in _GROUPS["a cache"]:
        if group == "q, k or v" and a.element_size() != b.element_size():
            return "a float8 cache and a bf16 (or wider) q, k or v in one byte pool"
        return f"a cache over {group}"
    return "in-place q or k over a read tensor"


def pool_overlaps(arena: Arena, spec: dict, written: dict, others: dict) -> tuple[list, bool]:
    """Where the drawn tensors overlap: the reasons the call must be refused (a written tensor on another one's
    bytes; named in ``spec``) and whether either outcome is right (byte spans that meet, elements apart)."""
    shared, spans = overlaps(arena, written, others)
    named = {**others, **written}
    if shared:
        w, t = shared[0]
        spec.update(overlap=f"{w} over {t}", overlap_kind=overlap_kind(w, t, named[w], named[t]))
    elif arena.pooled():
        spec.update(overlap="apart in one pool")
    return [f"{w} lies on {t}'s bytes" for w, t in shared], bool(spans)


def draw_rope_and_cache(rng: random.Random, gen: torch.Generator, device) -> Case:
    """``rope_and_cache`` in every layout (``thd`` with ``cu_seqlens``), q, k, v with any view kind (q without heads
    at times), positions as ids, M-RoPE's ``(3, ...)`` ids with ``mrope_section`` or none, a cos/sin table or the
    angles computed from ``inv_freq`` (times ``scale``) or a Llama 4 NoPE layer (``nope_temperature``: no angles, q
    times its token's temperature, k and v cached as they are; rarely given a table, ``inv_freq``, a norm, fewer
    channels, M-RoPE or an invalid pair, each refused), QK-norm or not (``norm``, ``norm_over``), in place or not,
    ``write_k`` or not, q's output in its dtype or float8 (``q_dtype``, ``q_scale``); a paged cache (a slot
    mapping, shorter than the tokens at times) or a contiguous one with ``cache_offsets``, in the activations' dtype or
    quantised (float8 e4m3 or e5m2, as bytes at times, or int8; one scale, one a kv head, or one a (token, head) written
    to scale caches; vLLM's ``kv_cache_dtype`` names at times; NVFP4 with its block-scale caches, in the caches'
    layout, over global scales), drawn as engines allocate it; a cache that requires
    grad; and, in a share of the cases, a written tensor and another of the call carved from one byte pool, on each
    other's bytes (to be refused) or apart (to be accepted)."""
    arena = Arena(rng, gen, device)
    either = []
    layout = rng.choice(("bshd", "sbhd", "bhsd", "thd"))
    if layout == "thd":
        lengths = [rng.randint(0, 3) for _ in range(rng.randint(1, 3))]
        batch, seq, tokens = len(lengths), max(lengths), sum(lengths)
    else:
        batch, seq = rng.randint(1, 2), rng.randint(0, 3)
        lengths, tokens = [seq] * batch, batch * seq
    token_shape = (tokens,) if layout == "thd" else (batch, seq)
    hq, hk = rng.randint(1, 3) if rng.random() > 0.1 else 0, rng.randint(1, 2)
    head_dim = rng.choice((8, 16))
    rotary_dim, v_dim = rng.choice((head_dim, head_dim // 2)), rng.choice((head_dim, 8))
    interleaved, norm_draw, inplace, write_k = (rng.random() < 0.4, rng.random(), rng.random() < 0.5,
                                                rng.random() < 0.3)
    # QK-norm in 40% of the cases, half of them across all heads (heads x head_dim weights): one draw, so that the
    # draws after it stay each seed's
    norm, norm_over = norm_draw < 0.4, "heads" if norm_draw < 0.2 else "head"
    # the norm's place (None: the default, before the rotation with weights) and whether it has weights
    placement = rng.choice((None, "before", "after")) if norm else None
    weighted = norm and (placement is None or rng.random() < 0.6)
    pooled = rng.random() < _POOL_PROBABILITY
    dtype = rng.choices(DTYPES, weights=(4, 3, 2, 1))[0]
    quantised = dtype != torch.float64 and rng.random() < (0.5 if pooled else 0.3)
    nvfp4 = quantised and rng.random() < _NVFP4_SHARE
    if nvfp4:  # whole 16-channel blocks: of k's and v's head vectors, and of each NeoX half of the rotated channels
        head_dim = rng.choice((16, 32))
        interleaved = interleaved or head_dim == 16
        rotary_dim = rng.choice((16, head_dim)) if interleaved else 32
        v_dim = rng.choice((head_dim, 16))
    cache_dtype = torch.uint8 if nvfp4 else rng.choice(_QUANT_DTYPES) if quantised else dtype
    scales_mode = "block" if nvfp4 else rng.choice(("tensor", "head", "token_head")) if quantised else None
    dynamic = scales_mode in ("token_head", "block")  # scale caches written
    hostile, check_mode = not pooled and rng.random() < 0.25, not pooled and rng.random() < 0.2
    rows, block_size, num_blocks = rng.randint(max(seq, 1), 12), rng.choice((1, 2, 4)), rng.randint(1, 4)
    address = rng.choices(("slot_mapping", "page table", "cache_offsets"), weights=(4, 3, 3))[0]
    paged, pair = address != "cache_offsets", v_dim == head_dim and rng.random() < 0.3
    positions_given = rng.random() < 0.7 and not (layout == "thd" and batch == tokens > 1)  # (tokens,) == (n_seqs,)
    short = address == "slot_mapping" and tokens and rng.random() < 0.2
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    # the angles: a table, or computed in the kernel from inverse frequencies; the positions: M-RoPE's (3, ...) ids
    # at times; q's output: its dtype, or float8 at q_scale (a new tensor: in place it is refused)
    # (one draw says where the angles come from, so that a table case's draws after it stay each seed's: a NoPE layer
    # takes a share of the table cases)
    source, mrope = rng.random(), rng.random() < _MROPE_SHARE
    by_angles, nope = source < _ANGLES_SHARE, _ANGLES_SHARE <= source < _ANGLES_SHARE + _NOPE_SHARE
    misuse, nope_why = None, []
    if nope:  # the whole head, no angles, no norm, no M-RoPE: rarely one of them anyway, or an invalid pair (refused)
        misuse = pick(rng, _NOPE_MISUSES)
        floor_scale, attn_scale = rng.choice(_NOPE_FLOOR_SCALES), rng.choice(_NOPE_ATTN_SCALES)
        if misuse == "floor_scale":
            floor_scale = rng.choice((0, 2.5, True))
        elif misuse == "attn_scale":
            attn_scale = rng.choice((float("nan"), True))
        rotary_dim, by_angles, mrope = head_dim, misuse == "inv_freq", misuse == "mrope_section"
        if misuse != "norm":
            norm, placement, weighted = False, None, False
        elif not norm:
            norm, norm_over, placement, weighted = True, "head", None, True
        # rotary_dim: not passed, passed as head_dim (accepted), or fewer channels (refused)
        nope_rotary = head_dim // 2 if misuse == "rotary_dim" else rng.choice((None, head_dim))
        nope_why = [_NOPE_WHY[misuse]] if misuse != "valid" else []
    table_given = not by_angles and (not nope or misuse == "cos/sin")
    positions_given = positions_given or mrope
    q_output = rng.choices(("own", "float8", "explicit", "hostile"), weights=(79, 16, 3, 2))[0]
    if q_output == "float8" and inplace and rng.random() < 0.9:
        inplace = False
    written = ["k_cache", "v_cache"] + (["k_scale_cache", "v_scale_cache"] if dynamic else []) + (
        ["q"] + (["k"] if write_k else []) if inplace else [])
    read = ["q", "k", "v"] + (["inv_freq"] if by_angles else ["cos", "sin"] if table_given else []) + (
        list(PAGE_TABLE) if address == "page table" else [address]) + (["q_scale"] if q_output == "float8" else [])
    read += (["positions"] if positions_given else []) + (["cu_seqlens"] if layout == "thd" else [])
    read += (["q_weight", "k_weight"] if weighted else []) + (["k_scale", "v_scale"] if quantised and (
        nvfp4 or not dynamic) else [])
    if pooled:  # (vLLM's k and v caches are one allocation, named k_cache; q, k and v drawn twice as often)
        writer = rng.choice([n for n in written if not (pair and n == "v_cache")])
        partners = [n for n in read + written + ["q", "k", "v"] if n not in (writer, "v_cache" if pair else "")]
        arena.share(writer, rng.choice(partners), apart=rng.random() < 0.25)

    cu = max_seqlen = None
    if layout == "thd":
        cu_list = [0]
        for n in lengths:
            cu_list.append(cu_list[-1] + n)
        cu = arena.place("cu_seqlens", (len(cu_list),), rng.choice((torch.int32, torch.int64)),
                         pick(rng, INDEX_KINDS), lambda shape: torch.tensor(cu_list))
        max_seqlen = rng.choice((seq, None))
        local = torch.cat([torch.arange(n) for n in lengths])
    else:
        local = torch.arange(seq).expand(batch, seq)
    q = arena.place("q", layout_shape(layout, batch, seq, hq, head_dim, tokens), dtype, pick(rng, INPUT_KINDS))
    k = arena.place("k", layout_shape(layout, batch, seq, hk, head_dim, tokens), dtype, pick(rng, INPUT_KINDS))
    v = arena.place("v", layout_shape(layout, batch, seq, hk, v_dim, tokens), dtype, pick(rng, INPUT_KINDS))
    angle_why, angle_kwargs, with_tables = [], {}, table_given
    if by_angles:  # (rarely a table as well: refused)
        inv_freq, angle_scale, angle_why = draw_angles(rng, arena, rotary_dim // 2)
        angle_kwargs, with_tables = dict(inv_freq=inv_freq, scale=angle_scale), rng.random() < 0.04
        angle_why += ["inv_freq together with cos/sin"] if with_tables else []
    elif not nope and rng.random() < 0.01:  # a scale without inv_freq: refused
        angle_kwargs, angle_why = dict(scale=rng.choice((0.5, 2.0))), ["scale other than 1 without inv_freq"]
    cos = sin = None
    if with_tables:
        cos = arena.place("cos", (rows, rotary_dim // 2), table_dtype, pick(rng, INPUT_KINDS))
        sin = arena.place("sin", (rows, rotary_dim // 2), table_dtype, pick(rng, INPUT_KINDS))
    positions = None
    if mrope:  # three ids a token (temporal, height, width), each pair at its section's axis
        section = draw_mrope_section(rng, rotary_dim // 2)
        if rng.random() < 0.05:
            section[rng.randrange(3)] += 1
            angle_why.append("an mrope_section that does not sum to rotary_dim/2")
        angle_kwargs.update(mrope_section=section, mrope_interleaved=rng.random() < 0.5)
    if nope:
        angle_kwargs.update(nope_temperature=(floor_scale, attn_scale),
                            **({} if nope_rotary is None else dict(rotary_dim=nope_rotary)))
    if positions_given:
        positions = arena.place("positions", ((3,) if mrope else ()) + token_shape,
                                rng.choice((torch.int64, torch.int32)), pick(rng, INDEX_KINDS),
                                position_values(gen, 0, rows - 1, hostile, rows))
    raw = local if positions is None else positions.detach().cpu().to(torch.int64)
    # each token's position, or with M-RoPE each pair's: (*tokens, rotary_dim / 2)
    pos = ref.mrope_pair_positions(raw, angle_kwargs["mrope_section"], mrope_interleaved=angle_kwargs[
        "mrope_interleaved"])[..., :rotary_dim // 2] if mrope else raw
    if paged:
        shape = (num_blocks, block_size)
    else:
        shape = (batch, max(max(lengths), 1) + rng.randint(0, 2))
    packed = 2 if nvfp4 else 1  # NVFP4: two channels a byte
    caches, engine, allocation = engine_caches(arena, "k_cache", shape + (hk, head_dim // packed), cache_dtype,
                                               pair)
    if not pair:
        caches += engine_caches(arena, "v_cache", shape + (hk, v_dim // packed), cache_dtype)[0]
    k_cache, v_cache = caches
    n_slots = shape[0] * shape[1]
    outside, table_refusals = False, []
    if address == "page table":
        addressing, slots, table_refusals = draw_page_table(arena, rng, tokens, num_blocks, block_size, hostile,
                                                            repeat=check_mode and rng.random() < 0.3)
        mapped = []
    elif paged:
        mapped = draw_slots(rng, tokens, n_slots, hostile, repeat=check_mode and rng.random() < 0.3)
        if short:
            mapped = mapped[:rng.randrange(tokens)]
        slot_mapping = arena.place("slot_mapping", (len(mapped),), torch.int64, pick(rng, INDEX_KINDS),
                                   lambda s: torch.tensor(mapped, dtype=torch.int64).reshape(s))
        slots = mapped + [-1] * (tokens - len(mapped))
        addressing = dict(slot_mapping=slot_mapping)
    else:  # token s of sequence b at row offsets[b] + s of cache[b]: as slots of the flattened cache
        offsets = [rng.randint(0, shape[1] - n) for n in lengths]
        if hostile:
            offsets[rng.randrange(batch)] = rng.choice((shape[1], -1, shape[1] - 1))
        ends = [o + n for o, n in zip(offsets, lengths)]
        # docs/fused.md: offsets >= 0 and every sequence inside the rows, an empty one too (checked in check mode)
        outside = any(o < 0 or e > shape[1] for o, e in zip(offsets, ends))
        slots = [b * shape[1] + offsets[b] + s if 0 <= offsets[b] + s < shape[1] else -1
                 for b, n in enumerate(lengths) for s in range(n)]
        if rng.random() < 0.3 and min(offsets) >= 0 and len(set(offsets)) == 1:
            cache_offsets = offsets[0]
        else:
            cache_offsets = arena.place("cache_offsets", (batch,), rng.choice((torch.int32, torch.int64)),
                                        pick(rng, INDEX_KINDS), lambda s: torch.tensor(offsets).reshape(s))
        addressing, mapped = dict(cache_offsets=cache_offsets), []
    # FlashInfer's caches as it holds them: an HND cache as it lies (kv_layout="HND"), the (num_blocks, 2, ...)
    # pair as one 5-D paged_kv_cache
    five_d = pair and rng.random() < 0.4
    kv_layout = "HND" if engine["hnd"] and (five_d or rng.random() < 0.5) else "NHD"
    given = [c.transpose(1, 2) if kv_layout == "HND" else c for c in (k_cache, v_cache)]
    caches_given = dict(k_cache=allocation) if five_d else dict(k_cache=given[0], v_cache=given[1])
    kwargs = dict(**caches_given, positions=positions, layout=layout, interleaved=interleaved, inplace=inplace,
                  write_k=write_k, cu_seqlens=cu, max_seqlen=max_seqlen, **addressing)
    if kv_layout == "HND" or rng.random() < 0.1:
        kwargs["kv_layout"] = kv_layout
    if nvfp4:
        kwargs["kv_cache_dtype"] = "nvfp4"
    elif quantised:
        stored_bytes = torch.uint8 in (k_cache.dtype, v_cache.dtype)  # (e5m2 bytes are named by kv_cache_dtype)
        names = _KV_CACHE_DTYPES[cache_dtype][dynamic]
        kwargs["kv_cache_dtype"] = "fp8_e5m2" if stored_bytes and cache_dtype == E5M2 else rng.choice(names)
    if nvfp4:  # the block scales in the caches' own layout (NHD or HND), e4m3 or its bytes; the global scales
        for name, dim in (("k_scale_cache", head_dim), ("v_scale_cache", v_dim)):
            rows_heads = (hk, shape[1]) if kv_layout == "HND" else (shape[1], hk)
            kwargs[name] = arena.place(name, (shape[0], *rows_heads, dim // 16), torch.uint8,
                                       pick(rng, CACHE_KINDS))
            if rng.random() < 0.5:
                kwargs[name] = kwargs[name].view(FP8)
        kwargs.update({name: arena.place(name, (1,), torch.float32, values=lambda s, c=choices: torch.tensor(
            [rng.choice(c)]).reshape(s)) for name, choices in (("k_scale", (0.05, 1.0, 0.3)),
                                                                ("v_scale", (0.003, 1.0, 0.5)))})
    elif dynamic:  # (in the caches' NHD order, whatever kv_layout says)
        kwargs.update({name: arena.place(name, shape + (hk,), torch.float32, pick(rng, CACHE_KINDS))
                       for name in ("k_scale_cache", "v_scale_cache")})
    elif quantised:
        size = 1 if scales_mode == "tensor" else hk
        kwargs.update(k_scale=arena.place("k_scale", (size,), torch.float32, values=lambda s: torch.tensor(
                          [rng.choice((0.05, 1.0, 3.0)) for _ in range(size)]).reshape(s)),
                      v_scale=arena.place("v_scale", (size,), torch.float32, values=lambda s: torch.tensor(
                          [rng.choice((0.003, 1.0, 0.5)) for _ in range(size)]).reshape(s)))
    eps, weight_offset = 1e-6, rng.choice((0.0, 1.0)) if weighted else 0.0
    if norm:
        kwargs.update(eps=eps, norm_over=norm_over, **({"norm": placement} if placement is not None else {}))
    if weighted:
        widths = (hq * head_dim, hk * head_dim) if norm_over == "heads" else (head_dim, head_dim)
        kwargs.update(q_weight=arena.place("q_weight", (widths[0],), dtype), weight_offset=weight_offset,
                      k_weight=arena.place("k_weight", (widths[1],), dtype))
    kwargs.update(angle_kwargs)
    q_why, q_float8 = _draw_q_output(rng, arena, kwargs, q_output, dtype, inplace)
    grad_cache = not pooled and not five_d and kv_layout == "NHD" and cache_dtype == dtype and rng.random() < 0.05
    if grad_cache:
        k_cache.requires_grad_()

    spec = dict(op="rope_and_cache", layout=layout, lengths=lengths, tokens=tokens, hq=hq, hk=hk, head_dim=head_dim,
                rotary_dim=rotary_dim, v_dim=v_dim, interleaved=interleaved, norm=norm, norm_place=placement,
                norm_weights=weighted, norm_over=norm_over, inplace=inplace,
                write_k=write_k, dtype=str(dtype), cache_dtype=str(k_cache.dtype), scales_mode=scales_mode,
                kv_cache_dtype=kwargs.get("kv_cache_dtype"), rows=rows, paged=paged,
                cache_shape=tuple(k_cache.shape), engine_cache=engine, kv_layout=kv_layout, five_d=five_d,
                address=address, page_table={n: addressing[n].tolist() for n in PAGE_TABLE if n in addressing},
                slots=slots, slot_mapping=mapped,
                cache_offsets=None if paged else offsets, positions=None if positions is None else raw.tolist(),
                check_mode=check_mode, cache_requires_grad=grad_cache, angles=by_angles,
                nope_temperature=list(angle_kwargs["nope_temperature"]) if nope else None, nope_misuse=misuse,
                scale=angle_kwargs.get("scale"), mrope_section=angle_kwargs.get("mrope_section"),
                mrope_interleaved=angle_kwargs.get("mrope_interleaved"),
                q_dtype=None if "q_dtype" not in kwargs else str(kwargs["q_dtype"]),
                q_scale=None if kwargs.get("q_scale") is None else kwargs["q_scale"].detach().cpu().tolist())
    tensors = dict(q=q, k=k, v=v, cos=cos, sin=sin, positions=positions, cu_seqlens=cu, k_cache=k_cache,
                   v_cache=v_cache, **{n: kwargs.get(n) for n in ("slot_mapping", "cache_offsets", "k_scale",
                                                                  "v_scale", "q_weight", "k_weight", "k_scale_cache",
                                                                  "v_scale_cache", "inv_freq", "q_scale") + PAGE_TABLE})
    tensors = {n: t for n, t in tensors.items() if isinstance(t, torch.Tensor)}
    writes = {n: tensors[n] for n in written}
    aliased, spans = pool_overlaps(arena, spec, writes, {n: t for n, t in tensors.items() if n not in writes})
    overlap = inplace and (self_overlapping(q) or (write_k and self_overlapping(k)))
    # (table-free angles and a NoPE layer, which reads no table: check mode refuses negative positions only)
    why_raise = refusals(check_mode, pos, 2**62 if by_angles or nope else rows, mapped, n_slots, overlap,
                         outside) + aliased
    why_raise += (table_refusals if check_mode else []) + angle_why + q_why + nope_why
    if check_mode and mrope and not by_angles and bool(((raw < 0) | (raw >= rows)).any()) and \
            not any(why.startswith("check mode: positions") for why in why_raise):
        either.append("check mode: an M-RoPE id outside the table on an axis no pair reads")
    elif check_mode and mrope and by_angles and bool((raw < 0).any()) and not bool((pos < 0).any()):
        either.append("check mode: a negative M-RoPE id on an axis no pair reads")
    if grad_cache:
        why_raise.append("a cache that requires grad")
    expect = RAISE if why_raise else MATCH
    for name in written:
        arena.allow_writes(tensors[name])
    if tokens == 0:
        either.append("no tokens")
    if spans:
        either.append("byte spans that meet, elements apart")

    logical = {name: t.detach().cpu().clone() for name, t in tensors.items() if name in ("q", "k", "v", "cos", "sin")}
    weights = {name: kwargs[name].detach().cpu() for name in ("q_weight", "k_weight") if name in kwargs}
    caches_before = [as_fp8(c.detach().cpu().clone(), cache_dtype) for c in (k_cache, v_cache)]
    scale_caches = [kwargs[n] for n in ("k_scale_cache", "v_scale_cache")] if dynamic else [None, None]
    scale_caches_before = [None if c is None else c.detach().cpu().clone() for c in scale_caches]
    static = [kwargs[n].detach().cpu().to(torch.float64).reshape(-1, 1) for n in ("k_scale", "v_scale")] \
        if quantised and (nvfp4 or not dynamic) else [None, None]
    spec["scales"] = [None if t is None else t.flatten().tolist() for t in static]

    def rotated(name: str) -> torch.Tensor:  # in the tokens' layout: (batch, seq, heads, dim) or (tokens, ...)
        x = to_tokens(logical[name], layout)
        if nope:  # nothing rotates: q times its token's temperature, k as it is
            return ref.nope_temperature(x, pos, floor_scale, attn_scale) if name == "q" else x

        def normed(x):
            return ref.rms_norm(x, weights.get(name + "_weight"), eps=eps, weight_offset=weight_offset,
                                over_heads=norm_over == "heads") if norm else x

        x = normed(x) if placement != "after" else x
        table = (angle_rows(kwargs["inv_freq"], pos, rotary_dim // 2, kwargs["scale"], per_pair=mrope) if by_angles
                 else table_rows(logical, pos, rows, per_pair=mrope))
        turned = ref.rotate_pairs(x[..., :rotary_dim], table[0][..., None, :], table[1][..., None, :],
                                  interleaved=interleaved)
        x = torch.cat((turned, x[..., rotary_dim:]), -1)
        return normed(x) if placement == "after" else x

    def check(result) -> list[str]:
        q_out, k_out = result
        problems = []
        for name, out, x in (("q", q_out, q), ("k", k_out, k)):
            if name == "k" and not write_k:
                problems += [] if k_out is None else ["returned a rotated k without write_k"]
                continue
            if inplace and out is not x:
                problems.append(f"in place, but the returned {name} is not {name}")
            if name == "q" and q_float8:  # within one float8 spacing of the reference / q_scale, saturating
                if out.dtype != kwargs["q_dtype"] or out.shape != q.shape:
                    problems.append(f"q: a {out.dtype} {tuple(out.shape)} output, not {kwargs['q_dtype']} "
                                    f"{tuple(q.shape)}")
                    continue
                got = out.detach().cpu().reshape(-1, head_dim)
                problems += cache_problems("q (float8)", got, got, from_tokens(rotated("q"), layout).reshape(
                    -1, head_dim), list(range(got.shape[0])), float(kwargs["q_scale"]), False)
                continue
            if name == "k" and nope:  # a NoPE layer passes k through: its output holds k's own bits
                if not same_bits(out, logical["k"]):
                    problems.append("k: not k's own values (a NoPE layer passes k through)")
                continue
            message = check_close_to_reference(out, from_tokens(rotated(name), layout))
            if message is not None:
                problems.append(f"{name}: {message}")
        for i, (name, cache, before, want, exact) in enumerate((
                ("k_cache", k_cache, caches_before[0], rotated("k"), nope),  # (NoPE: k stored as v is)
                ("v_cache", v_cache, caches_before[1], to_tokens(logical["v"], layout), True))):
            want = want.reshape(tokens, *cache.shape[2:-1], want.shape[-1])
            scale = static[i]
            if nvfp4:  # the reader: e2m1 x the block scale at the token's slot x the global scale
                blocks = scale_caches[i].detach().cpu().view(torch.uint8)
                blocks = (blocks.transpose(1, 2) if kv_layout == "HND" else blocks).reshape(n_slots, hk, -1)
                before_blocks = scale_caches_before[i].view(torch.uint8)
                before_blocks = before_blocks.transpose(1, 2) if kv_layout == "HND" else before_blocks
                problems += nvfp4_problems(name, cache.detach().cpu().reshape(n_slots, hk, -1),
                                           before.reshape(n_slots, hk, -1), blocks,
                                           before_blocks.reshape(n_slots, hk, -1), want, slots, float(scale))
                continue
            if dynamic:  # the reader finds each token's scales at its slot
                scales_after = scale_caches[i].detach().cpu().reshape(n_slots, hk)
                problems += scale_problems(name[0] + "_scale_cache", scales_after,
                                           scale_caches_before[i].reshape(n_slots, hk), want, slots, cache_dtype,
                                           exact)
                scale = lambda at, scales_after=scales_after: scales_after[at].to(torch.float64)[..., None]  # noqa
            flat = as_fp8(cache.detach().cpu(), cache_dtype).reshape(n_slots, *cache.shape[2:])
            problems += cache_problems(name, flat, before.reshape(n_slots, *cache.shape[2:]), want, slots, scale,
                                       exact)
        return problems

    return Case("rope_and_cache", spec, arena,
                lambda: ropekit.rope_and_cache(q, k, v, cos, sin, **kwargs), check,
                expect=EITHER if expect == MATCH and either else expect, why_raise="; ".join(why_raise),
                overlap=overlap or {"q", "k"} <= set(spec.get("overlap", "").split(" over ")),
                inplace_targets=[t for t in ((q, k) if write_k else (q,)) if inplace and t.numel()],
                env={"ROPEKIT_CHECK": "1" if check_mode else "0"}, tensors=tensors)


def _draw_q_output(rng: random.Random, arena: Arena, kwargs: dict, how: str, dtype: torch.dtype,
                   inplace: bool) -> tuple[list, bool]:
    """rope_and_cache's q output (``q_dtype``, ``q_scale`` into ``kwargs``): q's own dtype (``"own"``: not passed;
    ``"explicit"``: passed), a float8 one at a one-element float32 ``q_scale`` (``"float8"``; in place refused), or
    (``"hostile"``) one of: no ``q_scale``, a ``q_scale`` without a float8 ``q_dtype``, an int8 ``q_dtype``, a
    ``q_scale`` of another dtype or of two elements. Returns why the call must raise, and whether q is float8."""
    why = []
    if how == "explicit":
        kwargs["q_dtype"] = dtype
        return why, False
    if how == "own":
        return why, False
    kwargs["q_dtype"] = rng.choice((FP8, E5M2))
    size, scale_dtype = 1, torch.float32
    if how == "hostile":
        wrong = rng.choice(("no q_scale", "q_scale without q_dtype", "an int8 q_dtype", "a float16 q_scale",
                            "a q_scale of two elements"))
        why.append(wrong)
        if wrong == "no q_scale":
            return why, True
        if wrong == "q_scale without q_dtype":
            del kwargs["q_dtype"]
        elif wrong == "an int8 q_dtype":
            kwargs["q_dtype"] = INT8
        elif wrong == "a float16 q_scale":
            scale_dtype = torch.float16
        else:
            size = 2
    elif inplace:
        why.append("a float8 q output in place")
    value = rng.choice((0.05, 1.0, 2.0))
    kwargs["q_scale"] = arena.place("q_scale", (size,), scale_dtype, values=lambda s: torch.full(s, value))
    return why, "q_dtype" in kwargs


def draw_mla_rope_and_cache(rng: random.Random, gen: torch.Generator, device) -> Case:
    """``mla_rope_and_cache``: q_pe (tokens, heads, rope_dim) and the shared k_pe (tokens, rope_dim) rotated, the row
    ``[kv_c | rotated k_pe]`` written at each token's slot of a paged latent cache (float8 with one scale, as bytes
    at times, or the activations' dtype; drawn as engines allocate it); half-width tables or the engines'
    ``cos_sin_cache``; float8 e4m3 or e5m2, named by vLLM's ``kv_cache_dtype`` at times; positions longer than the
    tokens and slot mappings shorter at times; GPT-J or NeoX pairing;
    in place (the engines' contract) or not; the two caches ``(ckv_cache, kpe_cache)`` instead of one at times, and
    FlashInfer's page table instead of the slot mapping; a cache that requires grad; and, in a share of the cases, a
    written tensor and another of the call carved from one byte pool (on each other's bytes, or apart). In
    :data:`_MLA_ANGLES_SHARE` of the cases no table: the angles computed from ``inv_freq`` (float32 or float64, any
    view, plain or YaRN's frequencies, longer than rope_dim / 2 at times) times ``scale``, at positions up to 10^7;
    rarely with a table as well, too short, or a scale with a table and no inv_freq (each refused by name). In about
    12 % DeepSeek-V3.2's fp8_ds_mla entry (``kv_cache_dtype="fp8_ds_mla"``; :func:`_ds_tiles`,
    :func:`_ds_mla_cache`): one uint8 cache of random bytes, kv_c in e4m3 tiles at scales computed on write (tiles of
    unlike magnitudes, past 448, all zeros or tiny), the rotated k_pe in the model's dtype; rarely the pair form, an
    entry of another size, a latent that is not whole tiles, a float8 cache, unaligned entries or a misspelt name (each
    refused by name)."""
    arena = Arena(rng, gen, device)
    either = []
    tokens, heads, rope_dim, latent = rng.randint(0, 6), rng.randint(1, 4), rng.choice((8, 16)), rng.choice((8, 32))
    interleaved, inplace = rng.random() < 0.7, rng.random() < 0.6
    pooled = rng.random() < _POOL_PROBABILITY
    dtype = rng.choices(DTYPES, weights=(4, 3, 2, 1))[0]
    # one draw: a float8 cache below the quantised share, the fp8_ds_mla entry in the band above it
    cache_draw, quantised_share = rng.random() if dtype != torch.float64 else 1.0, 0.5 if pooled else 0.3
    quantised, ds = cache_draw < quantised_share, quantised_share <= cache_draw < quantised_share + _DS_SHARE
    ds_misuse = pick(rng, _DS_MISUSES) if ds else None
    if ds:  # (the model's dtype, the entry's widths: drawn again, past what every other case draws)
        dtype, rope_dim = pick(rng, _DS_DTYPES), rng.choice(_DS_ROPE_DIMS)
        latent = rng.choice(_DS_NOT_TILES if ds_misuse == "not whole tiles" else _DS_LATENTS)
    cache_dtype = torch.uint8 if ds else rng.choice((FP8, FP8, E5M2)) if quantised else dtype
    float8 = cache_dtype in (FP8, E5M2)
    hostile, check_mode = not pooled and rng.random() < 0.25, not pooled and rng.random() < 0.2
    rows, block_size, num_blocks = rng.randint(1, 12), rng.choice((1, 2, 4)), rng.randint(1, 4)
    # where the angles come from (the engines' cos_sin_cache, half-width cos/sin, or inv_freq: no table): one draw,
    # so that a table case's draws after it stay each seed's
    source, extra_positions = rng.random(), rng.choice((0, 0, 0, 2))
    engines_table, by_angles = source < 0.3, source >= 1 - _MLA_ANGLES_SHARE
    short = tokens and rng.random() < 0.2
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    separate, by_table = rng.random() < 0.4, rng.random() < 0.4
    separate = separate and not ds  # (the entry is one cache: the pair form is one of its misuses)
    misuse = pick(rng, _MLA_ANGLE_MISUSES) if by_angles else None
    if misuse == "cos_sin_cache":
        engines_table = True
    elif misuse == "scale with a table":
        engines_table = rng.random() < 0.3
    with_inv_freq = by_angles and misuse != "scale with a table"
    with_tables = not by_angles or misuse in ("cos_sin_cache", "cos/sin", "scale with a table")
    caches_named = ["ckv_cache", "kpe_cache"] if separate else ["kv_cache"]
    written = caches_named + (["q_pe", "k_pe"] if inplace else [])
    read = ["q_pe", "k_pe", "kv_c", "positions"] + (list(PAGE_TABLE) if by_table else ["slot_mapping"]) + (
        (["cos_sin_cache"] if engines_table else ["cos", "sin"]) if with_tables else []) + (
        ["inv_freq"] if with_inv_freq else [])
    read += ["kv_cache_scale"] if float8 else []
    pool = ()
    if pooled:  # (q_pe, k_pe and kv_c drawn twice as often)
        writer = rng.choice(written)
        pool = (writer, rng.choice([n for n in read + read[:3] if n != writer]))
        arena.share(*pool, apart=rng.random() < 0.25)
    q_pe = arena.place("q_pe", (tokens, heads, rope_dim), dtype, pick(rng, INPUT_KINDS))
    k_pe = arena.place("k_pe", (tokens, rope_dim), dtype, pick(rng, INPUT_KINDS))
    tile_kinds, latent_values = _ds_tiles(rng, gen, tokens, latent, dtype) if ds else ([], None)
    kv_c = arena.place("kv_c", (tokens, latent), dtype, pick(rng, INPUT_KINDS), latent_values)
    cos = sin = None
    tables = {}
    if with_tables and engines_table:
        cos_sin_cache = arena.place("cos_sin_cache", (rows, rope_dim), rng.choice((table_dtype, dtype)),
                                    pick(rng, INPUT_KINDS))
        cos, sin = cos_sin_cache[:, :rope_dim // 2], cos_sin_cache[:, rope_dim // 2:]
        tables = dict(cos_sin_cache=cos_sin_cache)
    elif with_tables:
        cos = arena.place("cos", (rows, rope_dim // 2), table_dtype, pick(rng, INPUT_KINDS))
        sin = arena.place("sin", (rows, rope_dim // 2), table_dtype, pick(rng, INPUT_KINDS))
        tables = dict(cos=cos, sin=sin)
    angle_kwargs, angle_why, frequencies = {}, [_MLA_ANGLE_WHY[misuse]] if misuse not in (None, "valid") else [], None
    if with_inv_freq:
        angle_kwargs, frequencies = _draw_mla_angles(rng, arena, rope_dim // 2, misuse == "short", angle_why)
    elif misuse == "scale with a table":
        angle_kwargs = dict(scale=rng.choice((0.5, 2.0)))
    # the table-free angles read no table: their positions reach past any table's rows
    top = rng.choice((rows - 1,) + _ANGLE_POSITION_TOPS) if by_angles else rows - 1
    positions = arena.place("positions", (tokens + extra_positions,), rng.choice((torch.int64, torch.int32)),
                            pick(rng, INDEX_KINDS), position_values(gen, 0, top, hostile, rows))
    if ds:  # one uint8 entry a slot (a misuse: a float8 view of it, unaligned, of another size)
        kv_cache, engine, entry = _ds_mla_cache(arena, rng, gen, num_blocks, block_size, latent, rope_dim, dtype,
                                                ds_misuse, "kv_cache" in pool)
        latent_cache = rope_cache = kv_cache
    elif separate:  # FlashInfer's: kv_c's and k_pe's caches apart
        (ckv_cache,), engine, _ = engine_caches(arena, "ckv_cache", (num_blocks, block_size, latent), cache_dtype)
        (kpe_cache,), _, _ = engine_caches(arena, "kpe_cache", (num_blocks, block_size, rope_dim), cache_dtype)
        kv_cache, latent_cache, rope_cache = (ckv_cache, kpe_cache), ckv_cache, kpe_cache
    else:
        (kv_cache,), engine, _ = engine_caches(arena, "kv_cache", (num_blocks, block_size, latent + rope_dim),
                                               cache_dtype)
        latent_cache, rope_cache = kv_cache[..., :latent], kv_cache[..., latent:]
    n_slots = num_blocks * block_size
    if by_table:
        address, slots, table_refusals = draw_page_table(arena, rng, tokens, num_blocks, block_size, hostile,
                                                         repeat=check_mode and rng.random() < 0.3)
        mapped, slot_mapping = [], None
    else:
        mapped = draw_slots(rng, tokens, n_slots, hostile, repeat=check_mode and rng.random() < 0.3)
        if short:
            mapped = mapped[:rng.randrange(tokens)]
        slots = mapped + [-1] * (tokens - len(mapped))
        slot_mapping = arena.place("slot_mapping", (len(mapped),), torch.int64, pick(rng, INDEX_KINDS),
                                   lambda shape: torch.tensor(mapped, dtype=torch.int64).reshape(shape))
        address, table_refusals = dict(slot_mapping=slot_mapping), []
    # (the entry's scales are its own: a kv_cache_scale given beside it, at times, is accepted and not read)
    scale = (arena.place("kv_cache_scale", (1,), torch.float32, values=lambda s: torch.full(s, rng.choice(
        (0.05, 1.0, 2.0)))) if float8 or (ds and rng.random() < 0.3) else None)
    # vLLM's kv_cache_dtype names at times (a uint8 cache of e5m2 bytes is named by it)
    if ds:
        kv_cache_dtype = rng.choice(_DS_MISSPELT) if ds_misuse == "misspelt" else "fp8_ds_mla"
    elif torch.uint8 in (latent_cache.dtype, rope_cache.dtype) and cache_dtype == E5M2:
        kv_cache_dtype = "fp8_e5m2"
    else:
        kv_cache_dtype = rng.choice({FP8: (None, "auto", "fp8", "fp8_e4m3"), E5M2: (None, "auto", "fp8_e5m2"),
                                     torch.bfloat16: (None, "auto", "bfloat16"),
                                     torch.float16: (None, "auto", "float16")}.get(cache_dtype, (None, "auto")))
    grad_cache = not pooled and cache_dtype == dtype and rng.random() < 0.05
    if grad_cache:
        (kpe_cache if separate else kv_cache).requires_grad_()

    pos = positions.detach().cpu().to(torch.int64)[:tokens]
    spec = dict(op="mla_rope_and_cache", tokens=tokens, heads=heads, rope_dim=rope_dim, latent=latent,
                interleaved=interleaved, inplace=inplace, dtype=str(dtype), cache_dtype=str(rope_cache.dtype),
                rows=rows, cache_shape=tuple(latent_cache.shape[:2]), engine_cache=engine, separate=separate,
                page_table={n: address[n].tolist() for n in PAGE_TABLE if n in address}, slots=slots,
                slot_mapping=mapped, positions=positions.detach().cpu().tolist(), engines_table=engines_table,
                check_mode=check_mode, cache_requires_grad=grad_cache, kv_cache_dtype=kv_cache_dtype,
                angles=by_angles, angle_misuse=misuse, frequencies=frequencies,
                inv_freq=None if not with_inv_freq else dict(
                    dtype=str(angle_kwargs["inv_freq"].dtype), shape=tuple(angle_kwargs["inv_freq"].shape),
                    values=angle_kwargs["inv_freq"].detach().cpu().to(torch.float64).reshape(-1).tolist()),
                angle_scale=angle_kwargs.get("scale"), ds_misuse=ds_misuse,
                ds=None if not ds else dict(entry=entry, tiles=tile_kinds, cache_strides=tuple(kv_cache.stride()),
                                            cache_storage_offset=kv_cache.storage_offset()))
    # the entry's pair form: the one cache's bytes split where kv_c's end
    cache_arg = (kv_cache[..., :latent], kv_cache[..., latent:]) if ds_misuse == "pair" else kv_cache
    tensors = dict(q_pe=q_pe, k_pe=k_pe, kv_c=kv_c, positions=positions, **dict(zip(caches_named, (
        (ckv_cache, kpe_cache) if separate else (kv_cache,)))), **address, **tables,
        **({} if scale is None else dict(kv_cache_scale=scale)),
        **({"inv_freq": angle_kwargs["inv_freq"]} if with_inv_freq else {}))
    writes = {n: tensors[n] for n in written}
    aliased, spans = pool_overlaps(arena, spec, writes, {n: t for n, t in tensors.items() if n not in writes})
    overlap = inplace and (self_overlapping(q_pe) or self_overlapping(k_pe))
    # (table-free angles: check mode refuses negative positions only)
    why_raise = refusals(check_mode, pos, 2**62 if with_inv_freq else rows, mapped, n_slots, overlap) + aliased
    why_raise += (table_refusals if check_mode else []) + angle_why
    why_raise += [_DS_WHY[ds_misuse]] if ds_misuse not in (None, "valid") else []
    if grad_cache:
        why_raise.append("a cache that requires grad")
    expect = RAISE if why_raise else MATCH
    for name in written:
        arena.allow_writes(tensors[name])
    if tokens == 0:
        either.append("no tokens")
    if spans:
        either.append("byte spans that meet, elements apart")
    logical = {name: t.detach().cpu().clone() for name, t in (("q_pe", q_pe), ("k_pe", k_pe), ("kv_c", kv_c),
                                                               ("cos", cos), ("sin", sin)) if t is not None}
    if ds:  # the entries' bytes, one row a slot
        before = [kv_cache.detach().cpu().view(torch.uint8).clone().reshape(n_slots, -1)]
    else:
        before = [as_fp8(c.detach().cpu().clone(), cache_dtype).reshape(n_slots, -1)
                  for c in (latent_cache, rope_cache)]
    scale_value = None if scale is None else float(scale)
    spec["scale"] = scale_value

    def rotated(name: str) -> torch.Tensor:  # (tokens, ..., rope_dim) rotated at each token's position
        x = logical[name].to(torch.float64)
        table = (angle_rows(angle_kwargs["inv_freq"], pos, rope_dim // 2, angle_kwargs["scale"]) if with_inv_freq
                 else table_rows(logical, pos, rows))
        shape = (tokens,) + (1,) * (x.ndim - 2) + (rope_dim // 2,)
        return ref.rotate_pairs(x, table[0].reshape(shape), table[1].reshape(shape), interleaved=interleaved)

    def check(result) -> list[str]:
        q_out, k_out = result
        problems = []
        if inplace and (q_out.data_ptr() != q_pe.data_ptr() or k_out.data_ptr() != k_pe.data_ptr()):
            problems.append("in place, but the returned tensors are not q_pe and k_pe")
        for name, got in (("q_pe", q_out), ("k_pe", k_out)):
            message = check_close_to_reference(got, rotated(name))
            if message is not None:
                problems.append(f"{name}: {message}")
        if ds:
            return problems + _ds_mla_problems(kv_cache.detach().cpu().reshape(n_slots, -1), before[0],
                                               logical["kv_c"], rotated("k_pe"), slots, dtype)
        after = [as_fp8(c.detach().cpu(), cache_dtype).reshape(n_slots, -1) for c in (latent_cache, rope_cache)]
        names = ("ckv_cache", "kpe_cache") if separate else ("kv_cache (latent part)", "kv_cache (rope part)")
        problems += cache_problems(names[0], after[0], before[0], logical["kv_c"].to(torch.float64), slots,
                                   scale_value, True)
        problems += cache_problems(names[1], after[1], before[1], rotated("k_pe"), slots, scale_value, False)
        return problems

    return Case("mla_rope_and_cache", spec, arena,
                lambda: ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, cache_arg, slot_mapping, positions,
                                                   interleaved=interleaved, inplace=inplace, kv_cache_scale=scale,
                                                   **{n: t for n, t in address.items() if n != "slot_mapping"},
                                                   **tables, **angle_kwargs, **({} if kv_cache_dtype is None else
                                                                                dict(kv_cache_dtype=kv_cache_dtype))),
                check, expect=EITHER if expect == MATCH and either else expect, why_raise="; ".join(why_raise),
                overlap=overlap or {"q_pe", "k_pe"} <= set(spec.get("overlap", "").split(" over ")),
                inplace_targets=[t for t in ((q_pe, k_pe) if inplace else ()) if t.numel()],
                env={"ROPEKIT_CHECK": "1" if check_mode else "0"}, tensors=tensors)


def _draw_mla_angles(rng: random.Random, arena: Arena, pairs: int, short: bool, why: list) -> tuple[dict, str]:
    """mla_rope_and_cache's table-free angles: ``inv_freq`` of ``pairs`` frequencies (a few more at times: the kernel
    reads the first ``pairs``; fewer when ``short``: refused) and ``scale``. Plain frequencies come from
    :func:`~ropekit.reliability.rope_args.draw_angles` (with its refusals, appended to ``why``); YaRN's
    (:data:`_YARN_CONFIGS`, from :func:`ropekit.rope_init`) are float32 or float64 in any view, scaled by YaRN's
    attention factor or one of :data:`ANGLE_SCALES`. Returns the keyword arguments and which frequencies."""
    columns = rng.randint(1, pairs - 1) if short else pairs + (rng.randint(1, 3) if rng.random() < 0.3 else 0)
    if rng.random() >= _YARN_SHARE:
        inv_freq, scale, drawn_why = draw_angles(rng, arena, columns)
        why += drawn_why
        return dict(inv_freq=inv_freq, scale=scale), "plain"
    # (rope_init computes them for 2 * columns channels: all <= 1, as the kernel's exact angle reduction needs)
    freqs, attention_factor = ropekit.rope_init(rng.choice(_YARN_CONFIGS), 2 * columns)
    inv_freq = arena.place("inv_freq", (columns,), rng.choice((torch.float32, torch.float64)), pick(rng, INPUT_KINDS),
                           lambda core: freqs[:math.prod(core)].reshape(core))
    scale = float(attention_factor) if rng.random() < 0.5 else rng.choice(ANGLE_SCALES)
    return dict(inv_freq=inv_freq, scale=scale), "yarn"


def _ds_tiles(rng: random.Random, gen: torch.Generator, tokens: int, latent: int,
              dtype: torch.dtype) -> tuple[list, Callable]:
    """kv_c for the fp8_ds_mla entry: each token's tiles of 128 channels of one of :data:`_DS_TILES` (fp16 holds no
    tiny values), uniform in ``[-m, m]`` at a magnitude ``m`` log-uniform in the kind's range (past 448: up to 6e4
    in fp16, 10^6 else); a tiny tile's values log-uniform in ``[2^-126, 447 x 2^-126)``, either sign. Returns the
    kinds (a list a token) and the values for the placed view's distinct elements."""
    tiles = -(-latent // ref.DS_MLA_TILE)
    kinds = [[pick(rng, _DS_TILES if dtype != torch.float16 else _DS_TILES[:-1]) for _ in range(tiles)]
             for _ in range(tokens)]
    # log10 of the magnitudes' range (a zero tile: magnitude 0; a tiny one: its own values below)
    exponents = {"spread": (-4.0, 3.0), "past 448": (math.log10(500), math.log10(6e4 if dtype == torch.float16
                                                                                else 1e6))}

    def values(core: tuple) -> torch.Tensor:  # core: (tokens, latent), 1 where the view is expanded
        n, width = core
        where = torch.rand(n, tiles, generator=gen, dtype=torch.float64)
        magnitude = torch.zeros(n, tiles, dtype=torch.float64)
        for i, row in enumerate(kinds[:n]):
            for j, kind in enumerate(row):
                if kind in exponents:
                    low, high = exponents[kind]
                    magnitude[i, j] = 10.0 ** (low + (high - low) * float(where[i, j]))
        magnitude = magnitude.repeat_interleave(ref.DS_MLA_TILE, 1)
        spread = torch.rand(n, width, generator=gen, dtype=torch.float64).mul(2).sub(1)
        tiny = torch.tensor([[kind == "tiny" for kind in row] for row in kinds[:n]]).repeat_interleave(
            ref.DS_MLA_TILE, 1)[:, :width]
        small = spread.sign() * 2.0**-126 * 447.0 ** spread.abs()  # (normal in bf16 and float32)
        return torch.where(tiny, small, spread * magnitude[:, :width])

    return kinds, values


def _ds_mla_cache(arena: Arena, rng: random.Random, gen: torch.Generator, num_blocks: int, block_size: int,
                  latent: int, rope_dim: int, dtype: torch.dtype, misuse: str, pooled: bool) -> tuple:
    """The fp8_ds_mla ``kv_cache (num_blocks, block_size, entry)`` of random bytes: the uint8 view of 4-byte words
    (every entry, and the scales in it, at a multiple of 4 bytes), as engines allocate it (padded rows, blocks a step
    apart; in a byte pool when ``pooled``, whose bytes are random already). For a misuse: an entry of another size,
    entries off 4-byte alignment (the storage offset, or rows a stride apart that is no multiple of 4), or a float8
    view of the bytes. Returns the cache, what was drawn, and the entry's right size in bytes."""
    tile = ref.DS_MLA_TILE
    entry = latent + 4 * (latent // tile) + rope_dim * dtype.itemsize
    how = dict(pad=rng.choice((0, 0, 0, 4)), step=rng.choice((1, 1, 1, 2)), kind=pick(rng, CACHE_KINDS), entry=entry)
    if misuse == "entry size":  # (each a multiple of 4: only the size is wrong) the model-dtype latent cache's
        # row, a word more or less, k_pe in the other width of float
        how["entry"] = rng.choice(sorted({(latent + rope_dim) * dtype.itemsize, entry + 4, entry - 4,
                                          entry + rope_dim * (6 - 2 * dtype.itemsize)} - {entry}))
    elif misuse == "unaligned":
        how.update(unaligned=rng.choice(("storage offset", "row stride")), shift=rng.randint(1, 3))
    blocks, size = num_blocks * how["step"], how["entry"]
    if how.get("unaligned") == "row stride":  # contiguous uint8 rows size + shift bytes apart
        cache = arena.place("kv_cache", (blocks, block_size, size + how["shift"]), torch.uint8)[::how["step"], :, :size]
    else:
        words = size // 4 + (how.get("unaligned") == "storage offset")
        random_words = None if pooled else (lambda core: torch.randint(
            0, 256, (*core[:-1], 4 * core[-1]), generator=gen, dtype=torch.uint8).view(torch.int32))
        whole = arena.place("kv_cache", (blocks, block_size, words + how["pad"]), torch.int32, how["kind"],
                            random_words)
        cache = whole[::how["step"], :, :words].view(torch.uint8)
        if how.get("unaligned") == "storage offset":
            cache = cache[..., how["shift"]:how["shift"] + size]
    if misuse == "float8 cache":
        cache = cache.view(rng.choice((FP8, E5M2)))
    return cache, how, entry


def _ds_mla_problems(after: torch.Tensor, before: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                     slots: list[int], dtype: torch.dtype) -> list[str]:
    """DeepSeek's fp8_ds_mla entries, one row of bytes a slot (CPU uint8): every slot no token names bitwise
    unchanged; each written one's e4m3 values and float32 tile scales those of :func:`ropekit.reference.ds_mla_entry`
    bit for bit (``kv_c``: the tokens' values in the model's dtype, as float64), its k_pe within ``dtype``'s bound of
    the float64 rotation ``k_pe`` (one row a token)."""
    name, latent = "kv_cache (fp8_ds_mla)", kv_c.shape[-1]
    at = latent + 4 * (latent // ref.DS_MLA_TILE)
    valid = [(t, s) for t, s in enumerate(slots) if 0 <= s < after.shape[0]]
    untouched = torch.ones(after.shape[0], dtype=torch.bool)
    untouched[[s for _, s in valid]] = False
    problems = [] if same_bits(after[untouched], before[untouched]) else [f"{name}: a slot no token names changed"]
    if not valid:
        return problems
    tokens = [t for t, _ in valid]
    got = after[[s for _, s in valid]]
    want = ref.ds_mla_entry(kv_c[tokens].to(torch.float64), k_pe[tokens], dtype)
    if not torch.equal(got[:, latent:at], want[:, latent:at]):
        problems.append(f"{name}: tile scales not max|kv_c| / 448 of their 128-channel tile (floored at 2^-126)")
    if not torch.equal(got[:, :latent], want[:, :latent]):
        problems.append(f"{name}: e4m3 values not the format's rounding of kv_c / their tile's scale")
    message = check_close_to_reference(got[:, at:].contiguous().view(dtype), k_pe[tokens])
    if message is not None:
        problems.append(f"{name}, k_pe: {message}")
    return problems


TARGETS = {name: draw for name, draw in (("rope_and_cache", draw_rope_and_cache),
                                         ("mla_rope_and_cache", draw_mla_rope_and_cache)) if hasattr(ropekit, name)}
