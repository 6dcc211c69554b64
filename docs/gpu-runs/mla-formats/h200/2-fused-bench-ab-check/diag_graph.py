"""Why does the fp8_ds_mla CUDA-graph test see eager and replayed bytes differ? For each cache format (bf16, the ds
entry) and each q_pe form (a slice of q, contiguous): one eager call on clones against one graph replay on the
originals, and each against the float64 rotation; which tensor, how many bytes, which tokens/heads differ."""
import sys
sys.path.insert(0, "tests")
import torch
import ropekit
from ropekit import reference as ref
from capture import cuda_graph_of
from test_fused_ds_mla import ds_case

torch.manual_seed(0)
for fmt in ("auto", "fp8_ds_mla"):
    for contiguous in (False, True):
        tokens, heads = 64, 128
        q_pe, k_pe, kv_c, cache, slots = ds_case(tokens, heads, 64, 512, torch.bfloat16, num_blocks=32, block_size=64)
        if fmt == "auto":
            cache = torch.randn(32, 64, 576, device="cuda").bfloat16()
        if contiguous:
            q_pe = q_pe.contiguous()
        cos, sin = ropekit.cos_sin_table(4096, 64, device="cuda")
        positions = torch.randint(0, 4096, (tokens,), device="cuda")

        def step(q_pe, k_pe, kv_cache):
            ropekit.mla_rope_and_cache(q_pe, k_pe, kv_c, kv_cache, slots, positions, cos, sin, kv_cache_dtype=fmt)

        graph = cuda_graph_of(lambda: step(q_pe, k_pe, cache))
        for replay in range(2):
            positions.copy_(torch.randint(0, 4096, (tokens,), device="cuda"))
            slots.copy_(torch.randperm(32 * 64, device="cuda")[:tokens])
            for x in (q_pe, k_pe, kv_c):
                x.copy_(torch.randn_like(x))
            q0, k0 = q_pe.clone(), k_pe.clone()
            eager = (q_pe.clone(), k_pe.clone(), cache.clone())
            step(*eager)
            eager2 = (q0.clone(), k0.clone(), eager[2].clone())
            graph.replay()
            torch.cuda.synchronize()
            want_q = ref.rope_table(q0, cos, sin, positions.cpu(), interleaved=True)
            for name, a, b in zip(("q_pe", "k_pe", "cache"), (q_pe, k_pe, cache), eager):
                same = torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                line = f"{fmt:11s} contiguous={contiguous} replay {replay} {name}: equal={same}"
                if not same:
                    d = (a.view(torch.uint8) != b.view(torch.uint8))
                    line += f" bytes differing {int(d.sum())} of {d.numel()}, first at {d.nonzero()[:3].tolist()}"
                    if name == "q_pe":
                        eg = (b.double().cpu() - want_q).abs().max().item()
                        gr = (a.double().cpu() - want_q).abs().max().item()
                        line += f"; max |eager - ref| {eg:.3g}, |graph - ref| {gr:.3g}; strides {tuple(a.stride())} {tuple(b.stride())}"
                print(line, flush=True)
