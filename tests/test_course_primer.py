"""ropekit.course.primer: each of the primer's small kernels does what notebook 02 says, and the trap is a trap."""

import pytest
import torch

import ropekit
from ropekit.course import primer

DEVICE = ropekit.device.DEVICE


def test_gather_reads_a_block_of_pointers():
    x = torch.arange(10, dtype=torch.float32, device=DEVICE)
    out = torch.zeros(4, device=DEVICE)
    primer.gather_kernel[(1,)](x, out, 3, N=4)
    assert torch.equal(out, x[3:7])


def test_a_block_length_computed_in_the_kernel_must_be_declared_constexpr():
    row, half = torch.arange(8, dtype=torch.float32, device=DEVICE), torch.zeros(4, device=DEVICE)
    with pytest.raises(Exception, match="arange's arguments must be of type tl.constexpr"):
        primer.half_block_broken_kernel[(1,)](row, half, HEAD_DIM=8)
    primer.half_block_kernel[(1,)](row, half, HEAD_DIM=8)
    assert torch.equal(half, row[4:])


def test_masked_lanes_read_other_and_broadcasting_makes_an_outer_product():
    block = torch.zeros(8, device=DEVICE)
    primer.masked_load_kernel[(1,)](torch.arange(5, dtype=torch.float32, device=DEVICE), block, 5, BLOCK=8)
    assert block.tolist() == [0, 1, 2, 3, 4, -1, -1, -1]
    a, b = torch.rand(4, device=DEVICE), torch.rand(8, device=DEVICE)
    table = torch.zeros(4, 8, device=DEVICE)
    primer.outer_kernel[(1,)](a, b, table, M=4, N=8)
    assert torch.equal(table, torch.outer(a, b))


def test_cast_rounds_once():
    x = torch.randn(16, device=DEVICE).to(torch.bfloat16)
    y = torch.empty_like(x)
    primer.cast_kernel[(1,)](x, y, N=16)
    assert torch.equal(y, (x.float() * 3.0).to(torch.bfloat16))


@pytest.mark.skipif(not ropekit.device.INTERPRET, reason="device_print reaches Python's stdout only in the interpreter")
def test_debug_demo_prints_one_line_per_program(capsys):
    primer.debug_demo()
    printed = capsys.readouterr().out
    assert "(0, 0, 0)" in printed and "(1, 0, 0)" in printed and "4. 5. 6. 7." in printed
