"""The TMA copy kernels compiled for sm_90 on a machine without a GPU (Triton from PYTHONPATH): the bulk tensor
copies and mbarrier waits in the PTX, the shared memory a program takes. Run from the repository root:
PYTHONPATH=TRITON_SITE python docs/gpu-runs/fused-pattern-copy/h200/3-tma/ptx_counts.py (tma_probe.py imports
2-probe/addr_probe.py's check, so both folders go on the path)."""
import os, sys
import torch; torch.cuda.is_available = lambda: True
os.environ.pop("TRITON_INTERPRET", None)
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..", "2-probe")]
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import tma_probe as T
print(triton.__version__)
for label, bs, bh, bhk, w, st in T.TMAS:
    sig = {"qkv_desc": f"tensordesc<bf16[{bs}, 128]>", "row_desc": "tensordesc<bf16[1, 128]>",
           "kc_desc": "tensordesc<bf16[1, 128]>", "vc_desc": "tensordesc<bf16[1, 128]>", "SLOTS": "*i64"}
    consts = dict(NQ=32, NK=8, D=128, BS=bs, BH=bh, BHK=bhk, STAGES=st)
    full = dict(sig, **{k: "constexpr" for k in consts}); names = list(full)
    try:
        k = triton.compile(ASTSource(fn=T.tma_copy, signature=full, constexprs={(names.index(n),): v for n, v in consts.items()}),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": w})
        ptx = k.asm["ptx"]
        print("ok", label, "tma loads", ptx.count("cp.async.bulk.tensor"), "mbarrier waits", ptx.count("mbarrier.try_wait"), "shared", k.metadata.shared)
    except Exception as e:
        print("FAIL", label, type(e).__name__, str(e)[:400])
