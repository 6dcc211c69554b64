"""The norm's one-instruction reciprocal square root (h200/1-rsqrt-ab-tests/change.patch, not taken) against the
tree it was measured on (14a051d), compiled for sm_90 on a CPU: the instructions of one step of the backward's loop
(Qwen3's per-head norm at 1 x 8 heads, three stages; OLMo-2's over all heads at 1 x 32, four) and a thread's registers
of two forwards (the fused benchmark's QK-norm prefill, rope_and_cache on a packed qkv and a paged bf16 cache, at
4 x 16; OLMo-2's norm over all heads without a cache write at 1 x 32).
Run from the repository root: python docs/gpu-runs/backward-copies/cpu/rsqrt_counts.py"""
import re, shutil, subprocess, sys, tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]


def counts(tree):
    sys.path[:0] = [str(tree / "tools"), str(tree)]
    import compile_sm90 as c  # (answers torch.cuda.is_available while ropekit imports)
    import torch, triton
    from ropekit.positions import resolve_positions
    from ropekit.triton import fused, launch
    from ropekit.triton.configs import FusedConfig

    def compile_hinted(record):  # the JIT's divisibility hints, as a GPU compiles the launch
        return c.sass(c.compile_record(record, hints=True))

    def loop(text):  # the longest backward branch's body: the walk's steady-state step
        ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]
        bodies = [len([1 for x, _ in ins if int(b, 16) <= x <= a]) for a, t in ins
                  for b in re.findall(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", t) if int(b, 16) < a]
        return max(bodies)

    bf16 = torch.bfloat16
    out = [f"Triton {triton.__version__}"]
    for name, hq, hk, over, heads, stages in (("qwen3", 32, 8, False, 8, 3), ("olmo2", 32, 32, True, 32, 4)):
        q, gq, dq = (torch.empty(1, 64, hq, 128, dtype=bf16) for _ in range(3))
        k, gk, dk = (torch.empty(1, 64, hk, 128, dtype=bf16) for _ in range(3))
        w_q, w_k = (torch.empty((h if over else 1) * 128, dtype=bf16) for h in (hq, hk))
        with launch.recorded_launches() as records:
            fused.launch_fused(q, k, torch.empty(4096, 64), torch.empty(4096, 64), rotary_dim=128,
                               positions=resolve_positions(batch=1, seqlen=64, positions=None), out_q=dq, out_k=dk,
                               q_weight=w_q, k_weight=w_k, eps=1e-6, norm_over_heads=over, grad_q=gq, grad_k=gk,
                               config=FusedConfig(1, heads, 4, True, True, 16, stages))
        regs, text = compile_hinted(records[0])
        out.append(f"backward {name} 1 x {heads}, {stages} stages: {loop(text)} instructions a step, {regs} registers")
    qkv = torch.empty(1, 64, 48, 128, dtype=bf16)
    ids = resolve_positions(batch=1, seqlen=64, positions=torch.zeros(1, 64, dtype=torch.int64))
    w = torch.empty(128, dtype=bf16)
    with launch.recorded_launches() as records:
        fused.launch_fused(qkv[:, :, :32], qkv[:, :, 32:40], torch.empty(4096, 64), torch.empty(4096, 64),
                           positions=ids, rotary_dim=128, out_q=qkv[:, :, :32], v=qkv[:, :, 40:],
                           cache_mode=fused.CACHE_PAGED, slots=torch.empty(64, dtype=torch.int64), block_size=16,
                           cache_len=256, k_cache=torch.empty(16, 16, 8, 128, dtype=bf16),
                           v_cache=torch.empty(16, 16, 8, 128, dtype=bf16), q_weight=w, k_weight=w, eps=1e-6,
                           config=FusedConfig(4, 16, 4, True, True))
    out.append(f"forward QK-norm prefill 4 x 16 (paged bf16 cache): {compile_hinted(records[0])[0]} registers")
    q, oq, k, ok = (torch.empty(1, 64, 32, 128, dtype=bf16) for _ in range(4))
    w = torch.empty(4096, dtype=bf16)
    with launch.recorded_launches() as records:
        fused.launch_fused(q, k, torch.empty(4096, 64), torch.empty(4096, 64), positions=ids, rotary_dim=128,
                           out_q=oq, out_k=ok, q_weight=w, k_weight=w, eps=1e-6, norm=1, norm_over_heads=True,
                           config=FusedConfig(1, 32, 4, True, True))
    out.append(f"forward OLMo-2 norm 1 x 32 (no cache): {compile_hinted(records[0])[0]} registers")
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1:  # one tree, in a process of its own
        print("\n".join(counts(Path(sys.argv[1]))))
        sys.exit(0)
    with tempfile.TemporaryDirectory() as tmp:
        patched = HERE.parent / "h200/1-rsqrt-ab-tests/change.patch"
        for label, patch in (("14a051d", None), ("14a051d + change.patch", patched)):
            tree = Path(tmp) / label.split()[0 if patch is None else -1].replace(".", "_")
            tree.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", "14a051d", "ropekit"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            (tree / "tools").mkdir()  # this tree's compile tool (its hints), over the archived package
            shutil.copy(ROOT / "tools/compile_sm90.py", tree / "tools")
            if patch is not None:
                subprocess.run(["git", "apply", str(patch)], cwd=tree, check=True)
            print(f"== {label}")
            sys.stdout.flush()
            subprocess.run([sys.executable, __file__, str(tree)], check=True)
