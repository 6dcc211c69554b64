"""The reliability run's one door to the Triton launcher: the launch configuration type, the launch table, a launch
with a forced configuration, and a dry run that records which kernel variants a call would compile.

Everything else in ``ropekit.reliability`` calls the public API (``ropekit.apply_rope``) only.
"""

from __future__ import annotations

import contextlib

import torch

from ropekit import device as _device

from ropekit.triton.launch import LaunchConfig, launch_config, recorded_launches, rope_v4

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
    """What a dry run saw: one specialisation key per launch the launcher held back."""

    def __init__(self):
        self.keys: list = []

    def add(self, record) -> None:
        self.keys.append(tuple(specialisation(a) for a in (*record.pointers, *record.ints))
                         + tuple(sorted((k, specialisation(v)) for k, v in record.constexprs.items()))
                         + (("num_warps", record.num_warps),))


@contextlib.contextmanager
def record_launches(simulate_gpu: bool = False):
    """Launch nothing; record the specialisation key of every launch made inside (``simulate_gpu``: plan with the
    GPU's launch table, not the interpreter's). Yields the :class:`LaunchRecorder`, filled when the block ends.

    Built on the launcher's public dry run (:func:`ropekit.triton.launch.recorded_launches`), with the Triton backend
    the default inside (``ropekit.device.set_backend``): the calls made inside are the kernels' launches.
    """
    recorder = LaunchRecorder()
    with _device.set_backend("triton"), recorded_launches(gpu_table=simulate_gpu) as records:
        yield recorder
    for record in records:
        recorder.add(record)
