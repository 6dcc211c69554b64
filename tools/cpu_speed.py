"""Wall-clock time of one call on a CPU: the native backend, the Triton kernels in Triton's interpreter, and the same
math written as eager PyTorch (transformers' ``x * cos + rotate_half(x) * sin``; the cache write as ``index_copy_``).

    python tools/cpu_speed.py [--repeats 5] [--no-interpreter]

Cases: ``apply_rope`` on a 1x512 bf16 prefill (q 32 heads, k 8 heads, head_dim 128), and ``rope_and_cache`` on a
decode step of 64 sequences (the same heads, bf16, a paged cache). Each number is the median of ``--repeats`` calls
after one warm-up call (the interpreter: 3 calls at most), in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import ropekit


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up (first-call work: tables, compiled variants)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def eager_rope(q, k, cos_rows, sin_rows):
    """transformers' apply_rotary_pos_emb on (batch, seq, heads, head_dim) tensors."""
    cos_rows, sin_rows = cos_rows[:, :, None], sin_rows[:, :, None]
    return q * cos_rows + rotate_half(q) * sin_rows, k * cos_rows + rotate_half(k) * sin_rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-interpreter", action="store_true", help="time the native backend and eager PyTorch only")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    dtype = torch.bfloat16
    cos, sin = ropekit.cos_sin_table(8192, 128)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {args.repeats} calls, ms")

    # apply_rope: a 1x512 prefill
    q, k = torch.randn(1, 512, 32, 128, dtype=dtype), torch.randn(1, 512, 8, 128, dtype=dtype)
    rows = torch.arange(512)
    cos_rows = torch.cat((cos[rows], cos[rows]), -1)[None].to(dtype)
    sin_rows = torch.cat((sin[rows], sin[rows]), -1)[None].to(dtype)
    prefill = {backend: (lambda b=backend: ropekit.apply_rope(q, k, cos, sin, backend=b)) for backend in
               ropekit.device.BACKENDS}
    prefill["eager PyTorch"] = lambda: eager_rope(q, k, cos_rows, sin_rows)

    # rope_and_cache: a decode step of 64 sequences into a paged cache
    q1, k1, v1 = (torch.randn(64, 1, h, 128, dtype=dtype) for h in (32, 8, 8))
    lengths = torch.randint(0, 8000, (64,))
    k_cache = torch.zeros(64 * 8192 // 16, 16, 8, 128, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.arange(64) * 8192 + lengths

    def fused(backend):
        with ropekit.device.set_backend(backend):
            ropekit.rope_and_cache(q1, k1, v1, cos, sin, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots,
                                   positions=lengths)

    def eager_decode():
        c = torch.cat((cos[lengths], cos[lengths]), -1)[:, None].to(dtype)
        s = torch.cat((sin[lengths], sin[lengths]), -1)[:, None].to(dtype)
        q_out, k_out = eager_rope(q1, k1, c, s)
        k_cache.view(-1, 8, 128).index_copy_(0, slots, k_out[:, 0])
        v_cache.view(-1, 8, 128).index_copy_(0, slots, v1[:, 0])
        return q_out

    decode = {backend: (lambda b=backend: fused(b)) for backend in ropekit.device.BACKENDS}
    decode["eager PyTorch"] = eager_decode

    for title, calls in (("apply_rope 1x512 bf16 (32 q / 8 kv heads x 128)", prefill),
                         ("rope_and_cache decode b64 bf16 (paged)", decode)):
        print(title)
        for name, fn in calls.items():
            if name == "triton" and args.no_interpreter:
                continue
            repeats = min(args.repeats, 3) if name == "triton" and ropekit.device.INTERPRET else args.repeats
            label = "triton (interpreter)" if name == "triton" and ropekit.device.INTERPRET else name
            print(f"  {label:22s} {median_ms(fn, repeats):10.2f}")


if __name__ == "__main__":
    main()
