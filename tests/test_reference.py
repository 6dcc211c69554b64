"""Spec for ropekit.reference: the float64 references agree with each other and with the math they stand for.

The references are the yardstick for every kernel, so they are checked here against independent ways of writing the
same rotation: complex numbers ``x * e^{iθ}`` (the RoFormer paper), explicit 2x2 rotation matrices, Hugging Face's
``x * cos + rotate_half(x) * sin``, autograd, and the algebraic properties a rotation must have (orthogonality, the
inverse, composition, dependence of q·k on m − n only). Pure CPU and float64, no Triton; the whole file runs in seconds.
"""

import itertools
import math

import pytest
import torch

from ropekit import reference as ref
from ropekit.frequencies import cos_sin_at, inverse_frequencies

EXACT = dict(rtol=1e-12, atol=1e-12)  # two float64 formulas of the same rotation differ by a few ulps
BATCH, SEQLEN, HEADS = 2, 5, 3

HEAD_DIMS = [pytest.param(2, id="d2"), pytest.param(8, id="d8"), pytest.param(64, id="d64")]
BASES = [pytest.param(10000.0, id="base1e4"), pytest.param(1e6, id="base1e6")]
PAIRINGS = [pytest.param(False, id="neox"), pytest.param(True, id="gptj")]
# (head_dim, rotary_dim): full rotary, half (GPT-NeoX / Phi style), a quarter (GPT-J 6B: 64 of 256), two channels.
ROTARY_SPLITS = [pytest.param(16, 16, id="full16"), pytest.param(16, 8, id="rot8of16"),
                 pytest.param(32, 8, id="rot8of32"), pytest.param(16, 2, id="rot2of16")]
# Start positions: zero, small, and far out where float32 angles would already be wrong (float64 is exact here).
OFFSETS = [pytest.param(0, id="offset0"), pytest.param(7, id="offset7"), pytest.param(1_000_000, id="offset1e6")]


def head_vectors(*token_shape, head_dim, dtype=torch.float64):
    return torch.randn(*token_shape, HEADS, head_dim, dtype=dtype)


def positions(offset=0):
    return ref.token_positions(BATCH, SEQLEN, offsets=offset)


def neox_to_gptj_channels(rotary_dim, head_dim):
    """Channel order that turns a NeoX head vector into a GPT-J one: pair i = (i, i + r/2) lands on (2i, 2i + 1)."""
    half = rotary_dim // 2
    pairs = torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1).flatten()
    return torch.cat((pairs, torch.arange(rotary_dim, head_dim)))


# ------------------------------------------------------------------------------------------------------------------
# Three ways to write the GPT-J rotation, two ways to write the NeoX one, and how the two pairings relate
# ------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_complex_form_equals_rotation_matrices_equals_rope_interleaved(head_dim, base, offset):
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=head_dim), positions(offset)
    as_complex = ref.rope_complex(x, pos, base=base)
    as_matrices = ref.rope_matrix(x, pos, base=base)
    as_rope = ref.rope(x, pos, base=base, interleaved=True)
    torch.testing.assert_close(as_complex, as_matrices, **EXACT)
    torch.testing.assert_close(as_rope, as_complex, **EXACT)


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_rotate_half_form_equals_rope_neox(head_dim, base, offset):
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=head_dim), positions(offset)
    torch.testing.assert_close(ref.rope(x, pos, base=base), ref.rope_rotate_half(x, pos, base=base), **EXACT)


def test_rotate_half_swaps_halves_with_a_sign():
    x = torch.arange(1.0, 7.0)
    assert ref.rotate_half(x).tolist() == [-4.0, -5.0, -6.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("head_dim, rotary_dim", ROTARY_SPLITS)
def test_neox_equals_gptj_after_permuting_channels(head_dim, rotary_dim):
    # The two pairings are the same rotation of differently ordered channels: permute the input, rotate GPT-J style,
    # and you get the NeoX result permuted the same way. (This is why checkpoints convert by permuting q/k weights.)
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=head_dim), positions(3)
    order = neox_to_gptj_channels(rotary_dim, head_dim)
    neox = ref.rope(x, pos, rotary_dim=rotary_dim, interleaved=False)
    gptj = ref.rope(x[..., order], pos, rotary_dim=rotary_dim, interleaved=True)
    torch.testing.assert_close(gptj, neox[..., order], **EXACT)


def test_the_two_pairings_differ_without_the_permutation():
    # Guards the test above: if both flags did the same thing it would pass trivially.
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=8), positions(3)
    gap = (ref.rope(x, pos, interleaved=False) - ref.rope(x, pos, interleaved=True)).abs().max()
    assert gap > 0.1


# ------------------------------------------------------------------------------------------------------------------
# Partial rotary
# ------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("interleaved", PAIRINGS)
@pytest.mark.parametrize("head_dim, rotary_dim", ROTARY_SPLITS)
def test_partial_rotary_rotates_the_head_and_passes_the_tail_through(head_dim, rotary_dim, interleaved):
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=head_dim), positions(5)
    out = ref.rope(x, pos, rotary_dim=rotary_dim, interleaved=interleaved)
    assert out.shape == x.shape
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])  # bit for bit, not merely close
    # The rotated part is a full rope of rotary_dim channels: frequencies use rotary_dim, not head_dim.
    alone = ref.rope(x[..., :rotary_dim].contiguous(), pos, interleaved=interleaved)
    torch.testing.assert_close(out[..., :rotary_dim], alone, **EXACT)


@pytest.mark.parametrize("rotary_dim", [pytest.param(7, id="odd"), pytest.param(18, id="wider_than_head")])
def test_rotary_dim_must_be_even_and_fit_the_head(rotary_dim):
    with pytest.raises(ValueError, match="rotary_dim"):
        ref.rope(head_vectors(1, 1, head_dim=16), torch.zeros(1, 1, dtype=torch.int64), rotary_dim=rotary_dim)


# ------------------------------------------------------------------------------------------------------------------
# Every way of giving positions agrees with explicit per-token position ids
# ------------------------------------------------------------------------------------------------------------------

def test_scalar_offset_means_every_sequence_starts_there():
    expected = torch.tensor([[4, 5, 6], [4, 5, 6]])
    assert torch.equal(ref.token_positions(2, 3, offsets=4), expected)


def test_per_sequence_offsets_shift_each_row():
    expected = torch.tensor([[0, 1, 2], [9, 10, 11], [3, 4, 5]])
    assert torch.equal(ref.token_positions(3, 3, offsets=torch.tensor([0, 9, 3])), expected)


def test_position_ids_win_over_offsets_and_broadcast_over_batch():
    ids = torch.tensor([[5, 2, 2, 8]])  # any integers: repeats and jumps are allowed (e.g. M-RoPE, packed docs)
    assert torch.equal(ref.token_positions(2, 4, offsets=100, position_ids=ids), ids.expand(2, 4))


def test_varlen_positions_restart_at_each_sequence_boundary():
    cu_seqlens = torch.tensor([0, 3, 4, 4, 8])  # lengths 3, 1, 0, 4
    assert ref.varlen_positions(cu_seqlens).tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    offsets = torch.tensor([10, 20, 30, 40])
    assert ref.varlen_positions(cu_seqlens, offsets=offsets).tolist() == [10, 11, 12, 20, 40, 41, 42, 43]


def rope_token_by_token(x, position_rows, **kwargs):
    """The explicit form: every token rotated on its own at its own position id (shape (1, 1))."""
    out = torch.empty(x.shape, dtype=torch.float64)
    for index in itertools.product(*map(range, position_rows.shape)):
        token = x[index].reshape(1, 1, *x.shape[-2:])
        out[index] = ref.rope(token, position_rows[index].reshape(1, 1), **kwargs)[0, 0]
    return out


OFFSET_FORMS = [
    pytest.param(0, id="no_offset"),
    pytest.param(6, id="scalar_offset"),
    pytest.param(torch.tensor([3, 1000]), id="per_sequence_offsets"),
]


@pytest.mark.parametrize("interleaved", PAIRINGS)
@pytest.mark.parametrize("offsets", OFFSET_FORMS)
def test_offsets_agree_with_explicit_position_ids(offsets, interleaved):
    x = head_vectors(BATCH, SEQLEN, head_dim=8)
    explicit_ids = torch.arange(SEQLEN).expand(BATCH, SEQLEN) + torch.as_tensor(offsets).reshape(-1, 1)
    batched = ref.rope(x, ref.token_positions(BATCH, SEQLEN, offsets=offsets), interleaved=interleaved)
    torch.testing.assert_close(batched, rope_token_by_token(x, explicit_ids, interleaved=interleaved), **EXACT)


@pytest.mark.parametrize("interleaved", PAIRINGS)
def test_arbitrary_position_ids_agree_with_token_by_token(interleaved):
    x = head_vectors(BATCH, SEQLEN, head_dim=8)
    ids = torch.tensor([[0, 0, 7, 3, 65535], [1, 2, 3, 4, 5]])
    torch.testing.assert_close(ref.rope(x, ids, interleaved=interleaved),
                               rope_token_by_token(x, ids, interleaved=interleaved), **EXACT)


VARLEN_CASES = [
    pytest.param([0, 3, 4, 9], 0, id="three_seqs"),
    pytest.param([0, 2, 2, 7], torch.tensor([5, 0, 11]), id="empty_seq_with_offsets"),
    pytest.param([0, 6], 1_000_000, id="one_seq_far_out"),
]


@pytest.mark.parametrize("interleaved", PAIRINGS)
@pytest.mark.parametrize("cu_seqlens, offsets", VARLEN_CASES)
def test_varlen_packed_equals_each_sequence_on_its_own(cu_seqlens, offsets, interleaved):
    # Packed (tokens, heads, head_dim) with cu_seqlens must give what each sequence gives as its own batch of one.
    total = cu_seqlens[-1]
    x = head_vectors(total, head_dim=8)
    packed = ref.rope(x, ref.varlen_positions(cu_seqlens, offsets=offsets), interleaved=interleaved)
    per_seq_offsets = torch.as_tensor(offsets).expand(len(cu_seqlens) - 1)
    for j, (start, end) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        alone = ref.rope(x[None, start:end], ref.token_positions(1, end - start, offsets=per_seq_offsets[j]),
                         interleaved=interleaved)[0]
        torch.testing.assert_close(packed[start:end], alone, **EXACT)


# ------------------------------------------------------------------------------------------------------------------
# Backward
# ------------------------------------------------------------------------------------------------------------------

CONFIGS = [  # keyword arguments shared by forward and backward
    pytest.param(dict(), id="neox"),
    pytest.param(dict(interleaved=True), id="gptj"),
    pytest.param(dict(rotary_dim=8), id="neox_rot8of16"),
    pytest.param(dict(rotary_dim=4, interleaved=True), id="gptj_rot4of16"),
    pytest.param(dict(base=1e6, conjugate=True), id="neox_conjugate_base1e6"),
    pytest.param(dict(attention_scaling=1.25), id="neox_scaled"),
]


@pytest.mark.parametrize("config", [c for c in CONFIGS if "attention_scaling" not in c.values[0]])
def test_backward_undoes_the_forward(config):
    # A rotation is orthogonal: its transpose (the backward) is its inverse, the rotation by -θ.
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=16), positions(1000)
    torch.testing.assert_close(ref.rope_backward(ref.rope(x, pos, **config), pos, **config), x, **EXACT)


@pytest.mark.parametrize("config", CONFIGS)
def test_backward_equals_autograd_of_the_forward(config):
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=16).requires_grad_(), positions(11)
    grad_out = torch.randn(x.shape, dtype=torch.float64)
    (autograd,) = torch.autograd.grad(ref.rope(x, pos, **config), x, grad_out)
    torch.testing.assert_close(ref.rope_backward(grad_out, pos, **config), autograd, **EXACT)


INDEPENDENT_FORMULAS = [
    pytest.param(ref.rope_matrix, dict(interleaved=True), id="gptj_vs_matrices"),
    pytest.param(ref.rope_complex, dict(interleaved=True), id="gptj_vs_complex"),
    pytest.param(ref.rope_rotate_half, dict(), id="neox_vs_rotate_half"),
]


@pytest.mark.parametrize("formula, config", INDEPENDENT_FORMULAS)
def test_backward_equals_autograd_of_an_independent_formula(formula, config):
    # Differentiating a different float64 formula of the same rotation, so a shared mistake cannot hide.
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=8).requires_grad_(), positions(42)
    grad_out = torch.randn(x.shape, dtype=torch.float64)
    (autograd,) = torch.autograd.grad(formula(x, pos), x, grad_out)
    torch.testing.assert_close(ref.rope_backward(grad_out, pos, **config), autograd, **EXACT)


@pytest.mark.parametrize("config", CONFIGS)
def test_reference_passes_gradcheck(config):
    x = head_vectors(1, 3, head_dim=16).requires_grad_()
    pos = ref.token_positions(1, 3, offsets=2)
    assert torch.autograd.gradcheck(lambda t: ref.rope(t, pos, **config), (x,))


# ------------------------------------------------------------------------------------------------------------------
# Hugging Face's full-width cos/sin
# ------------------------------------------------------------------------------------------------------------------

def full_width(half, interleaved):
    """HF's full-width layout: NeoX repeats the half table, GPT-J repeats each entry ([c0, c0, c1, c1, ...])."""
    return half.repeat_interleave(2, dim=-1) if interleaved else torch.cat((half, half), dim=-1)


@pytest.mark.parametrize("conjugate", [pytest.param(False, id="forward"), pytest.param(True, id="conjugate")])
@pytest.mark.parametrize("interleaved", PAIRINGS)
@pytest.mark.parametrize("head_dim, rotary_dim", ROTARY_SPLITS)
def test_full_width_cos_sin_equals_rope(head_dim, rotary_dim, interleaved, conjugate):
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=head_dim), positions(500)
    theta = ref.angles(pos, inverse_frequencies(rotary_dim))[..., None, :]  # (batch, seq, 1, rotary_dim/2)
    cos, sin = full_width(torch.cos(theta), interleaved), full_width(torch.sin(theta), interleaved)
    expected = ref.rope(x, pos, rotary_dim=rotary_dim, interleaved=interleaved, conjugate=conjugate)
    got = ref.rope_from_cos_sin(x, cos, sin, interleaved=interleaved, conjugate=conjugate)
    torch.testing.assert_close(got, expected, **EXACT)


@pytest.mark.parametrize("interleaved", PAIRINGS)
def test_full_width_cos_sin_from_the_float32_table_is_within_table_rounding(interleaved):
    # The kernels' tables are float32 rounded from float64 angles: the result is off by at most a few float32 ulps.
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=16), positions(1_000_000 - SEQLEN)
    cos_rows, sin_rows = cos_sin_at(pos, inverse_frequencies(16))  # = those rows of cos_sin_table(1_000_000, 16)
    cos = full_width(cos_rows, interleaved)[..., None, :]
    sin = full_width(sin_rows, interleaved)[..., None, :]
    torch.testing.assert_close(ref.rope_from_cos_sin(x, cos, sin, interleaved=interleaved),
                               ref.rope(x, pos, interleaved=interleaved), rtol=0, atol=1e-6)


def test_full_width_cos_sin_equals_transformers_apply_rotary_pos_emb():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    q, k = head_vectors(BATCH, SEQLEN, head_dim=16), head_vectors(BATCH, SEQLEN, head_dim=16)
    pos = positions(9)
    theta = ref.angles(pos, inverse_frequencies(16))
    cos, sin = full_width(torch.cos(theta), False), full_width(torch.sin(theta), False)  # (batch, seq, head_dim)
    # transformers wants (batch, heads, seq, head_dim) and unsqueezes cos/sin at dim 1.
    hf_q, hf_k = llama.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=1)
    torch.testing.assert_close(hf_q.transpose(1, 2), ref.rope(q, pos), **EXACT)
    torch.testing.assert_close(hf_k.transpose(1, 2), ref.rope(k, pos), **EXACT)


# ------------------------------------------------------------------------------------------------------------------
# Properties of the rotation
# ------------------------------------------------------------------------------------------------------------------

def score(q, k, m, n, **kwargs):
    """<R(m) q, R(n) k> for single head vectors q, k (shape (head_dim,))."""
    at = lambda v, p: ref.rope(v.reshape(1, 1, 1, -1), torch.tensor([[p]]), **kwargs).flatten()  # noqa: E731
    return torch.dot(at(q, m), at(k, n)).item()


@pytest.mark.parametrize("config", CONFIGS[:5])
@pytest.mark.parametrize("m, n", [pytest.param(5, 2, id="m5_n2"), pytest.param(2, 5, id="m2_n5"),
                                  pytest.param(300, 300, id="same_position"),
                                  pytest.param(70_000, 3, id="far_apart")])
def test_attention_score_depends_only_on_relative_position(m, n, config):
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    reference_score = score(q, k, m, n, **config)
    for shift in (1, 17, 123_456, -min(m, n)):
        assert math.isclose(score(q, k, m + shift, n + shift, **config), reference_score, rel_tol=1e-9, abs_tol=1e-9)
    # ... and it is q against k rotated by the relative angle: <R(m)q, R(n)k> = <q, R(n - m)k>.
    assert math.isclose(score(q, k, 0, n - m, **config), reference_score, rel_tol=1e-9, abs_tol=1e-9)


def test_attention_score_changes_with_relative_position():
    # Guards the test above: the score must actually depend on m - n.
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    assert abs(score(q, k, 5, 2) - score(q, k, 5, 3)) > 1e-3


@pytest.mark.parametrize("config", CONFIGS[:5])
def test_rotation_preserves_the_norm_of_every_pair(config):
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=16), positions(123)
    out = ref.rope(x, pos, **config)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), **EXACT)
    # Stronger: each pair keeps its own length (the rotation is block-diagonal).
    interleaved = config.get("interleaved", False)
    rotary_dim = config.get("rotary_dim", 16)
    half = rotary_dim // 2

    def pair_norm(v):
        first, second = (v[..., 0:rotary_dim:2], v[..., 1:rotary_dim:2]) if interleaved else \
            (v[..., :half], v[..., half:rotary_dim])
        return torch.hypot(first, second)

    torch.testing.assert_close(pair_norm(out), pair_norm(x), **EXACT)


@pytest.mark.parametrize("interleaved", PAIRINGS)
def test_position_zero_is_the_identity(interleaved):
    x = head_vectors(BATCH, SEQLEN, head_dim=16)
    assert torch.equal(ref.rope(x, torch.zeros(BATCH, SEQLEN, dtype=torch.int64), interleaved=interleaved), x)


@pytest.mark.parametrize("interleaved", PAIRINGS)
def test_rotations_compose_by_adding_positions(interleaved):
    x = head_vectors(BATCH, SEQLEN, head_dim=16)
    m, n = positions(40), positions(900)
    twice = ref.rope(ref.rope(x, m, interleaved=interleaved), n, interleaved=interleaved)
    torch.testing.assert_close(twice, ref.rope(x, m + n, interleaved=interleaved), **EXACT)


@pytest.mark.parametrize("interleaved", PAIRINGS)
def test_conjugate_is_the_rotation_at_negative_positions(interleaved):
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=16), positions(77)
    torch.testing.assert_close(ref.rope(x, pos, interleaved=interleaved, conjugate=True),
                               ref.rope(x, -pos, interleaved=interleaved), **EXACT)


@pytest.mark.parametrize("head_dim, rotary_dim", ROTARY_SPLITS)
def test_attention_scaling_multiplies_the_rotated_channels_only(head_dim, rotary_dim):
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=head_dim), positions(8)
    plain = ref.rope(x, pos, rotary_dim=rotary_dim)
    scaled = ref.rope(x, pos, rotary_dim=rotary_dim, attention_scaling=1.3)
    torch.testing.assert_close(scaled[..., :rotary_dim], 1.3 * plain[..., :rotary_dim], **EXACT)
    assert torch.equal(scaled[..., rotary_dim:], x[..., rotary_dim:])


def test_inv_freq_overrides_base():
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=16), positions(3)
    torch.testing.assert_close(ref.rope(x, pos, inv_freq=inverse_frequencies(16, 1e6)),
                               ref.rope(x, pos, base=1e6), **EXACT)


def test_dividing_frequencies_by_a_factor_is_position_interpolation():
    # Linear scaling: inv_freq / 4 at position p turns exactly as far as the default at position p / 4.
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=16), positions(6)
    torch.testing.assert_close(ref.rope(x, pos, inv_freq=inverse_frequencies(16) / 4),
                               ref.rope(x, pos.double() / 4), **EXACT)


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")])
def test_output_is_float64_of_the_exact_input_values(dtype):
    x, pos = head_vectors(BATCH, SEQLEN, head_dim=8, dtype=dtype), positions(2)
    out = ref.rope(x, pos)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref.rope(x.double(), pos), rtol=0, atol=0)
