"""k's e5m2 cache bytes: the kernel against the native backend, per forced config and float8 conversion."""
import sys, torch, ropekit
sys.path.insert(0, "tests")
import test_engines as E
from ropekit.triton import fused as F
from ropekit.triton.configs import FusedConfig
DEVICE = "cuda"
torch.manual_seed(0)
parts = E.quantise_parts(64, 32, 8, 64, 64, False)
for x in parts.values():
    x.copy_(torch.randn_like(x) * 4)
csc = E.cache_like_vllm(8192, 64, torch.float32)
pos = torch.randint(0, 8192, (64,), device=DEVICE)
native_fp8 = F.native_fp8
with ropekit.device.set_backend("native"):
    want = ropekit.rope_quantize_fp8(*parts.values(), csc, pos, True, torch.float8_e5m2, quant_scale_q=4.0,
                                     quant_scale_kv=8.0)
print("native k[0,0,:8]", want[1].view(torch.uint8)[0, 0, :8].tolist(), want[1][0, 0, :8].float().tolist())
for native in (True, False):
    F.native_fp8 = (lambda d: native_fp8(d)) if native else (lambda d: False)
    for config in (None, FusedConfig(1, 32, 4), FusedConfig(1, 8, 1), FusedConfig(1, 16, 4), FusedConfig(4, 8, 4)):
        with F.forced_fused_config(config):
            got = ropekit.rope_quantize_fp8(*parts.values(), csc, pos, True, torch.float8_e5m2, quant_scale_q=4.0,
                                            quant_scale_kv=8.0)
        torch.cuda.synchronize()
        for name, a, b in (("q", got[0], want[0]), ("k", got[1], want[1])):
            a8, b8 = a.view(torch.uint8), b.view(torch.uint8)
            bad = a8 != b8
            print("native" if native else "integer", config, name, "bad", int(bad.sum()), "inf",
                  int(a.float().isinf().sum()), "first", a8.reshape(-1, a8.shape[-1])[0, :8].tolist(), flush=True)
