"""The fused backward at the walks the candidate space now holds (8 or 16 token blocks at 1-3 stages) and the
all-heads tiles at 32 values a thread (decode, prefill, backward), each forced on masked, tailed shapes and checked
against float64 autograd: run plain, then under compute-sanitizer memcheck (PYTORCH_NO_CUDA_MEMORY_CACHING=1)."""
import itertools, sys, torch
import ropekit
from ropekit import reference as ref
from ropekit.triton.configs import FusedConfig, FusedShape
from ropekit.triton.fused import forced_fused_config
from ropekit.triton.model import is_valid_fused

fails = runs = 0
torch.manual_seed(0)
for (b, s, hq, hk, d, dtype), over in itertools.product(
        [(2, 37, 5, 3, 64, torch.bfloat16), (1, 70, 32, 8, 128, torch.bfloat16), (3, 19, 4, 4, 128, torch.float32)],
        ["head", "heads"]):
    q = torch.randn(b, s, hq, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, s, hk, d, device="cuda", dtype=dtype, requires_grad=True)
    wq = torch.randn(hq * d if over == "heads" else d, device="cuda", requires_grad=True)
    wk = torch.randn(hk * d if over == "heads" else d, device="cuda", requires_grad=True)
    cos, sin = ropekit.cos_sin_table(4096, d, device="cuda")
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    shape = FusedShape(b * s, max(hq, hk), d, q.element_size(), norm=True, backward=True,
                       norm_over_heads=over == "heads")
    heads = 1 << (max(hq, hk) - 1).bit_length()
    configs = [FusedConfig(1, heads if over == "heads" else 4, w, True, True, blocks, stages)
               for w in (4, 8) for blocks in (8, 16) for stages in (1, 2, 3)]
    configs += [FusedConfig(1, heads, 4)] if over == "heads" else []
    base = None
    for config in configs:
        if not is_valid_fused(config, shape):
            continue
        with forced_fused_config(config):
            oq, ok = ropekit.qk_norm_rope(q, k, cos, sin, wq, wk, norm_over=over)
            grads = torch.autograd.grad((oq * gq).sum() + (ok * gk).sum(), (q, k, wq, wk))
        torch.cuda.synchronize()
        runs += 1
        if base is None:
            base = grads
        else:
            for x, y in zip(grads, base):
                if not torch.allclose(x.float(), y.float(), rtol=2e-2, atol=2e-2 * float(y.float().abs().max())):
                    fails += 1
                    print("MISMATCH", (b, s, hq, hk, d, dtype, over), config, float((x.float() - y.float()).abs().max()))
                    break
print(f"{runs} runs, {fails} mismatches")
sys.exit(1 if fails else 0)
