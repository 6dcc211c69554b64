"""How many bytes of kernel parameters a v4 launch carries, offline (no GPU needed: compiles for sm_90).

CUDA-graph replay pays for every byte of kernel arguments (docs/gpu-runs/run45), so the small cases' launches are
kept lean (``plan_v4``). This compiles v4 with exactly the specialisation a launch would get on the GPU (the plan's
pointers, integers and constexprs; Triton's rules: None and the integer 1 are constants, integers divisible by 16
and 16-byte aligned pointers carry a divisibility hint) and reads the parameter list of the PTX entry. It also
prints Liger-Kernel's rope kernel's when it is importable, compiled the same way.

    python tools/launch_params.py                     # the small prefill in place and out of place, and decode
    python tools/launch_params.py --sass              # also count the SASS instructions (needs cuobjdump)

The launch configuration is the H100's (``launch_config`` outside the interpreter), not the interpreter's.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

torch.cuda.is_available = lambda: True  # compile for the GPU; nothing here touches a device
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ropekit import device as _device  # noqa: E402
from ropekit.positions import resolve_positions  # noqa: E402
from ropekit.triton import v4  # noqa: E402

_TT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
       torch.int64: "i64"}
_DIV16 = [["tt.divisibility", 16]]


def _ptx_param_sizes(ptx: str) -> list[int]:
    """Byte sizes of the PTX entry's parameters, in order (the arguments Triton passes, then its scratch pointers)."""
    entry = re.search(r"\.entry\s+\w+\((.*?)\)", ptx, re.S).group(1)
    return [int(bits) // 8 for bits in re.findall(r"\.param\s+\.[a-z](\d+)", entry)]


def compile_plan(plan: v4.V4Launch, pointers: tuple, sass: bool) -> dict:
    """Compile v4 as ``plan`` would launch it with these pointer arguments; its PTX parameters."""
    names = v4.rope_v4_kernel.arg_names
    ints = (*plan.ints_head, 1, *plan.ints_tail)  # the offset 0 arrives as 1
    values = {**dict(zip(names, (*pointers, *ints))), **plan.constexprs}
    return compile_specialised(v4.rope_v4_kernel, values, set(plan.constexprs), plan.num_warps, sass)


def compile_specialised(kernel, values: dict, constexpr_names: set, num_warps: int, sass: bool) -> dict:
    """Compile ``kernel`` for sm_90 with the specialisation Triton gives a launch with these argument ``values``
    (None and the integer 1 become constants; tensors, and integers divisible by 16, carry the divisibility hint)."""
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        value = values[name]
        if name in constexpr_names or value is None or (isinstance(value, int) and value == 1):
            signature[name], constants[(i,)] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TT[value.dtype]
            attrs[(i,)] = _DIV16  # torch allocations are 16-byte aligned
        else:
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = _DIV16
    source = ASTSource(kernel, signature, constexprs=constants, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    return _describe(compiled, signature, sass)


def _describe(compiled, signature: dict, sass: bool) -> dict:
    sizes = _ptx_param_sizes(compiled.asm["ptx"])
    passed = [name for name, kind in signature.items() if kind != "constexpr"]
    passed += [f"(scratch {i})" for i in range(len(sizes) - len(passed))]  # Triton's global/profile scratch
    row = {"params": passed, "param_bytes": sum(sizes)}
    if sass:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            text = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        row["sass_instructions"] = sum(1 for line in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line))
    return row


def small_cases():
    """(label, plan, pointers) of the benchmark's small cases: b1 s512 and decode b64, 32 q / 8 kv heads x 128."""
    cos = torch.empty(8192, 64)
    sin = torch.empty(8192, 64)
    cases = []
    decode_offsets = torch.zeros(64, dtype=torch.int64)
    for label, batch, seqlen, positions in (("small prefill b1 s512", 1, 512, None),
                                            ("decode b64 s1, per-sequence offsets", 64, 1, decode_offsets)):
        q = torch.empty(batch, seqlen, 32, 128, dtype=torch.bfloat16)
        k = torch.empty(batch, seqlen, 8, 128, dtype=torch.bfloat16)
        spec = resolve_positions(batch=batch, seqlen=seqlen, positions=positions)
        config = _h100_config(batch * seqlen)
        for inplace in (True, False):
            out_q, out_k = (q, k) if inplace else (torch.empty_like(q), torch.empty_like(k))
            plan = v4.plan_v4(q, k, cos, sin, out_q=out_q, out_k=out_k, positions=spec, rotary_dim=128,
                              config=config)
            in_place = getattr(plan, "in_place", False)  # a v4 without IN_PLACE passes the outputs' pointers
            pointers = v4.V4Launch.pointers(q, k, out_q, out_k, cos, sin, spec.tensor, spec.cu_seqlens,
                                            *((True,) if in_place else ()))
            cases.append((f"{label}, {'in place' if inplace else 'out of place'}", plan, pointers))
    return cases


def _h100_config(n_tokens: int) -> v4.LaunchConfig:
    interpret = _device.INTERPRET
    _device.INTERPRET = False  # the GPU's table, not the interpreter's
    try:
        return v4.launch_config.__wrapped__(n_tokens, 32, 8, 128, 128, False, 2)
    finally:
        _device.INTERPRET = interpret


def liger_params(sass: bool) -> dict | None:
    try:
        from liger_kernel.ops.rope import _triton_rope
    except ImportError:
        return None
    names = _triton_rope.arg_names
    # Liger's launch for b1 s512, 32 / 8 heads x 128, bf16 (its wrapper's arguments, transformers' layout)
    values = dict(q_ptr=torch.empty(1, dtype=torch.bfloat16), q_row_stride=32 * 128,
                  k_ptr=torch.empty(1, dtype=torch.bfloat16), k_row_stride=8 * 128,
                  cos=torch.empty(1, dtype=torch.bfloat16), cos_row_stride=128,
                  sin=torch.empty(1, dtype=torch.bfloat16), sin_row_stride=128, sl=512, bs=1, cos_bs=1,
                  n_qh=32, n_kh=8, hd=128, pad_n_qh=32, pad_n_kh=8, pad_hd=128, pad_rd=128, rd=128, BLOCK_SIZE=32,
                  BACKWARD_PASS=False)
    constexprs = {n for n, p in zip(names, _triton_rope.params) if p.is_constexpr}
    return compile_specialised(_triton_rope, values, constexprs, 4, sass)  # num_warps: its wrapper's default


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sass", action="store_true", help="count SASS instructions too (cuobjdump on PATH)")
    args = parser.parse_args()
    print(f"Triton {triton.__version__}, sm_90")
    for label, plan, pointers in small_cases():
        row = compile_plan(plan, pointers, args.sass)
        print(f"ropekit v4  {label:50s} {row['param_bytes']:4d} bytes  {' '.join(row['params'])}"
              + (f"  ({row['sass_instructions']} SASS instructions)" if args.sass else ""))
    row = liger_params(args.sass)
    if row is not None:
        print(f"liger       {'small prefill b1 s512 (always in place)':50s} {row['param_bytes']:4d} bytes  "
              f"{' '.join(row['params'])}" + (f"  ({row['sass_instructions']} SASS instructions)" if args.sass else ""))


if __name__ == "__main__":
    main()
