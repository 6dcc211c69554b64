"""SASS of the fused forward kernel for the Llama-3-8B prefill cases (sm_90, compiled on a CPU). argv: root case... [--cfg s,h,w]"""
import collections, dataclasses, os, re, subprocess, sys, tempfile, inspect
root = sys.argv[1]
sys.path.insert(0, f"{root}/tools"); sys.path.insert(0, root)
import compile_sm90 as c  # noqa
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ropekit.triton import launch
from ropekit.triton.configs import FusedConfig
from ropekit.triton.fused import forced_fused_config
from ropekit.bench import fused as F, fused_cases as FC

def _attrs(value, path, attrs):
    if isinstance(value, torch.Tensor):
        attrs[path] = [["tt.divisibility", 16]]
    elif type(value) is int and value != 1 and value % 16 == 0:
        attrs[path] = [["tt.divisibility", 16]]
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            _attrs(v, path + (i,), attrs)

def compile_record(record):
    names = list(inspect.signature(record.kernel.fn).parameters)
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(names):
        value = record.arguments[name]
        if name in record.constexprs:
            signature[name] = "constexpr"; constants[(i,)] = value
        else:
            signature[name] = c._leaf(value, (i,), constants)
            _attrs(value, (i,), attrs)
    source = ASTSource(fn=record.kernel, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": record.num_warps})

BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
def sass(compiled):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.cubin"); open(p, "wb").write(compiled.asm["cubin"])
        text = subprocess.run([f"{BIN}/cuobjdump", "-sass", p], capture_output=True, text=True).stdout
        res = subprocess.run([f"{BIN}/cuobjdump", "-res-usage", p], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", res)
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", text)
    return int(regs.group(1)), ops, text

if __name__ == '__main__':
    cfg = FusedConfig(2, 16, 4, True, True)
    for a in sys.argv:
        if a.startswith("--cfg="):
            s, h, w = map(int, a[6:].split(",")); cfg = FusedConfig(s, h, w, True, True)
    cases = {x.name: x for x in FC.CASES}
    outdir = os.environ.get("SASS_OUT", "/tmp")
    for name in [a for a in sys.argv[2:] if not a.startswith("--")]:
        case = dataclasses.replace(cases[name], batch=1, seqlen=64)
        data = FC.make_data(case, "cpu", 0)
        fn = F._fused(data)
        with forced_fused_config(cfg), launch.recorded_launches() as recs:
            fn()
        for i, rec in enumerate(recs):
            regs, ops, text = sass(compile_record(rec))
            cnt = collections.Counter(ops)
            open(f"{outdir}/{name}.{i}.sass", "w").write(text)
            top = ", ".join(f"{k} {v}" for k, v in cnt.most_common(14))
            print(f"{name} launch {i} {rec.kernel.__name__ if hasattr(rec.kernel,'__name__') else rec.kernel.fn.__name__} regs {regs} instr {len(ops)}: {top}", flush=True)
