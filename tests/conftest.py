"""Import ropekit before anything imports triton: on a machine without a GPU it switches on the Triton interpreter.

Which backend a test runs: files that test the Triton kernels (``TRITON_FILES``) run them, in the interpreter without a
GPU; every other file runs on the process's default (the kernels on a GPU, the native PyTorch ops without one). A test
marked ``@pytest.mark.backend(name)`` runs on that one; a test that takes the ``backend`` fixture, once on each.
"""

import os
import warnings

import ropekit  # noqa: F401  (side effect: ropekit.device decides CUDA vs TRITON_INTERPRET)
import pytest
import torch

DEVICE = ropekit.device.DEVICE
ON_GPU = DEVICE == "cuda"
# Under the interpreter every program is Python: keep CPU shapes small, run the large ones on the GPU.
FULL = ON_GPU or os.environ.get("ROPEKIT_FULL_TESTS") == "1"

gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (this run uses the Triton interpreter)")

TRITON_FILES = ("test_v4.py", "test_launch.py", "test_triton_", "test_reliability_", "test_course", "test_bench_fused_tune.py")


def pytest_configure(config):
    config.addinivalue_line("markers", "backend(name): run the test on this backend ('native' or 'triton')")
    _retry_notebook_kernel_start()


def _retry_notebook_kernel_start(attempts: int = 3):
    """nbval's kernel start, retried. jupyter_client picks a kernel's five ZMQ ports by binding port 0 and letting go;
    the kernel binds them a moment later. Under ``pytest -n auto`` another worker's process (a second kernel, the
    site test's browser) can take one of those ports in between, and the kernel dies before it answers
    ``kernel_info``: every cell of that notebook then errors at setup without having run. A fresh start draws fresh
    ports; a kernel that dies ``attempts`` times in a row is a real failure and is raised as such. (Here, not in a
    conftest beside the notebooks: two conftest modules would share the name ``conftest`` the tests import from.)"""
    try:
        import nbval.kernel
    except ImportError:
        return
    start = nbval.kernel.start_new_kernel
    if getattr(start, "retried", False):
        return

    def retried(*args, **kwargs):
        for attempt in range(attempts):
            try:
                return start(*args, **kwargs)
            except RuntimeError as error:
                if attempt == attempts - 1:
                    raise
                # visible in the run's summary: a flaky start is retried, not hidden
                warnings.warn(f"a notebook kernel failed to start ({error}); starting another", stacklevel=2)

    retried.retried = True
    nbval.kernel.start_new_kernel = retried


@pytest.fixture(autouse=True)
def _backend_of_the_test(request):
    marker = request.node.get_closest_marker("backend")
    if marker is None and request.node.path.name.startswith(TRITON_FILES):
        marker = pytest.mark.backend("triton").mark
    if marker is None:
        yield
    else:
        with ropekit.device.set_backend(marker.args[0]):
            yield


@pytest.fixture(params=ropekit.device.BACKENDS)
def backend(request):
    """The test runs once on each backend: the native PyTorch ops and the Triton kernels."""
    with ropekit.device.set_backend(request.param):
        yield request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
