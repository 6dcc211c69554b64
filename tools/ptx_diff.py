"""Whether two trees compile the tile kernel and the fused kernels to the same code: the PTX of representative
launches, compiled for an H100 (sm_90) on a machine without a GPU, from the tree at BASE_REF and from this working
tree.

    python tools/ptx_diff.py [BASE_REF]        # default: main

Each case is planned through its launcher (``ropekit.triton.launch.rope_v4`` or ``ropekit.triton.fused.launch_fused``
inside ``ropekit.triton.launch.recorded_launches``: nothing runs), and each recorded launch is compiled by Triton's own
compiler with the specialisation Triton's JIT gives these arguments (16-byte alignment of tensors, integers equal to
1 made constants, integers divisible by 16). Kernel parameters may be grouped or ordered differently in the two trees,
so before comparing, each PTX parameter is named by the value passed in it (a tensor by the call's name for it, a
number by its value; equal names numbered in order), its ``ld.param`` loads are sorted, and registers are numbered in
order of first use; line-number and debug records are dropped. A launch passes when the PTX is then the same. The
SASS (ptxas, nvdisasm from Triton's bundle) is reported beside it as its instruction mnemonics: ptxas lays out and
loads the parameters from the constant bank by their order, so reordered parameters move those loads. Prints one
entry a launch; exits 1 if any PTX differs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from itertools import permutations
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------------------------------
# Dumping one tree's code (run in a subprocess, with that tree first on the path).
# --------------------------------------------------------------------------------------------------------------------

def _cases(torch, fused, launch, tiles, resolve_positions):
    """(name, launch_fused's keyword arguments, or with ``v4`` rope_v4's, whether the GPU converts to float8 itself).
    Every tensor has strides of its own where the layout allows, so that a parameter is recognised by its value."""
    bf16, meta = torch.bfloat16, dict(device="cpu")

    def strided(*shape, dtype=bf16, pad=16):
        """A (..., heads, dim) view whose head stride is dim + pad: strides no other tensor shares."""
        return torch.empty(*shape[:-1], shape[-1] + pad, dtype=dtype, **meta)[..., :shape[-1]]

    def cos_sin(rows, half):
        return torch.empty(rows, half + 8, **meta)[:, :half], torch.empty(rows, half + 24, **meta)[:, :half]

    def prefill(dtype=bf16, cache_dtype=None, **extra):
        q, k, v = strided(2, 48, 8, 128, dtype=dtype, pad=32), strided(2, 48, 2, 128, dtype=dtype, pad=48), \
            strided(2, 48, 2, 128, dtype=dtype, pad=64)
        cos, sin = cos_sin(4096, 64)
        cache_dtype = cache_dtype or dtype
        call = dict(q=q, k=k, cos=cos, sin=sin, v=v, out_q=strided(2, 48, 8, 128, dtype=dtype, pad=80),
                    positions=resolve_positions(batch=2, seqlen=48, positions=torch.empty(2, dtype=torch.int64)),
                    rotary_dim=128, k_cache=torch.empty(40, 16, 2, 128, dtype=cache_dtype, **meta),
                    v_cache=torch.empty(40, 16, 2, 144, dtype=cache_dtype, **meta)[..., :128],
                    cache_mode=fused.CACHE_PAGED, slots=torch.empty(200, dtype=torch.int64, **meta)[::2],
                    block_size=16, cache_len=640, config=fused.FusedConfig(2, 4, 4))
        call.update(extra)
        return call

    # the tile kernel (rope_v4's arguments, marked "v4"), at forced tiles
    tile = launch.TileConfig
    spec = resolve_positions(batch=2, seqlen=48, positions=torch.empty(2, dtype=torch.int64))
    yield "v4: bf16, contiguous (dense), out of place, NeoX", dict(
        v4=True, q=torch.empty(2, 48, 8, 128, dtype=bf16), k=torch.empty(2, 48, 2, 128, dtype=bf16),
        cos=torch.empty(4096, 64), sin=torch.empty(4096, 64), out_q=torch.empty(2, 48, 8, 128, dtype=bf16),
        out_k=torch.empty(2, 48, 2, 128, dtype=bf16), positions=spec, rotary_dim=128,
        config=tile(2, 4, 4, evict_first=True)), False
    q, k = strided(2, 48, 8, 128, pad=32), strided(2, 48, 2, 128, pad=48)
    yield "v4: strided, in place, GPT-J, partial rotary, q and k in one tile", dict(
        v4=True, q=q, k=k, cos=cos_sin(4096, 48)[0], sin=cos_sin(4096, 48)[1], out_q=q, out_k=k, positions=spec,
        rotary_dim=96, interleaved=True, config=tile(1, 8, 4, fused_qk=True)), False
    yield "v4: float32, the conjugate, per-token cos/sin rows", dict(
        v4=True, q=strided(2, 48, 8, 64, dtype=torch.float32), k=None,
        cos=torch.empty(2, 48, 64 + 8)[..., :64], sin=torch.empty(2, 48, 64 + 16)[..., :64],
        out_q=strided(2, 48, 8, 64, dtype=torch.float32, pad=48), out_k=None,
        positions=resolve_positions(batch=2, seqlen=48), rotary_dim=64, conjugate=True, cos_per_token=True,
        config=tile(4, 2, 2)), False
    yield "v4: varlen, angles without a table", dict(
        v4=True, q=strided(100, 8, 128, pad=32), k=strided(100, 2, 128, pad=48), cos=None, sin=None,
        inv_freq=torch.empty(64), scale=0.5, out_q=strided(100, 8, 128, pad=64), out_k=strided(100, 2, 128, pad=80),
        positions=resolve_positions(batch=2, seqlen=100, positions=None, cu_seqlens=torch.empty(3, dtype=torch.int32),
                                    max_seqlen=64),
        rotary_dim=128, config=tile(2, 4, 4)), False
    yield "v4: M-RoPE, interleaved sections", dict(
        v4=True, q=strided(2, 48, 8, 128, pad=32), k=strided(2, 48, 2, 128, pad=48), cos=cos_sin(4096, 64)[0],
        sin=cos_sin(4096, 64)[1], out_q=strided(2, 48, 8, 128, pad=64), out_k=strided(2, 48, 2, 128, pad=80),
        positions=resolve_positions(batch=2, seqlen=48, positions=torch.empty(3, 2, 48, dtype=torch.int64),
                                    mrope_section=[24, 20, 20], mrope_interleaved=True),
        rotary_dim=128, config=tile(2, 4, 4)), False
    yield "v4: a NoPE layer (attention temperature), decode", dict(
        v4=True, q=torch.empty(64, 1, 8, 128, dtype=bf16), k=torch.empty(64, 1, 2, 128, dtype=bf16), cos=None,
        sin=None, out_q=torch.empty(64, 1, 8, 128, dtype=bf16), out_k=torch.empty(64, 1, 2, 128, dtype=bf16),
        positions=resolve_positions(batch=64, seqlen=1, positions=torch.empty(64, dtype=torch.int64)),
        rotary_dim=128, nope=(8192, 0.1), config=tile(1, 4, 4)), False

    weights = dict(q_weight=torch.empty(160, dtype=bf16)[::1][:128], k_weight=torch.empty(256, dtype=bf16)[::2],
                   eps=1e-6)
    yield "bf16 prefill, paged cache", prefill(), False
    yield "bf16 prefill, paged cache, QK-norm before", prefill(**weights), False
    yield "bf16 prefill, QK-norm after (weightless), partial rotary", prefill(
        norm=tiles.AFTER, eps=1e-5, rotary_dim=96, cos=cos_sin(4096, 48)[0], sin=cos_sin(4096, 48)[1]), False
    yield "bf16 decode, paged cache, heads inner", prefill(
        q=strided(64, 1, 8, 128, pad=32), k=strided(64, 1, 2, 128, pad=48), v=strided(64, 1, 2, 128, pad=64),
        out_q=strided(64, 1, 8, 128, pad=80), positions=resolve_positions(batch=64, seqlen=1, positions=torch.empty(
            64, 1, dtype=torch.int64)), slots=torch.empty(64, dtype=torch.int64),
        config=fused.FusedConfig(1, 8, 4, True, True)), False
    scale = torch.empty(1, **meta)
    yield "float8 e4m3 cache, per-tensor scales, the GPU's conversion", prefill(
        cache_dtype=torch.uint8, quant=(tiles.E4M3, tiles.PER_TENSOR), k_scale=scale,
        v_scale=torch.empty(1, **meta)), True
    yield "float8 e4m3 cache, per-head scales (a large grid: loaded at the store)", prefill(
        cache_dtype=torch.uint8, quant=(tiles.E4M3, tiles.PER_HEAD), k_scale=torch.empty(2, **meta),
        v_scale=torch.empty(4, **meta)[::2]), True
    token_head = torch.empty(40, 16, 2, **meta)
    yield "int8 cache, per-(token, head) scales, QK-norm", prefill(
        cache_dtype=torch.int8, quant=(tiles.INT8, tiles.PER_TOKEN_HEAD), k_scale=token_head,
        v_scale=torch.empty(40, 16, 4, **meta)[..., :2], **weights), False
    yield "float8 e4m3 cache, per-(token, head) scales, v's programs apart, the GPU's conversion", prefill(
        cache_dtype=torch.uint8, quant=(tiles.E4M3, tiles.PER_TOKEN_HEAD), k_scale=torch.empty(40, 16, 2, **meta),
        v_scale=torch.empty(40, 16, 6, **meta)[..., 1:3],
        config=fused.FusedConfig(1, 8, 4, True, True, v_apart=True)), True
    yield "float8 e4m3 q output", prefill(out_q=torch.empty(2, 48, 8, 128, dtype=torch.uint8), q_format=tiles.E4M3,
                                          q_scale=scale), True
    table = tuple(torch.empty(n, dtype=torch.int32, **meta) for n in (96, 40, 3))
    yield "page table into an HND NVFP4 cache, GPT-J, partial rotary", prefill(
        k_cache=torch.empty(40, 2, 16, 64, dtype=torch.uint8).transpose(1, 2),
        v_cache=torch.empty(40, 2, 16, 64, dtype=torch.uint8).transpose(1, 2),
        k_scale=torch.empty(40, 2, 16, 8, dtype=torch.uint8).transpose(1, 2),
        v_scale=torch.empty(40, 2, 16, 8, dtype=torch.uint8).transpose(1, 2), k_global=scale,
        v_global=torch.empty(1, **meta), quant=(tiles.NVFP4, tiles.PER_BLOCK), cache_mode=fused.CACHE_PAGE_TABLE,
        slots=torch.empty(96, dtype=torch.int32), page_table=table, interleaved=True, rotary_dim=96,
        cos=cos_sin(4096, 48)[0], sin=cos_sin(4096, 48)[1]), False
    latent = strided(1, 64, 1, 512, pad=32)
    yield "MLA: rotated k_pe and the latent into their two caches", dict(
        q=strided(1, 64, 16, 64, pad=16), k=strided(1, 64, 1, 64, pad=48), cos=cos_sin(4096, 32)[0],
        sin=cos_sin(4096, 32)[1], out_q=strided(1, 64, 16, 64, pad=80),
        positions=resolve_positions(batch=1, seqlen=64, positions=torch.empty(1, 64, dtype=torch.int64)),
        rotary_dim=64, interleaved=True, v=latent, k_cache=torch.empty(8, 16, 1, 64, dtype=bf16),
        v_cache=torch.empty(8, 16, 1, 512, dtype=bf16), block_size=16, cache_len=128,
        cache_mode=fused.CACHE_PAGED, slots=torch.empty(64, dtype=torch.int64),
        config=fused.FusedConfig(1, 32, 4)), False
    cu = torch.empty(3, dtype=torch.int32)
    packed = strided(100, 8, 128, pad=32)
    yield "varlen, contiguous cache, in place", dict(
        q=packed, k=strided(100, 2, 128, pad=48), cos=cos_sin(4096, 64)[0], sin=cos_sin(4096, 64)[1],
        positions=resolve_positions(batch=2, seqlen=100, positions=None, cu_seqlens=cu, max_seqlen=64),
        rotary_dim=128, out_q=packed, v=strided(100, 2, 128, pad=64),
        k_cache=torch.empty(2, 80, 2, 128, dtype=bf16), v_cache=torch.empty(2, 80, 2, 160, dtype=bf16)[..., :128],
        cache_mode=fused.CACHE_CONTIGUOUS, slots=torch.empty(2, dtype=torch.int64), block_size=80, cache_len=80,
        config=fused.FusedConfig(1, 4, 4)), False
    for atomic in (True, False):
        q, k = strided(2, 48, 8, 128, pad=32), strided(2, 48, 2, 128, pad=48)
        yield f"backward with QK-norm, {'atomic' if atomic else 'deterministic'} weight gradient", dict(
            q=q, k=k, cos=cos_sin(4096, 64)[0], sin=cos_sin(4096, 64)[1],
            positions=resolve_positions(batch=2, seqlen=48, positions=torch.empty(2, dtype=torch.int64)),
            rotary_dim=128, out_q=strided(2, 48, 8, 128, pad=64), out_k=strided(2, 48, 2, 128, pad=80),
            grad_q=strided(2, 48, 8, 128, pad=96), grad_k=strided(2, 48, 2, 128, pad=112), **weights,
            config=fused.FusedConfig(1, 8, 4, evict_first=True, heads_inner=atomic, token_blocks=4, stages=2),
            deterministic=not atomic), False
    across = dict(q_weight=torch.empty(8 * 128, dtype=bf16), k_weight=torch.empty(2 * 128 + 16, dtype=bf16)[:256],
                  eps=1e-6, norm_over_heads=True, norm=tiles.AFTER)
    yield "backward, norm after the rotation over all heads, partial rotary", dict(
        q=strided(2, 48, 8, 128, pad=32), k=strided(2, 48, 2, 128, pad=48), cos=cos_sin(4096, 48)[0],
        sin=cos_sin(4096, 48)[1],
        positions=resolve_positions(batch=2, seqlen=48, positions=torch.empty(2, dtype=torch.int64)),
        rotary_dim=96, out_q=strided(2, 48, 8, 128, pad=64), out_k=strided(2, 48, 2, 128, pad=80),
        grad_q=strided(2, 48, 8, 128, pad=96), grad_k=strided(2, 48, 2, 128, pad=112), **across,
        config=fused.FusedConfig(2, 8, 4, token_blocks=2)), False


def _names(call: dict, torch) -> dict:
    """Each tensor's data pointer -> the call's names for it (a page table's by its parts')."""
    names: dict = {}
    for name, value in call.items():
        parts = [(name, value)]
        if name == "page_table" and value is not None:
            parts = [(f"page_table.{i}", t) for i, t in enumerate(value)]
        if name == "positions":
            parts = [("positions", value.tensor), ("cu_seqlens", value.cu_seqlens)]
        for part, t in parts:
            if isinstance(t, torch.Tensor):
                names.setdefault(t.data_ptr(), set()).add(part)
    return names


def _specialised(value, path, torch, signature_types, constants, attrs, labels, names):
    """The signature type of one argument (tuples leaf by leaf) as Triton's JIT specialises it, recording the
    constants, the 16-divisibility hints and, for every leaf passed to the kernel, its label."""
    if isinstance(value, tuple):
        return tuple(_specialised(v, path + (i,), torch, signature_types, constants, attrs, labels, names)
                     for i, v in enumerate(value))
    if value is None or type(value) is str or type(value) is bool:
        constants[path] = value
        return "constexpr"
    if isinstance(value, torch.Tensor):
        if value.data_ptr() % 16 == 0:
            attrs[path] = [["tt.divisibility", 16]]
        labels.append("tensor " + "/".join(sorted(names.get(value.data_ptr(), {"?"}))) + f" {value.dtype}")
        return "*" + signature_types[value.dtype]
    if type(value) is int:
        if value == 1:
            constants[path] = 1
            return "constexpr"
        if value % 16 == 0:
            attrs[path] = [["tt.divisibility", 16]]
        labels.append(f"int {value}")
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if type(value) is float:
        labels.append(f"float {value!r}")
        return "fp32"
    raise TypeError(f"no signature type for {value!r}")


def dump(out: Path) -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import torch
    available, torch.cuda.is_available = torch.cuda.is_available, lambda: True
    import ropekit  # noqa: F401  (decorated for a GPU)
    from ropekit.positions import resolve_positions
    from ropekit.triton import fused, launch
    from ropekit.triton import fused_tiles as tiles
    torch.cuda.is_available = available
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature_types = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
                       torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.int8: "i8"}
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for n, (name, call, native) in enumerate(_cases(torch, fused, launch, tiles, resolve_positions)):
        deterministic = call.pop("deterministic", False)
        launcher = launch.rope_v4 if call.pop("v4", False) else fused.launch_fused
        before, native_fp8 = torch.are_deterministic_algorithms_enabled(), fused.native_fp8
        torch.use_deterministic_algorithms(deterministic)
        fused.native_fp8 = lambda device: native  # the GPU's float8 conversion, as an sm_90 plan chooses it
        try:
            with launch.recorded_launches() as records:
                launcher(**call)
        finally:
            torch.use_deterministic_algorithms(before)
            fused.native_fp8 = native_fp8
        names = _names(call, torch)
        for r, record in enumerate(records):
            parameters = list(inspect.signature(record.kernel.fn).parameters)
            signature, constants, attrs, labels = {}, {}, {}, []
            for i, parameter in enumerate(parameters):
                value = record.arguments[parameter]
                if parameter in record.constexprs:
                    signature[parameter] = "constexpr"
                    constants[(i,)] = value
                else:
                    signature[parameter] = _specialised(value, (i,), torch, signature_types, constants, attrs,
                                                        labels, names)
            source = ASTSource(fn=record.kernel, signature=signature, constexprs=constants, attrs=attrs)
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": record.num_warps})
            stem = f"{n:02d}-{r}"
            (out / f"{stem}.ptx").write_text(compiled.asm["ptx"])
            if "cubin" in compiled.asm:
                (out / f"{stem}.cubin").write_bytes(compiled.asm["cubin"])
            index.append(dict(stem=stem, case=name, kernel=record.kernel.__name__, labels=labels,
                              parameters=len(parameters)))
    (out / "index.json").write_text(json.dumps(index, indent=1))


# --------------------------------------------------------------------------------------------------------------------
# Comparing two dumps.
# --------------------------------------------------------------------------------------------------------------------

def canonical_ptx(ptx: str, labels: list) -> list:
    """The PTX as comparable lines: parameters named by their labels (equal labels numbered in order; Triton's
    trailing scratch pointers by position from the end), their declarations and loads sorted, registers numbered by
    first appearance, line and debug records dropped."""
    ptx = ptx.split(".section\t.debug", 1)[0].split(".section .debug", 1)[0]
    found = re.search(r"\.entry (\w+)\(", ptx)
    entry = found.group(1)
    count: dict = {}
    named = []
    for label in labels:
        count[label] = count.get(label, 0) + 1
        named.append(f"{label} #{count[label]}")
    # the entry's parameter list: from ".entry" to its body (device functions may be declared before it)
    declared = [int(i) for i in re.findall(rf"{entry}_param_(\d+)", ptx[found.start():].split("{", 1)[0])]
    n = max(declared) + 1 if declared else 0
    extra = n - len(named)
    if extra < 0:
        raise ValueError(f"{entry}: {n} PTX parameters for {len(named)} passed values")
    named += [f"scratch {i}" for i in range(extra)]

    def param(match):
        return "<" + named[int(match.group(1))] + ">"
    lines = []
    for line in ptx.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("//", ".loc", ".file", "$L__tmp", "$L__func")):
            continue
        stripped = re.sub(r"\s*//.*$", "", stripped)
        stripped = re.sub(rf"{entry}_param_(\d+)", param, stripped).replace(entry, "KERNEL")
        lines.append(re.sub(r"\s+", " ", stripped).rstrip(","))
    # a load's register is named after its parameter, so that neither the load's place nor the parameters' order
    # renumbers anything
    loaded = {}
    for line in lines:
        load = re.match(r"ld\.param\.\w+ (%[a-z]+\d+), \[<(.*)>\];$", line)
        if load:
            loaded[load.group(1)] = "%<" + load.group(2) + ">"
    lines = [re.sub(r"%[a-z]+\d+", lambda m: loaded.get(m.group(0), m.group(0)), line) for line in lines]
    result = sorted_runs(lines)
    # the other registers by first appearance (declarations, which only count them, left as they are)
    seen: dict = {}

    def register(match):
        name = match.group(0)
        if name not in seen:
            prefix = re.match(r"%[a-z]+", name).group(0)
            seen[name] = f"{prefix}#{sum(1 for v in seen.values() if v.startswith(prefix + '#'))}"
        return seen[name]
    return [line if line.startswith(".reg") else re.sub(r"%[a-z]+\d+", register, line) for line in result]


def sorted_runs(lines: list) -> list:
    """Each run of parameter declarations and of parameter loads sorted."""
    runs, result = [], []
    for line in lines:
        kind = "decl" if line.startswith(".param") else "load" if line.startswith("ld.param") else None
        if kind and runs and runs[-1][0] == kind:
            runs[-1][1].append(line)
        else:
            runs.append((kind, [line]))
    for kind, block in runs:
        result += sorted(block) if kind else block
    return result


def match_equal_values(old: list, new: list, labels: list) -> tuple:
    """``new`` with the parameters that share a label (equal values) renumbered to match ``old`` where a numbering
    does (each group's orders tried, the one leaving fewest differing lines kept); and how many such parameters
    there are, whose correspondence rests on their use rather than their value."""
    groups = [(label, n) for label, n in Counter(labels).items() if 1 < n <= 6]

    def renumbered(lines, label, order):
        pattern = re.compile(rf"<{re.escape(label)} #(\d+)>")
        return [pattern.sub(lambda m: f"<{label} #{order[int(m.group(1)) - 1]}>", line) if label in line else line
                for line in lines]

    def differing(lines):
        return sum(a != b for a, b in zip(old, lines)) + abs(len(old) - len(lines))
    for _ in range(2):
        for label, n in groups:
            new = min((sorted_runs(renumbered(new, label, order)) for order in permutations(range(1, n + 1))),
                      key=differing)
    return new, sum(n for _, n in groups)


def sass_mnemonics(cubin: Path) -> list | None:
    import triton
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not nvdisasm.exists() or not cubin.exists():
        return None
    text = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    return [m.group(1) for m in re.finditer(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text,
                                            re.M)]


def _sass_summary(old: list, new: list) -> str:
    """How two instruction streams differ: identical, or their lengths and the instructions one has more of than the
    other (ptxas pairs parameter loads from the constant bank, ULDC into ULDC.64, by where the parameters lie)."""
    if old == new:
        return f"identical ({len(new)} instructions)"
    gained, lost = Counter(new) - Counter(old), Counter(old) - Counter(new)
    return (f"{len(old)} -> {len(new)} instructions, same mnemonics in another order" if not gained and not lost
            else f"{len(old)} -> {len(new)} instructions; only in base: {dict(lost)}; only in head: {dict(gained)}")


def compare(base: Path, head: Path) -> int:
    base_index = json.loads((base / "index.json").read_text())
    head_index = json.loads((head / "index.json").read_text())
    if [(e["case"], e["kernel"]) for e in base_index] != [(e["case"], e["kernel"]) for e in head_index]:
        print("the two trees record different launches for the cases")
        return 1
    failed = 0
    for b, h in zip(base_index, head_index):
        old_ptx, new_ptx = (d / f"{e['stem']}.ptx" for d, e in ((base, b), (head, h)))
        identical = old_ptx.read_text().split(".section")[0] == new_ptx.read_text().split(".section")[0]
        old, new = canonical_ptx(old_ptx.read_text(), b["labels"]), canonical_ptx(new_ptx.read_text(), h["labels"])
        same_values = sorted(b["labels"]) == sorted(h["labels"])
        shared = 0
        if old != new and same_values:
            new, shared = match_equal_values(old, new, h["labels"])
        old_sass, new_sass = sass_mnemonics(base / f"{b['stem']}.cubin"), sass_mnemonics(head / f"{h['stem']}.cubin")
        sass = "n/a" if old_sass is None or new_sass is None else _sass_summary(old_sass, new_sass)
        ok = same_values and old == new
        failed += not ok
        verdict = "byte-identical" if identical else "DIFFERENT" if not ok else "same modulo parameter order" + (
            f" ({shared} parameters of equal values matched by use)" if shared else "")
        print(f"{'ok  ' if ok else 'FAIL'} {h['kernel']:21s} {b['parameters']:2d} -> {h['parameters']:2d} parameters:"
              f" {h['case']}\n     PTX {verdict}; SASS {sass}")
        if not ok:
            if not same_values:
                print("     passed values differ:", sorted(set(b["labels"]) ^ set(h["labels"])))
            import difflib
            for line in list(difflib.unified_diff(old, new, "base", "head", n=1, lineterm=""))[:40]:
                print("     " + line)
    print(f"{len(head_index) - failed} of {len(head_index)} launches compile to the same code")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("base", nargs="?", default="main", help="the git ref to compare with (default: main)")
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)  # (internal: dump this process's tree)
    args = parser.parse_args()
    if args.dump:
        dump(args.dump)
        return 0
    with tempfile.TemporaryDirectory(prefix="ptx-diff-") as scratch:
        scratch = Path(scratch)
        tree = scratch / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), args.base],
                       check=True)
        try:
            for where, out in ((tree, scratch / "base-dump"), (ROOT, scratch / "head-dump")):
                env = dict(os.environ, PYTHONPATH=str(where))
                env.pop("TRITON_INTERPRET", None)
                subprocess.run([sys.executable, str(Path(__file__).resolve()), "--dump", str(out)], cwd=where,
                               env=env, check=True)
            return compare(scratch / "base-dump", scratch / "head-dump")
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
            shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
