"""ropekit.reliability.te_matrix: Transformer Engine's fused-rope parameter grid, and a slice of it run against the
float64 reference."""

import pytest
import torch

from ropekit import reference as ref
from ropekit.reliability import te_matrix
from ropekit.reliability.common import Unsupported, available_backends
from conftest import ON_GPU

BACKENDS = available_backends()[0]


def test_te_matrix_is_tes_parameter_grid():
    cases = te_matrix.te_cases(full=True)
    fixed = [c for c in cases if c.tensor_format != "thd"]
    # 3 dtypes x 2 seqs x 2 hidden x 2 rotary x 2 margins x 2 formats x 3 transposes x 2 pairings x 2 starts,
    # minus TE's skip (start positions need a margin): 1152 - 288; thd: 3 x 2 x 2 x 2 x 2 x 2.
    assert len(fixed) == 864 and len(cases) - len(fixed) == 96
    assert not any(c.start_positions and c.margin == 0 for c in cases)
    assert {c.seq_length for c in fixed} == {2048, 4096} and {c.transpose for c in fixed} == {None, (0, 1), (2, 3)}
    assert {c.rotary_dim for c in cases} == {64, 128, 256}


TE_SLICE = te_matrix.te_cases(full=False, seq_scale=64)  # sequences of 32 and 64 tokens under the interpreter
TE_SLICE = TE_SLICE[:6] if ON_GPU else TE_SLICE


@pytest.mark.parametrize("case", TE_SLICE, ids=[c.describe().replace(" ", "-") for c in TE_SLICE])
def test_te_matrix_slice_against_reference(case):
    # TE's dimensions (sequences divided by 64); forward, both loss shapes' gradients, contiguity
    outcome = te_matrix.run_te_case(case, BACKENDS, heads=2)
    for backend, result in outcome.items():
        if isinstance(result, Unsupported):
            continue
        assert not result, f"{backend}: {result}"


def test_reference_on_device_is_ref_rope_bit_for_bit():
    x = torch.randn(2, 7, 3, 40, dtype=torch.bfloat16)
    positions = ref.token_positions(2, 7, offsets=torch.tensor([3, 900]))
    for interleaved in (False, True):
        for conjugate in (False, True):
            want = ref.rope(x, positions, rotary_dim=24, interleaved=interleaved, conjugate=conjugate)
            got = te_matrix.reference_on_device(x, positions, rotary_dim=24, interleaved=interleaved,
                                                conjugate=conjugate)
            assert torch.equal(got, want)


def test_te_section_reports_rows_not_run_and_every_dimension():
    result = te_matrix.run_te_matrix(full=False, backends=("triton",), seq_scale=64, heads=2, budget_s=0)
    assert result["rows"] == result["te_cases"] == 0
    assert result["not_run"] == result["planned_rows"] == len(te_matrix.te_cases(full=False, seq_scale=64))
    assert set(result["dimensions"]["format"]) == {"sbhd", "bshd", "thd"}
