"""Print the Triton kernels torch.compile generates for the bench's eager formula (forward and backward) on one
case, with their launch parameters: what the torch-compile rows of docs/benchmarks.md run.

    python tools/inductor_code.py fp32 > inductor_fp32.txt
"""

from __future__ import annotations

import logging
import sys

import torch

from ropekit.bench.cases import select_cases
from ropekit.bench.impls import BACKWARD, make_impls
from ropekit.bench.inputs import make_data, make_tables


def main(case_name: str) -> None:
    torch._logging.set_logs(output_code=True)
    logging.getLogger("torch._inductor").handlers[:] = [logging.StreamHandler(sys.stdout)]
    case = select_cases(names=[case_name])[0]
    impl = next(i for i in make_impls(".peers") if i.name == "torch-compile")
    tables = make_tables(case, "cuda")
    data = make_data(case, "cuda", 1, backward=True)
    prepared = impl.build(case, tables, data, BACKWARD)  # the forward is recorded (and compiled) here
    prepared.fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32")
