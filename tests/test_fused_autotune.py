"""The fused ops' autotune on a GPU: a prefill past the L2 where the model is unsure is tuned on the call's own
tensors, once a bucket, and the call's result is the same as the model's choice would give, also in place (where every
candidate's launch rotates q and k again, so the autotune restores them before the call's own launch).

GPU only: under the interpreter the configurations are fixed and nothing is timed."""

import dataclasses
import json

import pytest
import torch

import ropekit
from ropekit.triton import choice
from ropekit.triton.launch import plans

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or ropekit.device.INTERPRET,
                                reason="the autotune times launches on a GPU only")

# past the L2 of any GPU ropekit knows (q and k of 4 x 4096 tokens, 16 or 32 q / 8 kv heads x 128 in bfloat16)
BATCH, SEQ, HKV, D, BLOCK = 4, 4096, 8, 128, 16


def _call(inplace: bool, HQ: int, seed: int = 0):
    plans.clear()  # a call of the same signature would reuse its plan, and with it the first call's choice
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(BATCH, SEQ, h, D, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (HQ, HKV, HKV))
    cos, sin = ropekit.cos_sin_table(SEQ, D, device="cuda")
    n_slots = BATCH * SEQ
    slots = torch.randperm(n_slots, device="cuda", generator=gen)
    caches = [torch.zeros(n_slots // BLOCK, BLOCK, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    q_in, k_in = q.clone(), k.clone()
    q_out, k_out = ropekit.rope_and_cache(q, k, v, cos, sin, k_cache=caches[0], v_cache=caches[1],
                                         slot_mapping=slots, inplace=inplace, write_k=True)
    return (q_in, k_in), (q_out.clone(), k_out.clone(), caches[0], caches[1])


# each case its own bucket (the heads differ): a bucket is tuned once a process
@pytest.mark.parametrize("inplace, heads_q", [(False, 32), (True, 16)], ids=["out-of-place", "in-place"])
def test_a_tuned_first_call_gives_what_the_models_choice_gives(tmp_path, monkeypatch, inplace, heads_q):
    monkeypatch.setenv("ROPEKIT_CACHE_DIR", str(tmp_path / "off"))
    monkeypatch.setenv("ROPEKIT_AUTOTUNE", "0")
    _, untuned = _call(inplace, heads_q)
    monkeypatch.setenv("ROPEKIT_CACHE_DIR", str(tmp_path / "on"))
    monkeypatch.delenv("ROPEKIT_AUTOTUNE")
    # a memory that asks more in flight than any tile keeps: the model is unsure, and the autotune decides
    facts = choice.device_facts("cuda")
    unsure = dataclasses.replace(facts, name=f"{facts.name} (unsure)", ceiling_gbps=100 * facts.ceiling_gbps)
    monkeypatch.setattr(choice, "device_facts", lambda device=None: unsure)
    (q_in, k_in), tuned = _call(inplace, heads_q)
    entries = json.loads(choice.cache_path().read_text())["entries"]
    assert any("|fused|" in key for key in entries), "the prefill bucket was not tuned"
    for name, a, b in zip(("q_out", "k_out", "k_cache", "v_cache"), untuned, tuned):
        # another tile may contract a multiply-add differently: one bfloat16 rounding apart at most, where a second
        # rotation would move values by their own size
        torch.testing.assert_close(b.float(), a.float(), rtol=2**-7, atol=2**-7, msg=f"{name}: tuned vs model")
    if inplace:  # rotated once, not once a candidate
        reference = ropekit.apply_rope(q_in, k_in, *ropekit.cos_sin_table(SEQ, D, device="cuda"))
        torch.testing.assert_close(tuned[0], reference[0], rtol=0, atol=0.05)
