"""SASS of the flat kernel (compiled for sm_90 on a CPU, the JIT's divisibility hints). argv[1]: the repository root of the tree to compile; each line: a hash of the SASS text, the launch, registers, instruction count, loads and stores."""
import collections, os, re, subprocess, sys, tempfile, inspect
root = sys.argv[1]
sys.path.insert(0, f"{root}/tools"); sys.path.insert(0, root)
import compile_sm90 as c  # noqa
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ropekit.positions import resolve_positions
from ropekit.triton import launch
from ropekit.triton.configs import FlatConfig

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

cases = {"llama-bf16": (4, 4096, 32, 8, 128, torch.bfloat16), "fp32": (2, 2048, 32, 32, 64, torch.float32),
         "head96": (2, 64, 8, 8, 96, torch.bfloat16)}
for name, (B, S, HQ, HK, D, dt) in cases.items():
    for cfg in (FlatConfig(32 * 4 * 16 // dt.itemsize, 4), FlatConfig(32 * 4 * 16 // dt.itemsize, 4, paired=True),
                FlatConfig(32 * 4 * 16 // dt.itemsize, 4, streaming=True)):
        if cfg.paired and HQ != HK:
            continue
        q = torch.empty(B, S, HQ, D, dtype=dt); k = torch.empty(B, S, HK, D, dtype=dt)
        cos = torch.empty(8192, D // 2)
        for posarg in (None, torch.empty(B, dtype=torch.int64)):
            pos = resolve_positions(batch=B, seqlen=S, positions=posarg)
            with launch.recorded_launches() as recs:
                launch.rope_v4(q, k, cos, cos, out_q=torch.empty_like(q), out_k=torch.empty_like(k), positions=pos,
                               rotary_dim=D, config=cfg)
            regs, ops, text = sass(compile_record(recs[0]))
            cnt = collections.Counter(ops)
            mem = {o: n for o, n in cnt.items() if o.startswith(("LDG", "STG"))}
            import hashlib; print(hashlib.md5(re.sub(r"\s+", " ", text).encode()).hexdigest()[:10], f"{name:10s} {cfg} pos={'offsets' if posarg is not None else 'none'} regs={regs} sass={len(ops)} {mem}")
