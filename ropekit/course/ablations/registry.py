"""The ablations' registry and their laboratory: named experiments, the clock, the copy ceiling, the sizes.

An experiment is a function ``(lab) -> dict`` registered with :func:`experiment`; it builds fresh random inputs at
``lab.shape(gpu_shape, cpu_shape)``, times each variant with :meth:`Lab.time` and returns ``{"rows": [...], ...}``.
Experiments run in registration order (modules in alphabetical order, functions in file order), so a later one may use
what an earlier one measured (``lab.model``: the performance model fitted by ``littles_law``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from ... import device as _device
from .. import perf_model

__all__ = ["Experiment", "EXPERIMENTS", "experiment", "Lab", "WallTimer", "compiled_resources"]


@dataclass(frozen=True)
class Experiment:
    name: str
    question: str  # the one cause it isolates, as a question
    run: Callable[["Lab"], dict]


EXPERIMENTS: dict[str, Experiment] = {}


def experiment(name: str, question: str):
    """Register ``fn(lab) -> dict`` as the experiment ``name``."""
    def register(fn):
        if name in EXPERIMENTS:
            raise ValueError(f"experiment {name!r} is registered twice")
        EXPERIMENTS[name] = Experiment(name, question, fn)
        return fn
    return register


class WallTimer:
    """The CPU stand-in for ``GpuTimer``: wall-clock medians of the interpreter. It exercises the code path; its
    numbers mean nothing about a GPU and the document says so."""

    settings = "wall clock (CPU)"

    def copy_ceiling(self) -> dict:
        src = torch.randn(1 << 20)
        dst = torch.empty_like(src)
        us = self._median_us([lambda: dst.copy_(src)])
        return {"gbps": 2 * src.nbytes / (us * 1e-6) / 1e9, "time_us": us, "method": "torch copy_ of 4 MiB, CPU"}

    def graph_us(self, fns, estimate_us):
        return self._median_us(fns), 0.0, len(fns)

    @staticmethod
    def _median_us(fns, repeats: int = 3) -> float:
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            for fn in fns:
                fn()
            samples.append((time.perf_counter() - start) / len(fns) * 1e6)
        return statistics.median(samples)


def compiled_resources(handle) -> dict:
    """Registers and spilled bytes per thread of a launched Triton kernel (what ``kernel[grid](...)`` returned on a
    GPU); empty under the interpreter or for anything else."""
    try:
        handle._init_handles()
        return {"n_regs": int(handle.n_regs), "n_spills": int(handle.n_spills)}
    except Exception:  # noqa: BLE001  (interpreter launches return None; torch calls return tensors)
        return {}


class Lab:
    """What every experiment shares: the device, the clock, the copy ceiling measured at the start of the run, and
    the performance model (``perf_model.device_model``) that experiments refine."""

    def __init__(self, on_gpu: bool, timer, model: perf_model.DeviceModel | None = None):
        self.on_gpu = on_gpu
        self.timer = timer
        self.device = _device.DEVICE  # where the kernels compile for; on_gpu only picks the sizes and the clock
        self.ceiling = timer.copy_ceiling()
        base = model or perf_model.ASSUMED_H100
        if on_gpu:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            base = replace(base, name=torch.cuda.get_device_name(), n_sms=props.multi_processor_count,
                           max_warps_per_sm=props.max_threads_per_multi_processor // 32)
            # on a CPU the model keeps its GPU figures: predictions for the device the notebooks are about
            base = replace(base, ceiling_gbps=self.ceiling["gbps"])
        self.model = base
        self.generator = torch.Generator(device=self.device).manual_seed(0)

    def shape(self, gpu_shape: tuple, cpu_shape: tuple) -> tuple:
        """The real size on a GPU (working set many times the L2, so every call reads DRAM); a toy one on a CPU."""
        return tuple(gpu_shape) if self.on_gpu else tuple(cpu_shape)

    def randn(self, shape, dtype=torch.float32) -> torch.Tensor:
        """Fresh random values (never zeros: some kernels are faster on zeros)."""
        return torch.randn(shape, device=self.device, generator=self.generator).to(dtype)

    def time(self, variant: str, fn: Callable, bytes_moved: int, launch: perf_model.Launch | None = None,
             **extra) -> dict:
        """Run ``fn`` once (compile, warm up, read its registers), then time it; one row of the experiment."""
        resources = compiled_resources(fn())
        if self.on_gpu:
            torch.cuda.synchronize()
        estimate_us = bytes_moved / (self.ceiling["gbps"] * 1e9) * 1e6
        time_us, spread, calls = self.timer.graph_us([fn], estimate_us)
        gbps = bytes_moved / (time_us * 1e-6) / 1e9
        row = {"variant": variant, "time_us": time_us, "spread": spread, "bytes": bytes_moved, "gbps": gbps,
               "pct_ceiling": 100.0 * gbps / self.ceiling["gbps"], **resources, **extra}
        if launch is not None:
            if resources.get("n_regs"):
                launch = replace(launch, registers_per_thread=resources["n_regs"])
            row.update(programs=launch.programs, num_warps=launch.num_warps,
                       bytes_in_flight_per_program=launch.bytes_in_flight_per_program,
                       resident_programs=perf_model.resident_programs(launch, self.model),
                       bytes_in_flight_per_sm=perf_model.bytes_in_flight_per_sm(launch, self.model),
                       predicted_pct=perf_model.predicted_pct(launch, self.model))
        return row
