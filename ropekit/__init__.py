"""ropekit: Rotary Position Embedding kernels (Triton v1-v4, CUDA C++) and the course that builds them."""

from . import device  # first: decides CUDA vs the Triton interpreter before any kernel module imports triton

from . import frequencies, positions, reference
from . import triton

__version__ = "0.1.0"
