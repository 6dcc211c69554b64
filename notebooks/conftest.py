"""nbval's kernel start, retried.

jupyter_client picks the kernel's five ZMQ ports by binding port 0 and letting go; the kernel binds them a moment
later. Under `pytest -n auto` another worker's process (a second kernel, the site test's browser) can take one of those
ports in between, and the kernel dies before it answers `kernel_info`: every cell of that notebook then errors at setup
without having run. A fresh start draws fresh ports. A kernel that dies three times in a row is a real failure and is
raised as such.
"""
import nbval.kernel

_ATTEMPTS = 3
_start_new_kernel = nbval.kernel.start_new_kernel


def _start_new_kernel_retried(*args, **kwargs):
    for attempt in range(_ATTEMPTS):
        try:
            return _start_new_kernel(*args, **kwargs)
        except RuntimeError:
            if attempt == _ATTEMPTS - 1:
                raise


nbval.kernel.start_new_kernel = _start_new_kernel_retried
