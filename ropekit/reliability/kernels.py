"""The reliability run's one door to the Triton launcher: the launch configuration types, a launch with a forced
configuration, and a dry run that records which kernel variants a call would compile.

Everything else in ``ropekit.reliability`` calls the public API (``ropekit.apply_rope``) only.
"""

from __future__ import annotations

import contextlib

import torch

from ropekit import device as _device

from ropekit.triton.launch import FlatConfig, TileConfig, forced_config, plan_rope, recorded_launches, rope_v4

__all__ = ["TileConfig", "FlatConfig", "forced_config", "plan_rope", "rope_v4", "specialisation", "record_launches"]


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
        def leaves(value):  # (tuple arguments leaf by leaf, at any depth: the fused kernels nest them)
            return tuple(map(leaves, value)) if isinstance(value, tuple) else specialisation(value)

        self.keys.append((getattr(record.kernel, "__name__", repr(record.kernel)),)
                         + tuple((name, leaves(value)) for name, value in record.arguments.items())
                         + (("num_warps", record.num_warps),))


@contextlib.contextmanager
def record_launches():
    """Launch nothing; record the specialisation key of every launch made inside, with this process's launch choice
    (on a GPU: the GPU's; under the interpreter: its fixed tiles). Yields the :class:`LaunchRecorder`, filled when
    the block ends.

    Built on the launcher's public dry run (:func:`ropekit.triton.launch.recorded_launches`), with the Triton backend
    the default inside (``ropekit.device.set_backend``): the calls made inside are the kernels' launches.
    """
    recorder = LaunchRecorder()
    with _device.set_backend("triton"), recorded_launches() as records:
        yield recorder
    for record in records:
        recorder.add(record)
