"""A performance model small enough to do in your head: bytes moved, and bytes in flight per SM.

RoPE is memory-bound, so two questions predict where a kernel lands against the copy ceiling:

1. **How many bytes must it move?** (:func:`rope_bytes`) q and k are read once and written once; the cos/sin
   tables are small and mostly served by the L2 cache. Time at the ceiling = those bytes / copy bandwidth.
2. **Does it keep enough bytes in flight to reach the ceiling?** DRAM answers a load only after a latency of several
   hundred nanoseconds. Little's law says a memory system delivering bandwidth ``B`` with latency ``L`` holds
   ``B x L`` bytes in flight; split over the SMs, each SM must have that share of its loads outstanding at every
   moment. A program can have in flight the loads it issues before it waits on any of them (for the row kernels:
   its whole row); an SM holds as many programs at once (its *residency*) as its warp slots, program slots and
   registers allow. So

       predicted fraction of the ceiling = min(1, bytes in flight per SM / (ceiling per SM x latency)).

The model knows nothing of coalescing (it assumes every requested byte is a useful byte: strided lanes waste
transactions and land below it), of the instruction cost (RoPE's few multiply-adds per element are free next to
memory) or of the tail of the last wave. Its one free parameter is the loaded memory latency: the ``littles_law``
ablation (``python -m ropekit.course.ablations``) fits it from a copy kernel's sweep of program sizes on the device,
and :func:`device_model` takes it from that run. Without a run it falls back to an **assumed** latency, labelled so.

The arithmetic is the library's own: :mod:`ropekit.triton.model` (Little's law, residency, the fraction of the
ceiling) is what :mod:`ropekit.triton.choice` calls to choose a launch, so this page teaches the very functions that
choose ropekit's configurations. ``DeviceModel`` is the library's :class:`~ropekit.triton.model.DeviceFacts`.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..triton.configs import FlatConfig, RopeShape, flat_rows, next_pow2
from ..triton.model import (DeviceFacts, Launch, bytes_in_flight_per_sm, fit_latency_ns, model_rope, predicted_pct,
                            resident_programs)

__all__ = ["DeviceModel", "Launch", "ASSUMED_H100", "PUBLISHED", "device_model", "rope_bytes", "row_launch",
           "resident_programs", "bytes_in_flight_per_sm", "predicted_pct", "fit_latency_ns", "sectors_per_access",
           "tile_launch", "LADDER_LAUNCHES", "predict_case"]


DeviceModel = DeviceFacts  # what the model needs to know about a GPU


# The H100 SXM's SM count and limits are its published specifications. The ceiling and the latency are placeholders
# until a run on the device provides them (device_model): the latency is an assumption, not a measurement.
ASSUMED_H100 = DeviceModel(name="H100 SXM (assumed figures)", n_sms=132, ceiling_gbps=3000.0, latency_ns=600.0,
                           latency_source="assumed: the order of an HBM latency under load, not measured here")


# What NVIDIA's data sheets give (SMs, HBM bandwidth), with the loaded latency assumed: the model on a GPU that no run
# has measured (notebook 05 compares the launch choice on both).
PUBLISHED = {
    "H100 SXM": DeviceModel("H100 SXM", 132, 3350.0, 600.0, "assumed 600 ns"),
    "H200": DeviceModel("H200", 132, 4800.0, 600.0, "assumed 600 ns"),
}


def device_model(ablations: dict | None = None, *, base: DeviceModel = ASSUMED_H100) -> DeviceModel:
    """The model of the device an ablation run measured (its SM count, copy ceiling, fitted latency), else ``base``.

    ``ablations``: the JSON document ``python -m ropekit.course.ablations`` wrote. CPU placeholder runs carry no
    timing and leave ``base`` as it is.
    """
    if not ablations or not ablations.get("on_gpu"):
        return base
    fit = ablations.get("experiments", {}).get("littles_law", {}).get("fit", {})
    changes = dict(name=ablations.get("device", base.name), n_sms=ablations.get("n_sms", base.n_sms),
                   ceiling_gbps=ablations["copy_ceiling"]["gbps"])
    if fit.get("latency_ns"):
        changes.update(latency_ns=fit["latency_ns"], latency_source="fitted on the copy sweep of the same run")
    return replace(base, **changes)


def rope_bytes(n_tokens: int, heads: int, head_dim: int, element_size: int, *, table_rows_per_token: int = 1,
               rotary_dim: int | None = None, inplace: bool = False) -> dict:
    """Bytes of one RoPE launch over ``n_tokens`` x ``heads`` head vectors.

    ``floor``: what must cross the DRAM bus at least (x read, out written; in place with partial rotary only the
    rotary part). ``tables``: what the program's cos/sin loads *request* (float32 half-width rows, fetched
    ``table_rows_per_token`` times per token: once per head for one-row programs, once for a tile that covers every
    head); after the first fetch those are L2 hits, so they cost bandwidth of the L2, not of DRAM.
    """
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    moved_channels = rotary_dim if inplace else head_dim
    x_bytes = n_tokens * heads * moved_channels * element_size
    tables = n_tokens * table_rows_per_token * 2 * (rotary_dim // 2) * 4
    return {"read": x_bytes, "written": x_bytes, "floor": 2 * x_bytes, "tables": tables,
            "tables_per_floor_byte": tables / (2 * x_bytes) if x_bytes else 0.0}


def row_launch(n_rows: int, head_dim: int, element_size: int, *, rows_per_program: int = 1, num_warps: int = 4,
               registers_per_thread: int | None = None) -> Launch:
    """A row kernel (v1, v2, or an ablation's variant): each program loads ``rows_per_program`` whole head vectors
    before it computes, so that many rows of x are its bytes in flight (the table rows are L2 hits)."""
    return Launch(programs=math.ceil(n_rows / rows_per_program), num_warps=num_warps,
                  bytes_in_flight_per_program=rows_per_program * head_dim * element_size,
                  registers_per_thread=registers_per_thread)


def tile_launch(batch: int, seq: int, heads: int, head_dim: int, element_size: int, block_s: int, block_h: int,
                num_warps: int = 4) -> Launch:
    """A tile kernel (v3, or the tile ablation): one program per ``block_s`` tokens of a sequence, walking over the
    ``heads`` ``block_h`` at a time; its bytes in flight are one head step's loads (``block_s x block_h`` head
    vectors), issued before it waits on any of them."""
    return Launch(programs=math.ceil(seq / block_s) * batch, num_warps=num_warps,
                  bytes_in_flight_per_program=block_s * block_h * head_dim * element_size,
                  read_bytes=batch * seq * heads * head_dim * element_size)


def sectors_per_access(lanes: int, stride_bytes: int, element_size: int, sector_bytes: int = 32) -> tuple[int, int]:
    """(sectors a warp-wide access of ``lanes`` elements touches, sectors its useful bytes would fill).

    The memory system moves whole 32-byte sectors. Adjacent lanes (stride = element size) fill every sector they
    touch; lanes ``stride_bytes`` apart each touch a sector of their own once the stride reaches 32 bytes.
    """
    touched = len({(lane * stride_bytes) // sector_bytes for lane in range(lanes)})
    useful = math.ceil(lanes * element_size / sector_bytes)
    return touched, useful


def _row_kernel_launches(case, device: DeviceModel) -> list[Launch]:
    """v1/v2 on a benchmark case: one launch for q and one for k, one head vector per program."""
    size = case.element_size
    return [row_launch(case.n_tokens * heads, case.head_dim, size) for heads in (case.heads_q, case.heads_k)]


def _v3_launches(case, device: DeviceModel) -> list[Launch] | None:
    """v3 on a benchmark case: one launch for q and one for k, each with the tile of ``v3.GPU_TABLE``, its tokens
    halved while the grid would give an SM fewer than 4 programs (as ``v3.launch_config`` does on a GPU)."""
    from ..triton import v3

    config = v3.GPU_TABLE.get((next_pow2(case.head_dim // 2), case.element_size))
    if config is None:
        return None
    launches = []
    for heads in (case.heads_q, case.heads_k):
        block_s = min(config.block_s, next_pow2(case.seqlen))
        while block_s > 1 and math.ceil(case.seqlen / block_s) * case.batch < 4 * device.n_sms:
            block_s //= 2
        launches.append(tile_launch(case.batch, case.seqlen, heads, case.head_dim, case.element_size, block_s,
                                    min(config.block_h, next_pow2(heads)), config.num_warps))
    return launches


def _v4_launches(case, device: DeviceModel) -> list[Launch]:
    """v4 on a benchmark case: its one launch for q and k, with the configuration the library's model chooses for
    the device (:func:`ropekit.triton.model.model_rope`; the autotune may refine it on the GPU itself)."""
    size, tokens = case.element_size, case.n_tokens
    flat_ok = (case.layout == "bshd" and case.rotary == case.head_dim and not case.interleaved
               and case.positions == "none" and not case.inplace)
    shape = RopeShape(tokens, case.heads_q, case.heads_k, case.head_dim, case.rotary, size, cos_per_token=False,
                      flat_ok=flat_ok, same_shape=case.heads_q == case.heads_k, varlen=case.layout == "thd")
    config = model_rope(device, shape)
    elements = tokens * (case.heads_q + case.heads_k) * case.head_dim
    if isinstance(config, FlatConfig):  # runs of whole head vectors; paired: the same vectors of q and of k
        per_program = flat_rows(config.block, case.head_dim) * case.head_dim * (2 if config.paired else 1)
        return [Launch(math.ceil(elements / per_program), config.num_warps, per_program * size,
                       read_bytes=elements * size)]
    if config.fused_qk:  # block_s tokens x every head of q and of k, all loaded before any store
        return [Launch(math.ceil(tokens / config.block_s), config.num_warps,
                       config.block_s * (case.heads_q + case.heads_k) * case.head_dim * size,
                       read_bytes=elements * size)]
    return [Launch(math.ceil(tokens / config.block_s) * math.ceil(heads / config.block_h), config.num_warps,
                   config.block_s * config.block_h * case.head_dim * size,
                   read_bytes=tokens * heads * case.head_dim * size)
            for heads in (case.heads_q, case.heads_k)]


def _liger_launches(case, device: DeviceModel) -> list[Launch]:
    """Liger-Kernel's rope on a benchmark case: one launch, one program per token holding every head of q and of k
    (their rotary channels loaded before any is stored), Triton's default 4 warps. The contiguous copies its wrapper
    makes of transposed inputs are not modelled."""
    size, rotary = case.element_size, case.rotary
    return [Launch(case.n_tokens, 4, (case.heads_q + case.heads_k) * rotary * size,
                   read_bytes=case.n_tokens * (case.heads_q + case.heads_k) * case.head_dim * size)]


def _flash_attn_launches(case, device: DeviceModel) -> list[Launch]:
    """flash-attention's rotary on a benchmark case: one launch for q and one for k; a program holds 2 heads x
    ``BLOCK_M`` tokens of one sequence (8 while the rotary part is at most 128 channels, else 4), Triton's default 4
    warps. In a decode step a sequence has one token, so only that row of the block is loaded."""
    size, rotary = case.element_size, case.rotary
    block_m = 8 if rotary <= 128 else 4
    rows = min(block_m, case.seqlen)
    return [Launch(math.ceil(heads / 2) * math.ceil(case.seqlen / block_m) * case.batch, 4, rows * 2 * rotary * size,
                   read_bytes=case.n_tokens * heads * case.head_dim * size)
            for heads in (case.heads_q, case.heads_k)]


# How each implementation launches on a benchmark case (ropekit.bench.cases.Case): the launches of one call, or None
# where the model has no configuration for the case. The ladder's kernels, then the peers whose launch shape their
# source fixes; torch.compile's kernels are chosen by Inductor's own heuristics and autotuning, so it has no entry.
LADDER_LAUNCHES = {
    "triton-v1": _row_kernel_launches,
    "triton-v2": _row_kernel_launches,
    "triton-v3": _v3_launches,
    "triton-v4": _v4_launches,
    "liger": _liger_launches,
    "flash-attn": _flash_attn_launches,
}


def predict_case(case, impl: str, device: DeviceModel) -> float | None:
    """The model's % of the copy ceiling for ``impl`` on a benchmark ``case``: the launches' times at their
    predicted fractions add up, so the whole call's fraction is bytes over the sum of (bytes / fraction). Eager
    PyTorch is its bytes alone: five elementwise kernels a tensor, each modelled at the ceiling, move
    ``Case.eager_formula_bytes`` for the case's ideal bytes."""
    if impl == "torch-eager":
        return 100.0 * case.moved_bytes() / case.eager_formula_bytes()
    launches = LADDER_LAUNCHES.get(impl)
    launches = launches(case, device) if launches else None
    if not launches:
        return None
    parts = [(launch.bytes_read, predicted_pct(launch, device)) for launch in launches]
    total = sum(b for b, _ in parts)
    return 100.0 * total / sum(b * 100.0 / pct for b, pct in parts) if total else None
