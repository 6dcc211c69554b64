"""Compile the kernels a workload would launch for sm_90, on a machine without a GPU: catches what the interpreter
cannot (type errors of the compiler, unsupported constructs) before device time is spent.

    python tools/compile_sm90.py            # every rope and fused kernel variant the small matrices below plan,
                                            # and the course ladder's eight steps

The kernels are decorated for a GPU (``torch.cuda.is_available`` is answered True while ropekit is imported),
planned on empty CPU tensors through the public launcher (the ladder's launcher calls Triton's entry point, which is
intercepted instead), and each planned launch is compiled by Triton's own compiler for an H100 target, with the
16-byte alignment hints a GPU launch specialises on. Its SASS is checked for reads of the stack pointer as a value
(:func:`stack_pointer_reads`: a ptxas miscompile). Prints one line a variant; exits 1 on the first failure.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
_available = torch.cuda.is_available
torch.cuda.is_available = lambda: True
import ropekit  # noqa: E402
from ropekit.positions import resolve_positions  # noqa: E402
from ropekit.triton import fused, launch  # noqa: E402
from ropekit.triton import fused_tiles as tiles  # noqa: E402
torch.cuda.is_available = _available

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
          torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.int8: "i8"}


def _leaf(value, path, constants):
    if value is None or type(value) is str:
        constants[path] = value
        return "constexpr"
    if isinstance(value, torch.Tensor):
        return "*" + _TYPES[value.dtype]
    if type(value) is bool:
        constants[path] = value
        return "constexpr"
    if type(value) is int:
        if value == 1:
            constants[path] = 1
            return "constexpr"
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if type(value) is float:
        return "fp32"
    if isinstance(value, tuple):
        return tuple(_leaf(v, path + (i,), constants) for i, v in enumerate(value))
    raise TypeError(f"no signature type for {value!r}")


def _divisible(value, path, attrs):
    """The JIT's divisibility hints for one argument, as Triton specialises them on a GPU: a tensor whose data pointer
    is a multiple of 16 bytes, an int that is a multiple of 16 (other than 1)."""
    if (value.data_ptr() % 16 == 0 if isinstance(value, torch.Tensor) else
            type(value) is int and value != 1 and value % 16 == 0):
        attrs[path] = [["tt.divisibility", 16]]
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            _divisible(v, path + (i,), attrs)


def compile_record(record, hints: bool = False):
    """Triton's compiler on one recorded launch, for sm_90; returns the compiled kernel. ``hints``: with the JIT's
    divisibility hints (the code a GPU runs: its loads as wide as the alignment allows); without them, the most
    general code, which compiles whatever the addresses."""
    names = list(inspect.signature(record.kernel.fn).parameters)  # the kernel's order, whatever the plan's
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(names):
        value = record.arguments[name]
        if name in record.constexprs:
            signature[name] = "constexpr"
            constants[(i,)] = value
        else:
            signature[name] = _leaf(value, (i,), constants)
            if hints:
                _divisible(value, (i,), attrs)
    source = ASTSource(fn=record.kernel, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": record.num_warps})


def _cuobjdump(compiled, *flags: str) -> list[str]:
    """What the ``cuobjdump`` that ships with Triton (no GPU) prints of a compiled kernel's cubin, once a flag."""
    tools = Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        return [subprocess.run([tools / "cuobjdump", flag, cubin], capture_output=True, text=True, check=True).stdout
                for flag in flags]


def sass(compiled) -> tuple[int, str]:
    """A compiled kernel's registers a thread and its SASS."""
    text, usage = _cuobjdump(compiled, "-sass", "-res-usage")
    return int(re.search(r"REG:(\d+)", usage).group(1)), text


def stack_pointer_reads(compiled) -> list[str]:
    """The SASS lines of a compiled kernel that read ``R1`` as a value. ``R1`` is the stack pointer (the kernel's first
    instruction loads it); a kernel without local memory (no ``STL``/``LDL``) has no use for it, so reading it means
    ptxas took the register for a value it had not computed: how Triton 3.6's ptxas once miscompiled a float8 e5m2
    store (docs/tuning.md#fused-launch-table). An ``F2FP`` conversion may name it as the unused half of a padded
    pair, an undefined operand that ptxas gives any register."""
    (text,) = _cuobjdump(compiled, "-sass")
    if re.search(r"\b(STL|LDL)\b", text):
        return []
    return [line.strip() for line in text.splitlines()
            if re.search(r"\bR1\b", line) and not re.search(r"\bLDC R1, c\[0x0\]\[0x28\]", line)
            and not re.search(r"F2FP\.\S+ R\d+, R1\b", line)]


def _rope_calls():
    """A small matrix of apply_rope-shaped launches: tile (fused q+k, heads inner or neither), flat (paired or not), in
    place, strided, varlen, per-token rows, GPT-J, partial rotary, fp64, the conjugate, table-free angles, M-RoPE, NoPE."""
    meta = dict(device="cpu")
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        q = torch.empty(2, 64, 8, 128, dtype=dtype, **meta)
        k = torch.empty(2, 64, 2, 128, dtype=dtype, **meta)
        cos = torch.empty(4096, 64, **meta)
        spec = resolve_positions(batch=2, seqlen=64, positions=None)
        for config in (launch.TileConfig(2, 1, 16, fused_qk=True, evict_first=True), launch.TileConfig(1, 8, 4),
                       launch.TileConfig(1, 8, 4, evict_first=True, heads_inner=True),
                       launch.FlatConfig(2048, 8), launch.FlatConfig(512, 8, paired=True)):
            if type(config) is launch.FlatConfig and dtype == torch.float64:
                continue
            for kk in (k, None, torch.empty_like(q)):
                yield dict(q=q, k=kk, cos=cos, sin=cos, out_q=torch.empty_like(q),
                           out_k=None if kk is None else torch.empty_like(kk), positions=spec, rotary_dim=128,
                           config=config)
        offsets = torch.empty(2, dtype=torch.int64, **meta)
        by_offsets = resolve_positions(batch=2, seqlen=64, positions=offsets)
        tile = launch.TileConfig(1, 8, 4)
        yield dict(q=q, k=k, cos=cos, sin=cos, out_q=q, out_k=k, positions=by_offsets, rotary_dim=64, config=tile,
                   interleaved=True)
        strided = torch.empty(2, 64, 10, 128, dtype=dtype, **meta)[:, :, 1:9]
        yield dict(q=strided, k=k, cos=cos, sin=cos, out_q=torch.empty_like(q), out_k=torch.empty_like(k),
                   positions=by_offsets, rotary_dim=128, config=tile, conjugate=True)
        rows = torch.empty(2, 64, 128, dtype=dtype, **meta)
        yield dict(q=q, k=k, cos=rows, sin=rows, out_q=torch.empty_like(q), out_k=torch.empty_like(k),
                   positions=spec, rotary_dim=128, config=tile, cos_per_token=True, eager_rounding=True)
        cu = torch.empty(3, dtype=torch.int32, **meta)
        varlen = resolve_positions(batch=2, seqlen=100, positions=None, cu_seqlens=cu, max_seqlen=64)
        packed = torch.empty(100, 8, 128, dtype=dtype, **meta)
        yield dict(q=packed, k=None, cos=cos, sin=cos, out_q=torch.empty_like(packed), out_k=None, positions=varlen,
                   rotary_dim=128, config=tile)
        # table-free angles: float64 and (strided) float32 frequencies, a scale, every position form
        inv_freq = torch.empty(64, dtype=torch.float64, **meta)
        strided_freq = torch.empty(128, **meta)[::2]
        for freq, scale, where in ((inv_freq, 1.0, spec), (strided_freq, 0.75, by_offsets),
                                   (inv_freq, 1.0, resolve_positions(batch=2, seqlen=64, positions=torch.empty(
                                       2, 64, dtype=torch.int64, **meta)))):
            yield dict(q=q, k=k, cos=None, sin=None, out_q=torch.empty_like(q), out_k=torch.empty_like(k),
                       positions=where, rotary_dim=128, config=tile, inv_freq=freq, scale=scale)
        yield dict(q=q, k=k, cos=None, sin=None, out_q=q, out_k=k, positions=by_offsets, rotary_dim=64,
                   config=launch.TileConfig(2, 1, 16, fused_qk=True), interleaved=True, conjugate=True,
                   inv_freq=inv_freq[:32])
        yield dict(q=packed, k=None, cos=None, sin=None, out_q=torch.empty_like(packed), out_k=None,
                   positions=varlen, rotary_dim=128, config=tile, inv_freq=inv_freq)
        # M-RoPE: the pair's axis chosen in the kernel, contiguous and interleaved sections, (3, batch, seq) and
        # packed (3, tokens) ids, a table or table-free angles
        ids = torch.empty(3, 2, 64, dtype=torch.int64, **meta)
        contiguous = resolve_positions(batch=2, seqlen=64, positions=ids, mrope_section=(16, 24, 24))
        interleaved = resolve_positions(batch=2, seqlen=64, positions=ids[:, :1].int(), mrope_section=(24, 20, 20),
                                        mrope_interleaved=True)
        yield dict(q=q, k=k, cos=cos, sin=cos, out_q=torch.empty_like(q), out_k=torch.empty_like(k),
                   positions=contiguous, rotary_dim=128, config=launch.TileConfig(2, 1, 16, fused_qk=True))
        yield dict(q=q, k=k, cos=cos, sin=cos, out_q=q, out_k=k, positions=interleaved, rotary_dim=128, config=tile,
                   interleaved=True, conjugate=True)
        packed_ids = resolve_positions(batch=2, seqlen=100, positions=torch.empty(3, 100, dtype=torch.int64, **meta),
                                       cu_seqlens=cu, max_seqlen=64, mrope_section=(16, 24, 24))
        yield dict(q=packed, k=None, cos=cos, sin=cos, out_q=torch.empty_like(packed), out_k=None,
                   positions=packed_ids, rotary_dim=128, config=tile)
        yield dict(q=q, k=k, cos=None, sin=None, out_q=torch.empty_like(q), out_k=torch.empty_like(k),
                   positions=interleaved, rotary_dim=128, config=tile, inv_freq=inv_freq)
        # Llama 4's NoPE layer: q times its temperature, k copied out of place (untouched in place)
        for out_q, out_k, where, config in ((torch.empty_like(q), torch.empty_like(k), by_offsets, tile),
                                            (q, k, spec, launch.TileConfig(2, 1, 16, fused_qk=True))):
            yield dict(q=q, k=k, cos=None, sin=None, out_q=out_q, out_k=out_k, positions=where, rotary_dim=128,
                       config=config, nope=(8192, 0.1))


def _fused_calls():
    """A small matrix of the fused ops' launches: the forward with and without QK-norm (before the rotation, or
    after it with or without weights; per head or across all heads), paged and contiguous caches,
    bf16 and every quantising store (float8 e4m3/e5m2 bytes and int8; per-tensor, per-head and per-(token, head)
    scales; integer or the GPU's float8 conversion; NVFP4), a float8 q, v of another width (MLA's latent), GPT-J,
    partial rotary, in place, varlen; the backward in both ways of summing the weight gradient, in both launch
    orders."""
    meta = dict(device="cpu")
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.empty(2, 64, 8, 128, dtype=dtype, **meta)
        k, v = (torch.empty(2, 64, 2, 128, dtype=dtype, **meta) for _ in range(2))
        cos = torch.empty(4096, 64, **meta)
        weight = torch.empty(128, dtype=dtype, **meta)
        offsets = torch.empty(2, dtype=torch.int64, **meta)
        by_offsets = resolve_positions(batch=2, seqlen=64, positions=offsets)
        slots = torch.empty(128, dtype=torch.int64, **meta)
        scale, head_scales = torch.empty(1, **meta), torch.empty(2, **meta)
        token_head_scales = torch.empty(16, 16, 2, **meta)
        # the quantising stores: (cache dtype, (format, scales), the scales, whether the GPU converts to float8)
        stores = [(dtype, tiles.NO_QUANT[:2], None, False), (torch.uint8, (tiles.E4M3, tiles.PER_TENSOR), scale, False)]
        per_head, per_token_head = (tiles.PER_HEAD, head_scales), (tiles.PER_TOKEN_HEAD, token_head_scales)
        stores += [(torch.uint8, (fmt, scales), scale_tensor, native) for fmt in (tiles.E4M3, tiles.E5M2)
                   for scales, scale_tensor in (per_head, per_token_head) for native in (False, True)]
        stores += [(torch.int8, (tiles.INT8, scales), scale_tensor, native)
                   for scales, scale_tensor, native in ((tiles.PER_TENSOR, scale, False), (*per_token_head, False),
                                                        (*per_token_head, True))]
        for cache_dtype, quant, scales, native in stores:
            caches = dict(k_cache=torch.empty(16, 16, 2, 128, dtype=cache_dtype, **meta),
                          v_cache=torch.empty(16, 16, 2, 128, dtype=cache_dtype, **meta), quant=quant,
                          native=native)
            if scales is not None:
                caches.update(k_scale=scales, v_scale=scales)
            full = quant[1] == tiles.PER_TENSOR  # every norm and launch order for the stores already measured
            # (per (token, head), v's head blocks also in programs of their own: the model's decode choice there, and
            # at a prefill's tile)
            configs = (fused.FusedConfig(1, 8, 4), fused.FusedConfig(2, 8, 4, True, True)) if full else \
                (fused.FusedConfig(1, 8, 4),) + ((fused.FusedConfig(1, 8, 4, v_apart=True),
                                                  fused.FusedConfig(2, 16, 4, True, True, v_apart=True))
                                                 if quant[1] == tiles.PER_TOKEN_HEAD else ())
            for norm in (dict(), dict(q_weight=weight, k_weight=weight, eps=1e-6))[0 if full else 1:]:
                for config in configs:
                    yield dict(q=q, k=k, cos=cos, sin=cos, positions=by_offsets, rotary_dim=128,
                               out_q=torch.empty_like(q), v=v, cache_mode=fused.CACHE_PAGED, slots=slots,
                               block_size=16, cache_len=256, config=config, **caches, **norm)
            if not full:  # the address map with the stores of one scale a tensor: the others are the same map
                continue
            # FlashInfer's page table: int32 indices (as FlashInfer passes them) into an NHD cache, int64 into an
            # HND one (its strides)
            for index_dtype, hnd in ((torch.int32, False), (torch.int64, True)):
                table = tuple(torch.empty(n, dtype=index_dtype, **meta) for n in (128, 40, 3))
                paged = {name: (c.transpose(1, 2).contiguous().transpose(1, 2)
                                if hnd and isinstance(c, torch.Tensor) and c.ndim == 4 else c)
                         for name, c in caches.items()}
                yield dict(q=q, k=k, cos=cos, sin=cos, positions=by_offsets, rotary_dim=128,
                           out_q=torch.empty_like(q), v=v, cache_mode=fused.CACHE_PAGE_TABLE,
                           slots=torch.empty(128, dtype=index_dtype, **meta), page_table=table, block_size=16,
                           cache_len=256, config=fused.FusedConfig(2, 8, 4, True, True), **paged)
        # NVFP4: the caches' bytes (two values a byte) and their block scales (one a 16 channels, written) over the
        # global scales; NeoX with QK-norm by slot mapping (the block scales by the GPU's e4m3 conversion, as an sm_90
        # plan takes them), GPT-J partial rotary through the page table into HND (by integer arithmetic)
        block_scales = torch.empty(16, 16, 2, 8, dtype=torch.uint8, **meta)
        nvfp4 = dict(k_cache=torch.empty(16, 16, 2, 64, dtype=torch.uint8, **meta),
                     v_cache=torch.empty(16, 16, 2, 64, dtype=torch.uint8, **meta), k_scale=block_scales,
                     v_scale=block_scales, k_global=scale, v_global=scale, quant=(tiles.NVFP4, tiles.PER_BLOCK))
        yield dict(q=q, k=k, cos=cos, sin=cos, positions=by_offsets, rotary_dim=128, out_q=torch.empty_like(q), v=v,
                   cache_mode=fused.CACHE_PAGED, slots=slots, block_size=16, cache_len=256, q_weight=weight,
                   k_weight=weight, eps=1e-6, config=fused.FusedConfig(1, 8, 4, v_apart=True), native=True, **nvfp4)
        hnd = {name: c.transpose(1, 2).contiguous().transpose(1, 2) if name.endswith(("cache", "scale")) else c
               for name, c in nvfp4.items()}
        yield dict(q=q, k=k, cos=cos[:, :48], sin=cos[:, :48], positions=by_offsets, rotary_dim=96, interleaved=True,
                   out_q=torch.empty_like(q), v=v, cache_mode=fused.CACHE_PAGE_TABLE,
                   slots=torch.empty(128, dtype=torch.int32, **meta),
                   page_table=tuple(torch.empty(n, dtype=torch.int32, **meta) for n in (128, 40, 3)), block_size=16,
                   cache_len=256, config=fused.FusedConfig(2, 8, 4, True, True), **hnd)
        # the GPU's float8 conversion at one scale a tensor where a thread holds four, two and one of k's values (2
        # heads x 64 pairs over 32, 64 and 128 threads), and a float8 e5m2 q at two values a thread: what ptxas makes
        # of a converted pair depends on how many a thread holds (the SASS check in main)
        for fmt in (tiles.E4M3, tiles.E5M2):
            for warps in (1, 2, 4):
                yield dict(q=q, k=k, cos=cos, sin=cos, positions=by_offsets, rotary_dim=128, v=v,
                           out_q=torch.empty(q.shape, dtype=torch.uint8, **meta), cache_mode=fused.CACHE_PAGED,
                           slots=slots, block_size=16, cache_len=256, config=fused.FusedConfig(1, 2, warps),
                           k_cache=torch.empty(16, 16, 2, 128, dtype=torch.uint8, **meta),
                           v_cache=torch.empty(16, 16, 2, 128, dtype=torch.uint8, **meta),
                           quant=(fmt, tiles.PER_TENSOR), k_scale=scale, v_scale=scale, q_format=fmt, q_scale=scale,
                           native=True)
        # a Llama 4 NoPE layer: q times its temperature, k and v into the cache as they are (a float8 cache: k's
        # store its only one, divided by its scale)
        yield dict(q=q, k=k, cos=None, sin=None, positions=by_offsets, rotary_dim=128, out_q=torch.empty_like(q), v=v,
                   cache_mode=fused.CACHE_PAGED, slots=slots, block_size=16, cache_len=256,
                   config=fused.FusedConfig(2, 8, 4), k_cache=torch.empty(16, 16, 2, 128, dtype=torch.uint8, **meta),
                   v_cache=torch.empty(16, 16, 2, 128, dtype=torch.uint8, **meta), quant=(tiles.E4M3, tiles.PER_TENSOR),
                   k_scale=scale, v_scale=scale, native=True, nope=(8192, 0.1))
        for q_format, native in ((tiles.E4M3, True), (tiles.E5M2, False)):  # a float8 q output
            yield dict(q=q, k=k, cos=cos, sin=cos, positions=by_offsets, rotary_dim=128,
                       out_q=torch.empty(q.shape, dtype=torch.uint8, **meta), v=v, cache_mode=fused.CACHE_PAGED,
                       slots=slots, block_size=16, cache_len=256, config=fused.FusedConfig(1, 8, 4),
                       k_cache=torch.empty(16, 16, 2, 128, dtype=dtype, **meta),
                       v_cache=torch.empty(16, 16, 2, 128, dtype=dtype, **meta), q_format=q_format, q_scale=scale,
                       native=native)
        contiguous = torch.empty(2, 80, 2, 128, dtype=dtype, **meta)
        yield dict(q=q, k=k, cos=cos, sin=cos, positions=by_offsets, rotary_dim=64, interleaved=True, out_q=q,
                   out_k=k, v=v, k_cache=contiguous, v_cache=torch.empty_like(contiguous),
                   cache_mode=fused.CACHE_CONTIGUOUS, slots=offsets, block_size=80, cache_len=80,
                   config=fused.FusedConfig(1, 4, 4))
        latent = torch.empty(1, 64, 1, 512, dtype=dtype, **meta)
        # MLA by slot mapping, and into FlashInfer's two caches (ckv_cache, kpe_cache) through its page table
        for address in (dict(cache_mode=fused.CACHE_PAGED, slots=torch.empty(64, dtype=torch.int64, **meta)),
                        dict(cache_mode=fused.CACHE_PAGE_TABLE, slots=torch.empty(64, dtype=torch.int32, **meta),
                             page_table=tuple(torch.empty(n, dtype=torch.int32, **meta) for n in (64, 8, 5)))):
            yield dict(q=torch.empty(1, 64, 16, 64, dtype=dtype, **meta),
                       k=torch.empty(1, 64, 1, 64, dtype=dtype, **meta), cos=torch.empty(4096, 32, **meta),
                       sin=torch.empty(4096, 32, **meta),
                       positions=resolve_positions(batch=1, seqlen=64, positions=torch.empty(1, 64, dtype=torch.int64)),
                       rotary_dim=64, interleaved=True, v=latent,
                       k_cache=torch.empty(8, 16, 1, 64, dtype=dtype, **meta),
                       v_cache=torch.empty(8, 16, 1, 512, dtype=dtype, **meta), block_size=16, cache_len=128,
                       config=fused.FusedConfig(1, 32, 4), **address)
        # MLA's latent cache in float8 e5m2 at one scale (kv_cache_dtype="fp8_e5m2"), the GPU's conversion
        yield dict(q=torch.empty(1, 64, 16, 64, dtype=dtype, **meta), k=torch.empty(1, 64, 1, 64, dtype=dtype, **meta),
                   cos=torch.empty(4096, 32, **meta), sin=torch.empty(4096, 32, **meta),
                   positions=resolve_positions(batch=1, seqlen=64, positions=torch.empty(1, 64, dtype=torch.int64)),
                   rotary_dim=64, interleaved=True, v=latent, k_cache=torch.empty(8, 16, 1, 64, dtype=torch.uint8),
                   v_cache=torch.empty(8, 16, 1, 512, dtype=torch.uint8), block_size=16, cache_len=128,
                   quant=(tiles.E5M2, tiles.PER_TENSOR), k_scale=scale, v_scale=scale, native=True,
                   cache_mode=fused.CACHE_PAGED, slots=torch.empty(64, dtype=torch.int64, **meta),
                   config=fused.FusedConfig(1, 32, 4))
        # MLA's angles without a table (mla_rope_and_cache(inv_freq=, scale=)): YaRN's float32 inverse frequencies
        # times its attention factor, computed at each position, in place into the float8 e4m3 latent cache by slot
        # mapping (DeepSeek's decode step at a long context)
        mla_q, mla_k = torch.empty(1, 64, 16, 64, dtype=dtype, **meta), torch.empty(1, 64, 1, 64, dtype=dtype, **meta)
        yield dict(q=mla_q, k=mla_k, cos=None, sin=None, out_q=mla_q, out_k=mla_k,
                   positions=resolve_positions(batch=1, seqlen=64, positions=torch.empty(1, 64, dtype=torch.int64)),
                   rotary_dim=64, interleaved=True, v=latent, k_cache=torch.empty(8, 16, 1, 64, dtype=torch.uint8),
                   v_cache=torch.empty(8, 16, 1, 512, dtype=torch.uint8), block_size=16, cache_len=128,
                   quant=(tiles.E4M3, tiles.PER_TENSOR), k_scale=scale, v_scale=scale, native=True,
                   cache_mode=fused.CACHE_PAGED, slots=torch.empty(64, dtype=torch.int64, **meta),
                   inv_freq=torch.empty(32, **meta), angle_scale=0.1 * math.log(40.0) + 1.0,
                   config=fused.FusedConfig(1, 32, 4))
        # DeepSeek's fp8_ds_mla entry (kv_cache_dtype="fp8_ds_mla"): k_pe in the model's dtype, kv_c in e4m3 at a
        # scale per 128-channel tile computed on write (v's own store, PER_TILE), by slot mapping
        yield dict(q=torch.empty(1, 64, 16, 64, dtype=dtype, **meta), k=torch.empty(1, 64, 1, 64, dtype=dtype, **meta),
                   cos=torch.empty(4096, 32, **meta), sin=torch.empty(4096, 32, **meta),
                   positions=resolve_positions(batch=1, seqlen=64, positions=torch.empty(1, 64, dtype=torch.int64)),
                   rotary_dim=64, interleaved=True, v=latent, k_cache=torch.empty(8, 16, 1, 64, dtype=dtype, **meta),
                   v_cache=torch.empty(8, 16, 1, 512, dtype=torch.uint8), block_size=16, cache_len=128,
                   v_quant=(tiles.E4M3, tiles.PER_TILE), v_scale=torch.empty(8, 16, 1, 4, **meta), native=True,
                   cache_mode=fused.CACHE_PAGED, slots=torch.empty(64, dtype=torch.int64, **meta),
                   config=fused.FusedConfig(1, 32, 4))
        cu = torch.empty(3, dtype=torch.int32, **meta)
        varlen = resolve_positions(batch=2, seqlen=100, positions=None, cu_seqlens=cu, max_seqlen=64)
        packed = torch.empty(100, 8, 128, dtype=dtype, **meta)
        yield dict(q=packed, k=None, cos=cos, sin=cos, positions=varlen, rotary_dim=96, out_q=torch.empty_like(packed),
                   q_weight=weight, eps=1e-6, config=fused.FusedConfig(2, 8, 4))
        # the norm after the rotation (Llama 4's, weightless; and with weights), partial rotary, forward with a
        # cache and backward
        for weights in (dict(), dict(q_weight=weight, k_weight=weight)):
            yield dict(q=q, k=k, cos=cos, sin=cos, positions=by_offsets, rotary_dim=96, out_q=torch.empty_like(q),
                       v=v, cache_mode=fused.CACHE_PAGED, slots=slots, block_size=16, cache_len=256,
                       k_cache=torch.empty(16, 16, 2, 128, dtype=dtype, **meta),
                       v_cache=torch.empty(16, 16, 2, 128, dtype=dtype, **meta), eps=1e-5, norm=tiles.AFTER,
                       config=fused.FusedConfig(1, 8, 4), **weights)
            yield dict(q=q, k=k, cos=cos, sin=cos, positions=by_offsets, rotary_dim=96, out_q=torch.empty_like(q),
                       out_k=torch.empty_like(k), eps=1e-5, norm=tiles.AFTER, grad_q=torch.empty_like(q),
                       grad_k=torch.empty_like(k), config=fused.FusedConfig(2, 4, 4, token_blocks=4), **weights)
        # the norm across all heads (OLMo-2's): every head of a token in one program, a weight a (head, channel);
        # forward with a cache, and backward
        across = dict(q_weight=torch.empty(8 * 128, dtype=dtype, **meta), eps=1e-6, norm_over_heads=True,
                      k_weight=torch.empty(2 * 128, dtype=dtype, **meta))
        yield dict(q=q, k=k, cos=cos, sin=cos, positions=by_offsets, rotary_dim=96, out_q=torch.empty_like(q),
                   v=v, cache_mode=fused.CACHE_PAGED, slots=slots, block_size=16, cache_len=256,
                   k_cache=torch.empty(16, 16, 2, 128, dtype=dtype, **meta),
                   v_cache=torch.empty(16, 16, 2, 128, dtype=dtype, **meta), config=fused.FusedConfig(2, 8, 4),
                   **across)
        yield dict(q=q, k=k, cos=cos, sin=cos, positions=by_offsets, rotary_dim=96, out_q=torch.empty_like(q),
                   out_k=torch.empty_like(k), grad_q=torch.empty_like(q), grad_k=torch.empty_like(k),
                   norm=tiles.AFTER, config=fused.FusedConfig(1, 8, 4, token_blocks=4), **across)
        for deterministic in (False, True):
            for config in (fused.FusedConfig(1, 8, 4, evict_first=True, heads_inner=True, token_blocks=16, stages=4),
                           fused.FusedConfig(2, 4, 4, token_blocks=4)):
                yield dict(q=q, k=k, cos=cos, sin=cos, positions=by_offsets, rotary_dim=128,
                           out_q=torch.empty_like(q), out_k=torch.empty_like(k), q_weight=weight, k_weight=weight,
                           eps=1e-6, grad_q=torch.empty_like(q), grad_k=torch.empty_like(k), config=config,
                           deterministic=deterministic)


def _fused_launch(call):
    """Plan a fused call and launch it with its own tensors (inside recorded_launches: nothing runs)."""
    deterministic = call.pop("deterministic", False)
    native = call.pop("native", False)
    before, native_fp8 = torch.are_deterministic_algorithms_enabled(), fused.native_fp8
    torch.use_deterministic_algorithms(deterministic)
    fused.native_fp8 = lambda device: native  # the GPU's float8 conversion, as an sm_90 plan chooses it
    try:
        fused.launch_fused(call.pop("q"), call.pop("k"), call.pop("cos"), call.pop("sin"), **call)
    finally:
        torch.use_deterministic_algorithms(before)
        fused.native_fp8 = native_fp8
    return call["config"]


@contextlib.contextmanager
def _captured_jit_launches():
    """Every ``kernel[grid](...)`` inside the block is recorded (kernel, grid, arguments by name) instead of run: for
    launchers that call Triton's entry point themselves (the course's ladder)."""
    records = []
    real = triton.runtime.jit.JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        names = [p.name for p in self.params]
        arguments = dict(zip(names, args))
        num_warps = kwargs.pop("num_warps", 4)
        arguments.update({k: v for k, v in kwargs.items() if k in names})
        constexprs = frozenset(p.name for p in self.params if p.is_constexpr)
        records.append(launch.LaunchRecord(self, grid, arguments, num_warps, constexprs))

    triton.runtime.jit.JITFunction.run = run
    try:
        yield records
    finally:
        triton.runtime.jit.JITFunction.run = real


def _ladder_records():
    """The course ladder's eight steps on a Llama-like bf16 call, each once with its default configuration."""
    from ropekit.course import ladder

    q = torch.empty(2, 64, 8, 128, dtype=torch.bfloat16)
    k = torch.empty(2, 64, 2, 128, dtype=torch.bfloat16)
    cos = torch.empty(4096, 64)
    with _captured_jit_launches() as records:
        for name in ladder.STEPS:
            kernel = ladder.step(name).KERNEL
            declared = inspect.signature(kernel.fn).parameters
            # the tile steps at v3's H100 tile (v3 sizes it from the SM count, which this machine has not)
            config = None if "BLOCK" in declared or "BLOCK_HK" in declared else ladder.LadderConfig(4, 8, 4)
            ladder.rope_ladder(kernel, q, k, cos, cos, config=config)
    return records


def main() -> int:
    count = 0
    plans = [(launch.plan_rope, call) for call in _rope_calls()] + [(None, call) for call in _fused_calls()]
    for plan_rope, call in plans:
        with launch.recorded_launches() as records:
            if plan_rope is None:
                config = _fused_launch(call)
            else:
                plan = plan_rope(call.pop("q"), call.pop("k"), call.pop("cos"), call.pop("sin"), **call)
                config = plan.config
                plan.launch()
        for record in records:
            try:
                compiled = compile_record(record, hints=True)  # the alignment a GPU launch specialises on
            except Exception as error:  # noqa: BLE001
                print(f"FAIL {record.kernel.__name__} {config}: {type(error).__name__}: {error}")
                return 1
            misread = stack_pointer_reads(compiled)
            if misread:
                print(f"FAIL {record.kernel.__name__} {config}: the SASS reads the stack pointer R1 as a value: "
                      f"{misread[0]}")
                return 1
            count += 1
            print(f"ok   {record.kernel.__name__:21s} {config}  ({len(compiled.asm['ptx'])} bytes of PTX)")
    for record in _ladder_records():
        try:
            compile_record(record)
        except Exception as error:  # noqa: BLE001
            print(f"FAIL ladder {record.kernel.__name__}: {type(error).__name__}: {error}")
            return 1
        count += 1
        print(f"ok   ladder {record.kernel.__name__}")
    print(f"{count} launches compiled for sm_90")
    return 0


if __name__ == "__main__":
    sys.exit(main())
