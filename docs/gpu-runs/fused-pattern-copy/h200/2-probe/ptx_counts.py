"""The probe's copy kernels compiled for sm_90 on a machine without a GPU: per tile and load form, the layout
conversions (TTGIR), the barriers and the global loads and stores (PTX), and the shared memory a program takes.
usage (repository root): PYTHONPATH=TRITON_SITE python docs/gpu-runs/fused-pattern-copy/h200/2-probe/ptx_counts.py"""
import os, sys
import torch
torch.cuda.is_available = lambda: True  # ropekit decorates its kernels for a GPU; nothing runs
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, os.path.dirname(__file__))
import addr_probe as A

print("triton", triton.__version__)
sig = {"QKV": "*bf16", "KC": "*bf16", "VC": "*bf16", "SLOTS": "*i64", "n_tblocks": "i32", "stride_tok": "i32",
       "c": "fp32", "s": "fp32"}
for label, bs, bh, bhk, warps, inner, evict, mode, v_apart in A.COPIES:
    consts = dict(NQ=32, NK=8, D=128, BS=bs, BH=bh, BHK=bhk, INNER=inner, EVICT="evict_first" if evict else "",
                  MODE=mode, V_APART=v_apart)
    full = dict(sig, **{k: "constexpr" for k in consts})
    names = list(full)
    source = ASTSource(fn=A.addr_copy, signature=full, constexprs={(names.index(k),): v for k, v in consts.items()})
    k = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ptx = k.asm["ptx"]
    print(f"{label:45s} layout conversions {k.asm['ttgir'].count('convert_layout'):2d}, bar.sync "
          f"{ptx.count('bar.sync'):2d}, ld.global {ptx.count('ld.global'):2d}, st.global {ptx.count('st.global'):2d}, "
          f"shared {k.metadata.shared} B")
