"""The plan key's cost on a CPU: a fused call's key and its lookup (``fused.plan.keyed``, then ``PlanCache.find``)
for rope_and_cache's decode call (Llama-3-8B heads, b64, paged bf16: 9 tensors and 13 None of its 22 slots, 14
flags), built three ways: with each tensor's ``torch.device`` (the key before), with its index (``get_device()``,
the branch a GPU tensor takes; on a CPU it is forced), and as ``keyed`` builds it on these CPU tensors (index -1:
the device itself). Best of 7 repeats of 20,000 calls, three alternations. No GPU."""
import timeit
import torch
from ropekit.fused.plan import keyed
from ropekit.triton.launch import PlanCache

Tensor = torch.Tensor
bf16 = torch.bfloat16
qkv = torch.randn(64, 1, 48, 128, dtype=bf16)
q, k, v = qkv[:, :, :32], qkv[:, :, 32:40], qkv[:, :, 40:]
cos, sin = torch.randn(8192, 64), torch.randn(8192, 64)
caches = torch.zeros(2, 512, 16, 8, 128, dtype=bf16)
user = (q, k, v, cos, sin, torch.randint(0, 8192, (64, 1)), None, caches[0], caches[1],
        torch.randperm(8192)[:64], None, None, None, None, None, None, None, None, None, None, None, None)
flags = (1e-6, 0.0, None, "head", "bshd", False, None, True, None, False, False, "NHD", "auto", None)


def with_device(op, tensors, flags):
    key, at = [op], []
    for t in tensors:
        if t is None:
            key.append(None)
        elif isinstance(t, Tensor):
            key.append((t.shape, t.stride(), t.dtype, t.device))
            at.append(t.data_ptr())
        else:
            key.append((type(t), t))
    key += flags
    key += map(type, flags)
    return tuple(key), tuple(at)


def with_index(op, tensors, flags):  # keyed's branch, taken as on a GPU (a CPU tensor's index is -1)
    key, at = [op], []
    for t in tensors:
        if t is None:
            key.append(None)
        elif isinstance(t, Tensor):
            index = t.get_device()
            key.append((t.shape, t.stride(), t.dtype, index if index >= -1 else t.device))
            at.append(t.data_ptr())
        else:
            key.append((type(t), t))
    key += flags
    key += map(type, flags)
    return tuple(key), tuple(at)


cache = PlanCache(64)
ways = {"torch.device (before)": with_device, "index (a GPU's branch)": with_index, "keyed on CPU tensors": keyed}
for make in ways.values():
    cache.put(make("rope_and_cache", user, flags)[0], object())
for round_ in range(3):
    for name, make in ways.items():
        best = min(timeit.repeat(lambda: cache.find(make("rope_and_cache", user, flags)[0]), number=20000, repeat=7))
        print(f"round {round_}: {name:24s} {best / 20000 * 1e6:.3f} µs a key and its lookup")
