"""The launch-chain floor: what a decode call costs when its bytes cost nothing.

A decode step's RoPE moves about a megabyte, which the copy ceiling moves in well under a microsecond. What no decode
kernel avoids is a chain of dependent steps: the launch of a small grid, a load of each program's position, a load of
the table row at that position (its address depends on the first load), a store. This kernel is that chain and
nothing else: 64 programs, program ``i`` loads ``positions[i]`` (int64), then the 64-float row of an 8192-row float32
table at that position, and stores the row to ``out[i]``.

The benchmarks time it in the same run and on the same clock as the rows it bounds (captured in a CUDA graph of as
many calls as the case's rows, replayed in the same interleaved rounds, median), with its buffers reused every call
(L2-resident, like the small cases' L2 rows), and divide the decode rows by it.

On a GPU of compute capability 9.0 and later ropekit's small grids launch programmatically
(``ropekit.triton.groups.Dependency``: each waits for the grid before it, then lets the grid after it launch), which
takes part of the launch out of the chain. The same chain launched that way (``LaunchChain(..., dependent=True)``,
:data:`NAME_DEPENDENT`) is timed beside it, so that a decode row can be read against either: the floor above stays
the targets' floor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton.choice import launch_dependency
from ..triton.groups import Dependency
from ..triton.v4 import after_grid_before

__all__ = ["PROGRAMS", "ROW", "TABLE_ROWS", "METHOD", "NAME", "NAME_DEPENDENT", "METHOD_DEPENDENT",
           "launch_chain_kernel", "LaunchChain", "launch_chain", "dependent_launch_available", "floors"]

PROGRAMS, ROW, TABLE_ROWS = 64, 64, 8192
NAME = "launch-chain floor"
NAME_DEPENDENT = "launch-chain floor, PDL"
METHOD = (f"{PROGRAMS}-program Triton kernel: program i loads positions[i] (int64), then the {ROW}-float row of a "
          f"{TABLE_ROWS}-row float32 table at that position, and stores it to out[i]; buffers reused every call "
          "(L2-resident); graph replay in the case's interleaved rounds, median")
METHOD_DEPENDENT = (METHOD + "; launched programmatically, each program waiting for the grid before it, then "
                    "releasing the grid after it, as ropekit's small grids launch (compute capability 9.0 and later)")


@triton.jit
def launch_chain_kernel(positions_ptr, table_ptr, out_ptr, ROW: tl.constexpr, DEPENDENCY: tl.constexpr = 0):
    after_grid_before(DEPENDENCY)
    i = tl.program_id(0)
    position = tl.load(positions_ptr + i)  # the second load's address depends on this one: a chain
    columns = tl.arange(0, ROW)
    row = tl.load(table_ptr + position * ROW + columns)
    tl.store(out_ptr + i * ROW + columns, row)


def dependent_launch_available(device) -> bool:
    """Whether ropekit's small grids launch programmatically on ``device`` and release the grid after them (an NVIDIA
    GPU of compute capability 9.0 or later, ``ROPEKIT_PDL`` not 0, not the interpreter): only then is the chain
    launched that way a floor of ropekit's calls."""
    return launch_dependency(torch.device(device), (PROGRAMS, 1, 1), 1) == Dependency.RELEASE


def floors(device) -> tuple:
    """The chains a benchmark times beside a decode case on ``device``, as (name, method, dependent): the plain
    floor, then, where :func:`dependent_launch_available`, the same chain launched programmatically."""
    plain = ((NAME, METHOD, False),)
    return plain + ((NAME_DEPENDENT, METHOD_DEPENDENT, True),) if dependent_launch_available(device) else plain


class LaunchChain:
    """One buffer set of the chain (random positions below TABLE_ROWS, a random table) and its launch as a call;
    ``dependent``: launched programmatically (:data:`NAME_DEPENDENT`)."""

    def __init__(self, device, seed: int = 0, dependent: bool = False):
        generator = torch.Generator().manual_seed(seed)
        self.positions = torch.randint(0, TABLE_ROWS, (PROGRAMS,), generator=generator, dtype=torch.int64).to(device)
        self.table = torch.randn(TABLE_ROWS, ROW, generator=generator).to(device)
        self.out = torch.empty(PROGRAMS, ROW, device=device)
        self.options = dict(DEPENDENCY=Dependency.RELEASE, launch_pdl=True) if dependent else {}

    def __call__(self) -> torch.Tensor:
        launch_chain_kernel[(PROGRAMS,)](self.positions, self.table, self.out, ROW=ROW, num_warps=1, **self.options)
        return self.out

    def check(self) -> None:
        """Raise unless a call writes every row of ``out`` with the table row at its position."""
        self.out.fill_(float("nan"))
        got = self()
        if not torch.equal(got, self.table[self.positions]):
            raise RuntimeError("the launch-chain floor kernel wrote the wrong rows")


def launch_chain(device, seed: int = 0, dependent: bool = False) -> LaunchChain:
    """The floor's call on ``device``, run once and checked."""
    chain = LaunchChain(device, seed, dependent)
    chain.check()
    return chain
