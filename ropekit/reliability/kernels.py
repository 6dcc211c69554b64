"""The reliability run's one door to the Triton launcher: the launch configuration type, the launch table, a launch
with a forced configuration, and a dry run that records which kernel variants a call would compile.

Everything else in ``ropekit.reliability`` calls the public API (``ropekit.apply_rope``) only.
"""

from __future__ import annotations

import contextlib

import torch

from ropekit import device as _device

# --- compatibility: the launcher's public module -------------------------------------------------------------------
# MERGE: drop the fallback once ``ropekit.triton.launch`` exists on main (it holds the launch table and plans).
try:
    from ropekit.triton.launch import LaunchConfig, launch_config, rope_v4
except ImportError:  # the launcher still lives in the kernel's module
    from ropekit.triton.v4 import LaunchConfig, launch_config, rope_v4
# -------------------------------------------------------------------------------------------------------------------

__all__ = ["LaunchConfig", "launch_config", "rope_v4", "specialisation", "record_launches"]


def specialisation(value):
    """Triton's specialisation of one launch argument, or finer: it compiles one kernel per distinct tuple of these.

    Integers: equal to 1 (becomes a constant), divisible by 16, fits in 32 bits. Tensors: dtype and 16-byte
    alignment. Constexpr keyword arguments: their value.
    """
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return ("int", value == 1, value % 16 == 0, -2**31 <= value < 2**31)
    if isinstance(value, float):
        return "float"
    return repr(value)


class LaunchRecorder:
    """Stands in for the launch during a dry run: records each launch's specialisation key, runs nothing."""

    def __init__(self):
        self.keys: list = []

    def launch(self, grid, pointers, ints, constexprs, num_warps, static_key=None):
        self.record(*pointers, *ints, **constexprs, num_warps=num_warps)

    def __getitem__(self, grid):
        return self.record

    def record(self, *args, **kwargs):
        self.keys.append(tuple(specialisation(a) for a in args) + tuple(sorted((k, specialisation(v))
                                                                              for k, v in kwargs.items())))


@contextlib.contextmanager
def record_launches(simulate_gpu: bool = False):
    """Launch nothing; record the specialisation key of every launch made inside (``simulate_gpu``: plan with the
    GPU's launch table, not the interpreter's). Yields the :class:`LaunchRecorder`.

    The launcher offers no public dry run yet, so this is the one place that reaches below the public launch: it
    stands in for the launcher's lowest launch function (below its direct-launch cache, which must not learn about
    launches that never ran), or for the kernel object where that function is absent. MERGE: replace it by the
    launcher's public dry run (a context manager under which each launch records its compile key instead of
    running, and stores no plan) when the launcher provides one.
    """
    import importlib

    module = None
    for name in ("ropekit.triton.launch", "ropekit.triton.v4"):
        try:
            candidate = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(candidate, "_launch") or hasattr(candidate, "rope_v4_kernel"):
            module = candidate
            break
    recorder, interpret = LaunchRecorder(), _device.INTERPRET
    attribute, stand_in = ("_launch", recorder.launch) if hasattr(module, "_launch") else ("rope_v4_kernel", recorder)
    real = getattr(module, attribute)
    setattr(module, attribute, stand_in)
    if simulate_gpu:
        _device.INTERPRET = False
    try:
        yield recorder
    finally:
        setattr(module, attribute, real)
        _device.INTERPRET = interpret
