"""Import ropekit before anything imports triton: on a machine without a GPU it switches on the Triton interpreter."""

import os

import ropekit  # noqa: F401  (side effect: ropekit.device decides CUDA vs TRITON_INTERPRET)
import pytest
import torch

DEVICE = ropekit.device.DEVICE
ON_GPU = DEVICE == "cuda"
# Under the interpreter every program is Python: keep CPU shapes small, run the large ones on the GPU.
FULL = ON_GPU or os.environ.get("ROPEKIT_FULL_TESTS") == "1"

gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (this run uses the Triton interpreter)")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
