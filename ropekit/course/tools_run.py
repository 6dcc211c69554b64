"""``python -m ropekit.course.tools_run --out docs/gpu-runs/course-tools/`` (on a CUDA GPU): the tools, on v1 and v3.

One run writes what notebook 04's tools section shows, so that a reader without a GPU sees real output:

* **resources**: registers and spilled bytes per thread (``n_regs``, ``n_spills``) of the compiled v1 and v3 kernels;
* **PTX**: each kernel's PTX (``v1.ptx``, ``v3.ptx``) and a count of its global loads and stores by width
  (``ld.global.v4``: 16 bytes a thread, ``.v2``: 8, scalar: 4);
* **timing**: both kernels by CUDA-graph replay against the copy ceiling of the same run, next to the bytes-in-flight
  model's prediction (``perf_model``, read only);
* **Nsight Compute**: one ``ncu`` run of both kernels (DRAM throughput, achieved occupancy, DRAM bytes, duration),
  raw CSV in ``ncu.csv``. Where ``ncu`` is missing or may not read the GPU's counters, ``tools.json`` says why;
* **autotune**: ``@triton.autotune`` over a few v3 tiles, against the model's choice among the same tiles and the
  library's ``v3.launch_config``, every tile also timed by graph replay.

The case is Llama-3-8B's q in float32 (v1 runs float32 only): b4 s4096, 32 heads x 128, fresh random inputs far larger
than L2. ``load`` and the ``*_rows`` functions read the stored run back (the notebook's cells, and the tests on a
fixture).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch

__all__ = ["SHAPE", "AUTOTUNE_TILES", "NCU_METRICS", "ptx_loads", "parse_ncu_csv", "find_ncu", "load", "resources_rows",
           "ptx_rows", "timing_rows", "ncu_rows", "residency_rows", "dram_rows", "autotune_rows", "run_ncu", "main"]

SHAPE = (4, 4096, 32, 128)  # (batch, seq, heads, head_dim), float32
AUTOTUNE_TILES = ((1, 4, 4), (2, 4, 4), (4, 4, 4), (8, 4, 4), (16, 4, 4), (4, 2, 4), (4, 8, 4), (4, 4, 8))
NCU_METRICS = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM throughput (% of peak)",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy (% of the warp slots)",
    "dram__bytes_read.sum": "DRAM bytes read",
    "dram__bytes_write.sum": "DRAM bytes written",
    "gpu__time_duration.sum": "duration",
}
KERNELS = ("rope_v1_kernel", "rope_v3_kernel")
_PTX_ACCESS = re.compile(r"\b(ld|st)\.global((?:\.[A-Za-z0-9_:]+)*)")


# --- reading what the tools say (CPU-safe; tested on fixtures) -------------------------------------------------------

def ptx_loads(ptx: str) -> dict:
    """Global loads and stores in PTX text by width: ``{"ld.global.v4": n, "ld.global.v2": n, "ld.global (scalar)":
    n, "st.global.v4": ...}``. A ``.v4`` of 32-bit elements moves 16 bytes a thread in one instruction."""
    counts: dict[str, int] = {}
    for op, suffixes in _PTX_ACCESS.findall(ptx):
        width = next((part for part in suffixes.split(".") if part in ("v2", "v4", "v8")), None)
        key = f"{op}.global.{width}" if width else f"{op}.global (scalar)"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> dict:
    """``{kernel name: {metric: {"value": float, "unit": str}}}`` from ``ncu --csv`` output (the last profiled
    launch of each kernel wins: the earlier ones warm up). Lines that are not CSV rows (``==PROF==``) are skipped."""
    rows = [line for line in text.splitlines() if line.startswith('"')]
    if not rows:
        return {}
    launches: dict[str, dict[str, dict]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(rows))):
        name = row.get("Kernel Name", "")
        kernel = next((k for k in KERNELS if k in name), name)
        launch = row.get("ID", "")
        metric, value = row.get("Metric Name"), _number(row.get("Metric Value", ""))
        if not metric or value is None:
            continue
        launches.setdefault(kernel, {}).setdefault(launch, {})[metric] = {"value": value,
                                                                          "unit": row.get("Metric Unit", "")}
    return {kernel: by_id[max(by_id, key=lambda i: int(i) if i.isdigit() else -1)] for kernel, by_id in
            launches.items()}


def load(folder: Path | str) -> dict | None:
    """The stored run (``tools.json`` in ``folder``), or None when no GPU run has been stored there yet."""
    path = Path(folder) / "tools.json"
    return json.loads(path.read_text()) if path.exists() else None


def resources_rows(run: dict) -> list[tuple]:
    """(kernel, registers per thread, spilled bytes per thread, warps a program)."""
    return [(k, r["n_regs"], r["n_spills"], r["num_warps"]) for k, r in run["resources"].items()]


def ptx_rows(run: dict) -> list[tuple]:
    """(access, count in v1, count in v3): every load/store width either kernel's PTX has."""
    v1, v3 = run["ptx"]["v1"], run["ptx"]["v3"]
    return [(key, v1.get(key, 0), v3.get(key, 0)) for key in sorted(set(v1) | set(v3))]


def timing_rows(run: dict) -> list[tuple]:
    """(kernel, µs, % of the copy ceiling, the model's %)."""
    return [(k, t["time_us"], t["pct_ceiling"], t["predicted_pct"]) for k, t in run["timing"].items()]


# ncu scales its units to the value unless told otherwise: each in bytes or nanoseconds
_BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
_NANOSECONDS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}


def _base(entry: dict) -> float:
    """An ncu value in bytes, nanoseconds, or as given (%)."""
    return entry["value"] * _BYTES.get(entry["unit"], _NANOSECONDS.get(entry["unit"], 1.0))


def _quantity(entry: dict | None) -> str:
    """An ncu value in the units the notebooks use: bytes in MB, times in µs."""
    if entry is None:
        return "—"
    if entry["unit"] in _BYTES:
        return f"{_base(entry) / 1e6:,.1f} MB"
    if entry["unit"] in _NANOSECONDS:
        return f"{_base(entry) / 1e3:,.1f} µs"
    return f"{entry['value']:,.1f} {entry['unit']}".strip()


def ncu_rows(run: dict) -> list[tuple] | str:
    """(metric words, v1 value with unit, v3 value with unit), or the reason ncu did not run."""
    ncu = run["ncu"]
    if ncu.get("status") != "ok":
        return ncu.get("reason", "ncu did not run")
    kernels = ncu["kernels"]
    return [(words, *(_quantity(kernels.get(kernel, {}).get(metric)) for kernel in KERNELS))
            for metric, words in NCU_METRICS.items()]


def _ncu_value(run: dict, name: str, metric: str) -> float | None:
    if run["ncu"].get("status") != "ok":
        return None
    entry = run["ncu"]["kernels"].get(f"rope_{name}_kernel", {}).get(metric)
    return _base(entry) if entry else None


def residency_rows(run: dict) -> list[tuple]:
    """(kernel, registers a thread, programs an SM holds by the model, their warps, those warps as a % of the SM's
    warp slots, ncu's achieved occupancy in % or None). The model's residency (``perf_model.resident_programs``) on
    the limits the H100 and H200 share: 64 warp slots, 32 programs, 65,536 registers an SM."""
    from . import perf_model

    device = perf_model.ASSUMED_H100
    rows = []
    for name, resources in run["resources"].items():
        launch = perf_model.Launch(programs=10**6, num_warps=resources["num_warps"], bytes_in_flight_per_program=0,
                                   registers_per_thread=resources["n_regs"])
        programs = perf_model.resident_programs(launch, device)
        warps = programs * resources["num_warps"]
        rows.append((name, resources["n_regs"], programs, warps, 100.0 * warps / device.max_warps_per_sm,
                     _ncu_value(run, name, "sm__warps_active.avg.pct_of_peak_sustained_active")))
    return rows


def dram_rows(run: dict) -> list[tuple]:
    """What ncu's DRAM counters say against the graph-replay clock, per kernel: (kernel, ncu's µs, graph replay's µs,
    ncu's DRAM GB/s (bytes read + written over its duration), ncu's % of peak, the peak that % implies in GB/s, the
    graph replay's GB/s as a % of that peak). Empty when ncu did not run."""
    rows = []
    for name, timing in run["timing"].items():
        values = [_ncu_value(run, name, metric) for metric in ("dram__bytes_read.sum", "dram__bytes_write.sum",
                                                                "gpu__time_duration.sum",
                                                                "dram__throughput.avg.pct_of_peak_sustained_elapsed")]
        if None in values:
            continue
        read, written, duration_ns, pct_of_peak = values
        gbps = (read + written) / duration_ns
        peak = 100.0 * gbps / pct_of_peak
        rows.append((name, duration_ns / 1e3, timing["time_us"], gbps, pct_of_peak, peak,
                     100.0 * timing["gbps"] / peak))
    return rows


def autotune_rows(run: dict) -> list[tuple]:
    """(tile, graph-replay µs, the model's %, marks): marks name autotune's pick, the model's and the library's."""
    tune = run["autotune"]
    rows = []
    for row in tune["tiles"]:
        tile = (row["block_s"], row["block_h"], row["num_warps"])
        marks = [who for who, key in (("autotune", "autotune_choice"), ("model", "model_choice"),
                                      ("library", "library_choice")) if tuple(tune[key]) == tile]
        rows.append((f"{tile[0]} × {tile[1]}, {tile[2]} warps", row["time_us"], row["predicted_pct"],
                     ", ".join(marks)))
    return rows


# --- measuring (GPU) -------------------------------------------------------------------------------------------------

def _inputs():
    from ropekit.frequencies import cos_sin_table

    batch, seq, heads, head_dim = SHAPE
    x = torch.randn(batch, seq, heads, head_dim, device="cuda")
    cos, sin = cos_sin_table(seq, head_dim, device="cuda")
    return x, cos, sin, torch.empty_like(x)


def _launch_v1(x, cos, sin, out):
    from ropekit.triton.v1 import rope_v1_kernel

    batch, seq, heads, head_dim = x.shape
    return rope_v1_kernel[(batch * seq * heads,)](x, cos, sin, out, seq, heads, HALF=head_dim // 2)


def _launch_v3(x, cos, sin, out, tile=None):
    import triton

    from ropekit.triton import v3

    batch, seq, heads, head_dim = x.shape
    config = v3.V3Config(*tile) if tile else v3.launch_config(batch, seq, heads, head_dim, x.element_size())
    return v3.rope_v3_kernel[(triton.cdiv(seq, config.block_s), batch)](
        x, cos, sin, out, seq, heads, *x.stride(), *out.stride(), *cos.stride(), HALF=head_dim // 2,
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2), BLOCK_S=config.block_s, BLOCK_H=config.block_h,
        num_warps=config.num_warps), config


def _device_model(ceiling_gbps: float):
    from . import ablations, perf_model

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return replace(perf_model.device_model(ablations.load()), name=torch.cuda.get_device_name(),
                   n_sms=props.multi_processor_count, max_warps_per_sm=props.max_threads_per_multi_processor // 32,
                   ceiling_gbps=ceiling_gbps)


def find_ncu() -> str | None:
    """The path of Nsight Compute's ``ncu``: on PATH, else under $CUDA_HOME or /usr/local/cuda; None if absent."""
    found = shutil.which("ncu")
    if found:
        return found
    for folder in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if folder and os.path.exists(os.path.join(folder, "bin", "ncu")):
            return os.path.join(folder, "bin", "ncu")
    return None


def _profile_target() -> None:
    """What ncu profiles: v1 then v3, each launched twice (the second launch of each is the one read)."""
    x, cos, sin, out = _inputs()
    for _ in range(2):
        _launch_v1(x, cos, sin, out)
    for _ in range(2):
        _launch_v3(x, cos, sin, out)
    torch.cuda.synchronize()


def run_ncu(out: Path) -> dict:
    """One ``ncu`` run of v1 and v3 (raw output in ``out``): ``{"status": "ok", "kernels": ...}``, or a status and
    the reason it could not profile (not installed, no permission for the counters, failed)."""
    ncu = find_ncu()
    if ncu is None:
        return {"status": "unavailable", "reason": "ncu (Nsight Compute) is not installed on this machine"}
    command = [ncu, "--csv", "--metrics", ",".join(NCU_METRICS), "--kernel-name", "regex:rope_v[13]_kernel",
               sys.executable, "-m", "ropekit.course.tools_run", "--profile-target"]
    words = " ".join(["ncu", *command[1:-4], "python -m ropekit.course.tools_run --profile-target"])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": "ncu did not finish within 300 s", "command": words}
    (out / "ncu.csv").write_text(done.stdout)
    (out / "ncu.stderr.txt").write_text(done.stderr)
    kernels = parse_ncu_csv(done.stdout)
    if "ERR_NVGPUCTRPERM" in done.stdout + done.stderr:
        return {"status": "no_permission", "command": words,
                "reason": "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM: profiling needs "
                          "admin rights, or the driver's RmProfilingAdminOnly=0)"}
    if done.returncode != 0 or not kernels:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        return {"status": "failed", "command": words,
                "reason": f"ncu exited with {done.returncode} and profiled no kernel: {' | '.join(tail)}"}
    return {"status": "ok", "command": words, "kernels": kernels}


def measure(out: Path) -> dict:
    import triton

    from ropekit.bench.timing import GpuTimer, Settings
    from ropekit.triton import v3

    from . import measure as course_measure
    from . import perf_model
    from .ablations.registry import compiled_resources

    batch, seq, heads, head_dim = SHAPE
    x, cos, sin, result = _inputs()
    timer = GpuTimer(Settings())
    ceiling = course_measure.copy_ceiling(timer, fresh=True)
    device = _device_model(ceiling["gbps"])
    moved = 2 * x.numel() * x.element_size()

    handle_v1 = _launch_v1(x, cos, sin, result)
    handle_v3, config = _launch_v3(x, cos, sin, result)
    torch.cuda.synchronize()
    resources = {"v1": {**compiled_resources(handle_v1), "num_warps": 4},
                 "v3": {**compiled_resources(handle_v3), "num_warps": config.num_warps}}
    ptx = {}
    for name, handle in (("v1", handle_v1), ("v3", handle_v3)):
        text = handle.asm["ptx"]
        (out / f"{name}.ptx").write_text(text)
        ptx[name] = ptx_loads(text)

    launches = {"v1": perf_model.row_launch(batch * seq * heads, head_dim, 4,
                                            registers_per_thread=resources["v1"].get("n_regs")),
                "v3": replace(perf_model.tile_launch(batch, seq, heads, head_dim, 4, config.block_s, config.block_h,
                                                     config.num_warps),
                              registers_per_thread=resources["v3"].get("n_regs"))}
    timing = {}
    for name, launch in (("v1", lambda: _launch_v1(x, cos, sin, result)),
                         ("v3", lambda: _launch_v3(x, cos, sin, result))):
        m = course_measure.time_launch(launch, moved, label=name, timer=timer,
                                       predicted_pct=perf_model.predicted_pct(launches[name], device))
        timing[name] = {"time_us": m.time_us, "pct_ceiling": m.pct_ceiling, "gbps": m.gbps, "spread": m.spread,
                        "predicted_pct": m.predicted_pct}
    timing["v3"]["tile"] = list(config)

    # @triton.autotune over the same kernel, keyed on the shape; its pick against the model's and the library's.
    tuned = triton.autotune(
        configs=[triton.Config({"BLOCK_S": s, "BLOCK_H": h}, num_warps=w) for s, h, w in AUTOTUNE_TILES],
        key=["seqlen", "n_heads", "HALF"])(v3.rope_v3_kernel)

    def tuned_call():
        tuned[lambda meta: (triton.cdiv(seq, meta["BLOCK_S"]), batch)](
            x, cos, sin, result, seq, heads, *x.stride(), *result.stride(), *cos.stride(), HALF=head_dim // 2,
            BLOCK_HALF=triton.next_power_of_2(head_dim // 2))

    tuned_call()
    torch.cuda.synchronize()
    best = tuned.best_config
    autotune_choice = (best.kwargs["BLOCK_S"], best.kwargs["BLOCK_H"], best.num_warps)
    rows = []
    for tile in AUTOTUNE_TILES:
        launch = perf_model.tile_launch(batch, seq, heads, head_dim, 4, *tile)
        m = course_measure.time_launch(lambda tile=tile: _launch_v3(x, cos, sin, result, tile), moved,
                                       label=str(tile), timer=timer)
        rows.append({"block_s": tile[0], "block_h": tile[1], "num_warps": tile[2], "time_us": m.time_us,
                     "pct_ceiling": m.pct_ceiling, "predicted_pct": perf_model.predicted_pct(launch, device),
                     "bytes_in_flight_per_program": launch.bytes_in_flight_per_program})
    # The model's choice: the smallest tile it predicts at its highest % (more bytes a program buy nothing more).
    top = max(r["predicted_pct"] for r in rows)
    model_row = min((r for r in rows if r["predicted_pct"] >= top - 1e-9),
                    key=lambda r: (r["bytes_in_flight_per_program"], r["num_warps"]))
    autotune = {"tiles": rows, "autotune_choice": list(autotune_choice),
                "model_choice": [model_row["block_s"], model_row["block_h"], model_row["num_warps"]],
                "library_choice": list(config), "key": ["seqlen", "n_heads", "HALF"]}

    return {
        "device": torch.cuda.get_device_name(),
        "shape": {"batch": batch, "seq": seq, "heads": heads, "head_dim": head_dim, "dtype": "float32"},
        "ceiling_gbps": ceiling["gbps"],
        "model": {"latency_ns": device.latency_ns, "latency_source": device.latency_source,
                  "needed_bytes_in_flight_per_sm": device.needed_bytes_in_flight_per_sm},
        "resources": resources,
        "ptx": ptx,
        "timing": timing,
        "autotune": autotune,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropekit.course.tools_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the folder to write tools.json, v1.ptx, v3.ptx and ncu.csv to")
    parser.add_argument("--profile-target", action="store_true", help=argparse.SUPPRESS)  # what ncu runs
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("tools_run measures on a CUDA GPU; this machine has none", file=sys.stderr)
        return 2
    if args.profile_target:
        _profile_target()
        return 0
    if args.out is None:
        parser.error("--out is required")
    import triton

    args.out.mkdir(parents=True, exist_ok=True)
    run = measure(args.out)
    run["ncu"] = run_ncu(args.out)
    from .reference_tiles import commit

    run.update(command="python -m ropekit.course.tools_run " + " ".join(sys.argv[1:] if argv is None else argv),
               commit=commit(), torch=torch.__version__, triton=triton.__version__,
               created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    (args.out / "tools.json").write_text(json.dumps(run, indent=1) + "\n")
    for kernel, regs, spills, warps in resources_rows(run):
        print(f"{kernel}: {regs} registers a thread, {spills} bytes spilled, {warps} warps")
    for access, v1, v3 in ptx_rows(run):
        print(f"{access:22s} v1 {v1:3d}   v3 {v3:3d}")
    for kernel, time_us, pct, predicted in timing_rows(run):
        print(f"{kernel}: {time_us:.1f} µs, {pct:.1f} % of copy (model {predicted:.0f} %)")
    ncu = ncu_rows(run)
    print("ncu:", ncu if isinstance(ncu, str) else "; ".join(f"{w}: v1 {a}, v3 {b}" for w, a, b in ncu))
    for tile, time_us, predicted, marks in autotune_rows(run):
        print(f"v3 tile {tile}: {time_us:.1f} µs (model {predicted:.0f} %) {marks}")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
