"""ropekit.te.apply_rotary_pos_emb: Transformer Engine's signature and semantics (sbhd/bshd/thd, interleaved,
start_positions, context parallelism, partial rotary, the backward), against a float64 reference written from TE's
documented contract: row p of ``freqs`` holds position p's angles, each sequence's tokens sit at
``start_positions[b] + s``, and with ``cp_size`` ranks a rank holds chunks ``cp_rank`` and ``2 cp_size - 1 - cp_rank``
of ``2 cp_size`` equal chunks of every sequence."""

import itertools

import pytest
import torch

import ropekit
from ropekit.te import apply_rotary_pos_emb
from ropekit.testing import assert_close_to_reference
from conftest import DEVICE


def te_freqs(head_dim, max_seq, rotary_percent=1.0, interleaved=False, base=10000.0):
    """Angles as TE's RotaryPositionEmbedding lays them out: (max_seq, 1, 1, rotary_dim), each pair's angle twice."""
    dim = int(head_dim * rotary_percent)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.arange(max_seq, dtype=torch.float32)[:, None] * inv_freq[None, :]
    doubled = torch.stack((angles, angles), -1).flatten(-2) if interleaved else torch.cat((angles, angles), -1)
    return doubled[:, None, None, :]


def rank_positions(length, cp_size, cp_rank, start=0):
    """The full-sequence positions of the tokens a rank holds of one sequence of ``length`` local tokens."""
    if cp_size == 1:
        return [start + s for s in range(length)]
    chunk = length // 2
    firsts = [cp_rank * chunk + s for s in range(chunk)]
    seconds = [(2 * cp_size - 1 - cp_rank) * chunk + s for s in range(chunk)]
    return [start + p for p in firsts + seconds]


def reference(x, freqs, positions, interleaved):
    """x (..., heads, head_dim) rotated in float64 by freqs rows ``positions`` (x's leading shape)."""
    angles = freqs[:, 0, 0, :].double()[positions][..., None, :]
    d2 = angles.shape[-1]
    x64 = x.detach().double().cpu()
    rot, rest = x64[..., :d2], x64[..., d2:]
    if interleaved:
        turned = torch.stack((-rot[..., 1::2], rot[..., 0::2]), -1).flatten(-2)
    else:
        turned = torch.cat((-rot[..., d2 // 2:], rot[..., :d2 // 2]), -1)
    return torch.cat((rot * angles.cos() + turned * angles.sin(), rest), -1)


CASES = list(itertools.product(("sbhd", "bshd", "thd"), (False, True), (False, True), (1, 2), (1.0, 0.5),
                               (torch.float32, torch.bfloat16)))


@pytest.mark.parametrize("fmt, interleaved, starts, cp_size, percent, dtype", CASES)
def test_matches_transformer_engines_contract(fmt, interleaved, starts, cp_size, percent, dtype):
    g = torch.Generator().manual_seed(len(fmt) + 2 * interleaved + 4 * starts + 8 * cp_size)
    heads, head_dim, batch = 2, 16, 3
    freqs = te_freqs(head_dim, 64, percent, interleaved).to(DEVICE)
    start = torch.randint(0, 8, (batch,), generator=g) if starts else torch.zeros(batch, dtype=torch.int64)
    for cp_rank in range(cp_size):
        if fmt == "thd":
            lengths = [4 * cp_size, 8 * cp_size, 2 * cp_size]  # every sequence splits into 2 cp_size chunks
            cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
            local = [n // cp_size for n in lengths]
            t = torch.randn(sum(local), heads, head_dim, generator=g).to(dtype).to(DEVICE)
            positions = torch.tensor(sum((rank_positions(n, cp_size, cp_rank, int(s)) for n, s in zip(local, start)),
                                         []))
            got = apply_rotary_pos_emb(t, freqs, "thd", start.to(DEVICE) if starts else None, interleaved,
                                       cu_seqlens=cu.to(DEVICE), cp_size=cp_size, cp_rank=cp_rank)
            want = reference(t, freqs.cpu(), positions, interleaved)
        else:
            seq = 6
            t = torch.randn(batch, seq, heads, head_dim, generator=g).to(dtype).to(DEVICE)
            positions = torch.tensor([rank_positions(seq, cp_size, cp_rank, int(s)) for s in start])
            want = reference(t, freqs.cpu(), positions, interleaved)
            if fmt == "sbhd":
                t, want = t.transpose(0, 1).contiguous(), want.transpose(0, 1)
            got = apply_rotary_pos_emb(t, freqs, fmt, start.to(DEVICE) if starts else None, interleaved,
                                       cp_size=cp_size, cp_rank=cp_rank)
        assert got.shape == t.shape and got.dtype == t.dtype
        assert_close_to_reference(got, want)


def test_the_backward_rotates_the_gradient_back():
    freqs = te_freqs(16, 32).to(DEVICE)
    t = torch.randn(5, 2, 2, 16, device=DEVICE, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: apply_rotary_pos_emb(x, freqs, "sbhd", cp_size=1), (t,))


def test_a_non_contiguous_input_is_read_through_its_strides():
    freqs = te_freqs(16, 32).to(DEVICE)
    t = torch.randn(6, 2, 16, 2, device=DEVICE).transpose(2, 3)  # sbhd (6, 2, 2, 16), channels strided
    got = apply_rotary_pos_emb(t, freqs, "sbhd")
    want = reference(t.transpose(0, 1), freqs.cpu(), torch.arange(6).expand(2, 6), False).transpose(0, 1)
    assert_close_to_reference(got, want)


@pytest.mark.parametrize("change, error, words", [
    (dict(tensor_format="bhsd"), ValueError, "tensor_format"),
    (dict(freqs="3-d"), ValueError, "freqs"),
    (dict(cp_size=2, cp_rank=2), ValueError, "cp_rank"),
    (dict(tensor_format="thd"), ValueError, "cu_seqlens"),
    (dict(start_positions="past freqs"), ValueError, "freqs has 32 rows"),
    (dict(start_positions="one per sequence"), ValueError, "start_positions"),
    (dict(start_positions="float"), ValueError, "start_positions"),
])
def test_errors_name_the_argument(change, error, words):
    freqs = te_freqs(16, 32).to(DEVICE)
    call = dict(t=torch.randn(4, 2, 2, 16, device=DEVICE), freqs=freqs)
    swaps = {"3-d": freqs[:, 0], "float": torch.zeros(2, device=DEVICE),
             "past freqs": torch.tensor([0, 29], device=DEVICE), "one per sequence": torch.tensor([0, 1, 2],
                                                                                                device=DEVICE)}
    call.update({k: swaps.get(v, v) if isinstance(v, str) and k != "tensor_format" else v for k, v in change.items()})
    if call.get("tensor_format") == "thd":
        call["t"] = call["t"][:, 0]
    with pytest.raises(error, match=words):
        apply_rotary_pos_emb(**call)


@pytest.mark.parametrize("fmt, start_positions, cu_seqlens, cp_size, words", [
    ("bshd", [0, -3], None, 1, "start_positions must be >= 0"),
    ("thd", [2, -1], [0, 4, 8], 1, "start_positions must be >= 0"),
    ("thd", None, [0, 6, 4, 8], 1, "cu_seqlens must start at 0 and never decrease"),
    ("thd", None, [2, 4, 8], 1, "cu_seqlens must start at 0"),
    ("thd", None, [0, 4, 12], 1, "cu_seqlens must end at"),      # 12 tokens, t holds 8
    ("thd", None, [0, 4, 6], 1, "cu_seqlens must end at"),       # 6 tokens, t holds 8
    ("thd", None, [0, 8, 14, 16], 2, "divisible by 2 \\* cp_size"),  # 6 tokens on 2 ranks: no 4 equal chunks
    ("thd", None, [0.0, 8.0], 1, "cu_seqlens must be"),
    ("thd", [0, 0, 0], [0, 8, 16], 2, "start_positions must hold one position a sequence"),
    ("bshd", [0, 0, 0], None, 1, "start_positions must hold one position a sequence"),
    ("bshd", "meta", None, 1, "start_positions is a meta tensor"),
    ("thd", None, "meta", 1, "cu_seqlens is a meta tensor"),
], ids=["negative-start", "negative-start-thd", "decreasing", "not-from-0", "past-the-tokens", "short-of-the-tokens",
        "not-divisible", "float", "starts-per-sequence-cp", "starts-per-sequence", "meta-starts", "meta-cu-seqlens"])
def test_start_positions_and_cu_seqlens_values_are_refused_outside_check_mode(fmt, start_positions, cu_seqlens,
                                                                              cp_size, words, monkeypatch):
    """TE reads both on the host; so does ropekit, and refuses what would rotate by a NaN row or past the tokens."""
    monkeypatch.delenv("ROPEKIT_CHECK", raising=False)
    freqs = te_freqs(16, 32).to(DEVICE)
    t = torch.randn(*((8,) if fmt == "thd" else (2, 4)), 2, 16, device=DEVICE)
    meta = torch.zeros(2, dtype=torch.int64, device="meta")
    starts = meta if start_positions == "meta" else None if start_positions is None else \
        torch.tensor(start_positions, device=DEVICE)
    cu = torch.zeros(3, dtype=torch.int64, device="meta") if cu_seqlens == "meta" else None if cu_seqlens is None else \
        torch.tensor(cu_seqlens, device=DEVICE)
    before = t.clone()
    with pytest.raises(ValueError, match=words):
        apply_rotary_pos_emb(t, freqs, fmt, starts, cu_seqlens=cu, cp_size=cp_size)
    assert torch.equal(t, before)


def test_cu_seqlens_is_ignored_outside_thd_as_te_does():
    """TE's attention passes cu_seqlens whatever the format; bshd and sbhd do not read it."""
    freqs = te_freqs(16, 32).to(DEVICE)
    t = torch.randn(2, 6, 2, 16, device=DEVICE)
    assert torch.equal(apply_rotary_pos_emb(t, freqs, "bshd", cu_seqlens=torch.tensor([0, 6, 12], device=DEVICE)),
                       apply_rotary_pos_emb(t, freqs, "bshd"))


@pytest.mark.parametrize("interleaved", [False, True])
def test_check_mode_refuses_freqs_whose_two_copies_of_an_angle_differ(monkeypatch, interleaved):
    """One angle per pair is read; a freqs TE's RotaryPositionEmbedding would never make (the copies differ) is
    refused under ROPEKIT_CHECK=1 rather than rotated by its first copy, and accepted when the copies agree."""
    t = torch.randn(4, 1, 1, 8, device=DEVICE)
    angles = torch.rand(8, 1, 1, 4, device=DEVICE)
    same = (torch.repeat_interleave(angles, 2, dim=-1) if interleaved else torch.cat([angles, angles], dim=-1))
    monkeypatch.setenv("ROPEKIT_CHECK", "1")
    ropekit.te.apply_rotary_pos_emb(t, same, interleaved=interleaved)
    different = same.clone()
    different[..., -1] += 0.5
    with pytest.raises(ValueError, match="freqs must hold each pair's angle twice"):
        ropekit.te.apply_rotary_pos_emb(t, different, interleaved=interleaved)


def test_a_freqs_changed_in_place_or_replaced_rotates_by_its_new_angles():
    """The tables derived from freqs are reused while the tensor and its version stay: changed in place, or a new
    tensor in its place (an id may be reused once a tensor dies), the rotation follows the angles it is given."""
    t = torch.randn(6, 2, 3, 16, device=DEVICE)
    positions = torch.arange(6)[:, None].expand(6, 2)
    freqs = te_freqs(16, 8).to(DEVICE)
    for _ in range(2):  # the same tensor twice
        assert_close_to_reference(apply_rotary_pos_emb(t, freqs), reference(t, freqs.cpu(), positions, False))
    freqs.mul_(3.0)  # in place: a new version
    assert_close_to_reference(apply_rotary_pos_emb(t, freqs), reference(t, freqs.cpu(), positions, False))
    for scale in (0.5, 2.0, 0.25):  # fresh tensors, the previous one dropped first (its id is then often reused)
        del freqs
        freqs = te_freqs(16, 8).to(DEVICE) * scale
        assert_close_to_reference(apply_rotary_pos_emb(t, freqs), reference(t, freqs.cpu(), positions, False))
