"""Reading what the tools say (``ropekit.course.tools_run``), on small fixtures: a PTX excerpt, an ``ncu --csv`` excerpt
and a stored run. The measuring itself needs a GPU (the lead's command); these tests pin how its output is read back."""

from __future__ import annotations

import json

import pytest
from conftest import ON_GPU

from ropekit.course import tools_run

PTX = """
	// begin inline asm
	@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
	// end inline asm
	@%p2 ld.global.v2.b32 { %r5, %r6 }, [ %rd2 + 0 ];
	ld.global.b32 %r7, [ %rd3 + 0 ];
	@%p3 ld.global.L1::evict_last.v4.b32 { %r8, %r9, %r10, %r11 }, [ %rd4 + 0 ];
	@%p1 st.global.v4.b32 [ %rd5 + 0 ], { %r1, %r2, %r3, %r4 };
	st.global.b32 [ %rd6 + 0 ], %r7;
	ld.param.u64 %rd7, [param_0];
"""

NCU_CSV = """==PROF== Connected to process 1234
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1234","python","host","rope_v1_kernel","1","7","(128, 1, 1)","(524288, 1, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","70.10"
"1","1234","python","host","rope_v1_kernel","1","7","(128, 1, 1)","(524288, 1, 1)","0","9.0","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","71.25"
"1","1234","python","host","rope_v1_kernel","1","7","(128, 1, 1)","(524288, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","268,435,456"
"3","1234","python","host","rope_v3_kernel","1","7","(128, 1, 1)","(1024, 4, 1)","0","9.0","Command line profiler metrics","sm__warps_active.avg.pct_of_peak_sustained_active","%","45.5"
==PROF== Disconnected from process 1234
"""


def test_ptx_accesses_are_counted_by_width_whatever_the_cache_hints():
    assert tools_run.ptx_loads(PTX) == {"ld.global (scalar)": 1, "ld.global.v2": 1, "ld.global.v4": 2,
                                        "st.global (scalar)": 1, "st.global.v4": 1}


def test_ptx_without_global_accesses_counts_nothing():
    assert tools_run.ptx_loads("ld.param.u64 %rd1, [p];\nld.shared.b32 %r1, [%rd1];") == {}


def test_ncu_csv_keeps_the_last_launch_of_each_kernel_and_reads_thousands_separators():
    kernels = tools_run.parse_ncu_csv(NCU_CSV)
    assert set(kernels) == {"rope_v1_kernel", "rope_v3_kernel"}
    v1 = kernels["rope_v1_kernel"]
    assert v1["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == {"value": 71.25, "unit": "%"}  # launch 1
    assert v1["dram__bytes_read.sum"]["value"] == 268435456
    assert kernels["rope_v3_kernel"]["sm__warps_active.avg.pct_of_peak_sustained_active"]["value"] == 45.5


def test_ncu_output_without_rows_parses_to_nothing():
    assert tools_run.parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM - no permission\n") == {}


def _run(ncu: dict) -> dict:
    """A stored run's shape, with made-up values (a fixture, not a measurement)."""
    return {
        "device": "fixture GPU",
        "resources": {"v1": {"n_regs": 20, "n_spills": 0, "num_warps": 4},
                      "v3": {"n_regs": 40, "n_spills": 0, "num_warps": 4}},
        "ptx": {"v1": {"ld.global (scalar)": 6}, "v3": {"ld.global.v4": 4, "ld.global (scalar)": 2}},
        "timing": {"v1": {"time_us": 200.0, "pct_ceiling": 50.0, "predicted_pct": 40.0, "gbps": 1200.0},
                   "v3": {"time_us": 110.0, "pct_ceiling": 90.0, "predicted_pct": 100.0, "gbps": 2400.0}},
        "ncu": ncu,
        "autotune": {"tiles": [{"block_s": 1, "block_h": 4, "num_warps": 4, "time_us": 120.0, "predicted_pct": 100.0},
                               {"block_s": 4, "block_h": 4, "num_warps": 4, "time_us": 110.0, "predicted_pct": 100.0}],
                     "autotune_choice": [4, 4, 4], "model_choice": [1, 4, 4], "library_choice": [4, 4, 4]},
    }


def test_a_stored_run_reads_back_as_the_notebooks_rows(tmp_path):
    ncu = {"status": "ok", "kernels": tools_run.parse_ncu_csv(NCU_CSV)}
    (tmp_path / "tools.json").write_text(json.dumps(_run(ncu)))
    run = tools_run.load(tmp_path)
    assert tools_run.resources_rows(run) == [("v1", 20, 0, 4), ("v3", 40, 0, 4)]
    assert tools_run.ptx_rows(run) == [("ld.global (scalar)", 6, 2), ("ld.global.v4", 0, 4)]
    assert tools_run.timing_rows(run) == [("v1", 200.0, 50.0, 40.0), ("v3", 110.0, 90.0, 100.0)]
    rows = {words: (v1, v3) for words, v1, v3 in tools_run.ncu_rows(run)}
    assert rows["DRAM throughput (% of peak)"] == ("71.2 %", "—")
    assert rows["achieved occupancy (% of the warp slots)"] == ("—", "45.5 %")
    assert tools_run.autotune_rows(run) == [("1 × 4, 4 warps", 120.0, 100.0, "model"),
                                            ("4 × 4, 4 warps", 110.0, 100.0, "autotune, library")]


def _kernels(**metrics) -> dict:
    """ncu's parsed values for both kernels: metric=(v1 value, v3 value, unit) (a fixture, not a measurement)."""
    names = {"read": "dram__bytes_read.sum", "written": "dram__bytes_write.sum", "ns": "gpu__time_duration.sum",
             "pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed"}
    return {"status": "ok", "kernels": {
        kernel: {names[m]: {"value": values[i], "unit": values[2]} for m, values in metrics.items()}
        for i, kernel in enumerate(("rope_v1_kernel", "rope_v3_kernel"))}}


def test_ncu_bytes_read_as_megabytes_and_durations_as_microseconds():
    run = _run(_kernels(read=(276854016.0, 268435456.0, "byte"), ns=(372736.0, 188448.0, "ns")))
    rows = {words: (v1, v3) for words, v1, v3 in tools_run.ncu_rows(run)}
    assert rows["DRAM bytes read"] == ("276.9 MB", "268.4 MB")
    assert rows["duration"] == ("372.7 µs", "188.4 µs")
    scaled = _run(_kernels(read=(276.854016, 268.435456, "Mbyte"), ns=(372.736, 188.448, "usecond")))
    assert tools_run.ncu_rows(scaled) == tools_run.ncu_rows(run)  # ncu's own unit scaling reads the same


def test_the_models_residency_comes_from_the_registers_beside_ncus_occupancy():
    """4-warp programs: 20 registers a thread leave the warp slots to bind (16 programs, all 64 warps); 40 leave room
    for 65,536 / (40 x 128) = 12 programs, 48 warps, 75 % of the slots."""
    run = _run({"status": "ok", "kernels": tools_run.parse_ncu_csv(NCU_CSV)})
    assert tools_run.residency_rows(run) == [("v1", 20, 16, 64, 100.0, None), ("v3", 40, 12, 48, 75.0, 45.5)]


def test_ncus_peak_is_recovered_from_its_own_bytes_duration_and_percentage():
    # v1: 600 MB in 400 µs is 1500 GB/s, given as 50 % of peak: a 3000 GB/s peak; graph replay's 1200 GB/s is 40 %
    run = _run(_kernels(read=(300e6, 300e6, "byte"), written=(300e6, 300e6, "byte"), ns=(400e3, 250e3, "ns"),
                        pct=(50.0, 80.0, "%")))
    (v1, ncu_us, graph_us, gbps, pct, peak, graph_pct), v3 = tools_run.dram_rows(run)
    assert (v1, ncu_us, graph_us, gbps, pct, peak, graph_pct) == ("v1", 400.0, 200.0, 1500.0, 50.0, 3000.0, 40.0)
    assert v3[5] == pytest.approx(3000.0) and v3[6] == pytest.approx(80.0)


def test_without_ncu_there_is_no_dram_reading():
    assert tools_run.dram_rows(_run({"status": "unavailable", "reason": "no ncu"})) == []


def test_a_run_where_ncu_could_not_profile_says_why():
    run = _run({"status": "no_permission", "reason": "ncu may not read the GPU's performance counters here"})
    assert tools_run.ncu_rows(run) == "ncu may not read the GPU's performance counters here"


def test_no_stored_run_reads_as_none(tmp_path):
    assert tools_run.load(tmp_path / "absent") is None


@pytest.mark.skipif(ON_GPU, reason="on a GPU the script measures")
def test_the_script_refuses_a_machine_without_a_gpu(tmp_path, capsys):
    assert tools_run.main(["--out", str(tmp_path / "tools")]) == 2
    assert not (tmp_path / "tools").exists() and "CUDA GPU" in capsys.readouterr().err


def _fake_ncu(tmp_path, monkeypatch, stdout: str, code: int = 0):
    """An ``ncu`` that prints ``stdout`` and exits with ``code`` (the real one needs a GPU and its counters)."""
    script = tmp_path / "ncu"
    (tmp_path / "ncu.out").write_text(stdout)
    script.write_text(f"#!/bin/sh\ncat '{tmp_path / 'ncu.out'}'\nexit {code}\n")
    script.chmod(0o755)
    monkeypatch.setattr(tools_run, "find_ncu", lambda: str(script))


@pytest.mark.parametrize("stdout, code, status", [
    (NCU_CSV, 0, "ok"),
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters\n", 1,
     "no_permission"),
    ("==ERROR== the application returned an error\n", 1, "failed"),
], ids=["profiled", "no-permission", "failed"])
def test_ncu_runs_or_says_why_not(tmp_path, monkeypatch, stdout, code, status):
    _fake_ncu(tmp_path, monkeypatch, stdout, code)
    result = tools_run.run_ncu(tmp_path)
    assert result["status"] == status and (tmp_path / "ncu.csv").read_text() == stdout
    assert result["command"].startswith("ncu --csv --metrics dram__throughput")
    if status == "ok":
        assert set(result["kernels"]) == {"rope_v1_kernel", "rope_v3_kernel"}
    else:
        assert ("ERR_NVGPUCTRPERM" if status == "no_permission" else "exited with 1") in result["reason"]


def test_without_ncu_the_run_says_it_is_not_installed(monkeypatch, tmp_path):
    monkeypatch.setattr(tools_run, "find_ncu", lambda: None)
    assert tools_run.run_ncu(tmp_path) == {"status": "unavailable",
                                           "reason": "ncu (Nsight Compute) is not installed on this machine"}
