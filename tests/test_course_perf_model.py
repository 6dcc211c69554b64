"""ropekit.course.perf_model: Little's law, residency and the bytes model, on numbers worked out by hand."""

import pytest

import ropekit

from ropekit.course import perf_model as pm

DEVICE = pm.DeviceModel("test", n_sms=100, ceiling_gbps=2000.0, latency_ns=500.0, latency_source="test")


def test_littles_law_per_sm():
    # 2000 GB/s over 100 SMs = 20 bytes/ns per SM; x 500 ns = 10,000 bytes in flight per SM
    assert DEVICE.needed_bytes_in_flight_per_sm == pytest.approx(10_000)


def test_residency_is_the_tightest_limit():
    assert pm.resident_programs(pm.Launch(10**6, 4, 256), DEVICE) == 16  # 64 warp slots / 4 warps
    assert pm.resident_programs(pm.Launch(10**6, 1, 256), DEVICE) == 32  # the program-slot limit
    # 128 registers x 32 threads x 8 warps = 32768 registers a program: two fit in 65536
    assert pm.resident_programs(pm.Launch(10**6, 8, 256, registers_per_thread=128), DEVICE) == 2
    # a warp's registers come in blocks of 256: 85 a thread take 88, 11264 a program of 4 warps, so 5 fit, not 6
    assert pm.resident_programs(pm.Launch(10**6, 4, 256, registers_per_thread=85), DEVICE) == 5
    assert pm.resident_programs(pm.Launch(10**6, 4, 256, registers_per_thread=80), DEVICE) == 6


def test_prediction_grows_with_bytes_in_flight_and_saturates():
    small = pm.row_launch(10**6, 64, 4)  # 256 B a program, 16 resident: 4096 B per SM
    assert pm.bytes_in_flight_per_sm(small, DEVICE) == 4096
    assert pm.predicted_pct(small, DEVICE) == pytest.approx(40.96)
    assert pm.predicted_pct(pm.row_launch(10**6, 64, 4, rows_per_program=4), DEVICE) == 100.0
    # a grid smaller than the device: 150 programs on 100 SMs is at most 2 per SM
    assert pm.bytes_in_flight_per_sm(pm.Launch(150, 4, 1000), DEVICE) == 2000


def test_fit_recovers_the_latency_from_latency_bound_points():
    points = [(per_sm, per_sm * DEVICE.n_sms / 500.0) for per_sm in (1000, 2000, 4000)]  # GB/s = bytes / ns
    points.append((50_000, 1990.0))  # at the ceiling: not used
    assert pm.fit_latency_ns(points, DEVICE.n_sms, DEVICE.ceiling_gbps) == pytest.approx(500.0)
    assert pm.fit_latency_ns([(50_000, 1990.0)], DEVICE.n_sms, DEVICE.ceiling_gbps) is None


def test_rope_bytes():
    b = pm.rope_bytes(10, 32, 128, 2, table_rows_per_token=32)
    assert b["floor"] == 2 * 10 * 32 * 128 * 2 and b["tables"] == 10 * 32 * 2 * 64 * 4
    assert b["tables_per_floor_byte"] == 1.0
    partial = pm.rope_bytes(10, 1, 128, 2, rotary_dim=64, inplace=True)
    assert partial["floor"] == 2 * 10 * 64 * 2


def test_sectors():
    assert pm.sectors_per_access(32, 4, 4) == (4, 4)  # 128 adjacent bytes: four full sectors
    assert pm.sectors_per_access(32, 128, 4) == (32, 4)  # one sector per lane, 8x the traffic


def test_device_model_from_an_ablation_document():
    assert pm.device_model(None) is pm.ASSUMED_H100
    assert pm.device_model({"on_gpu": False, "copy_ceiling": {"gbps": 5.0}}) is pm.ASSUMED_H100
    doc = {"on_gpu": True, "device": "GPU", "n_sms": 10, "copy_ceiling": {"gbps": 100.0},
           "experiments": {"littles_law": {"fit": {"latency_ns": 700.0}}}}
    model = pm.device_model(doc)
    assert (model.n_sms, model.ceiling_gbps, model.latency_ns) == (10, 100.0, 700.0)
    assert model.latency_source.startswith("fitted")


def test_a_ladder_prediction_weights_the_launches_by_their_bytes():
    from ropekit.bench import select_cases

    (case,) = select_cases(("main",), ["fp32"])
    fraction = pm.predict_case(case, "triton-v1", DEVICE)
    launch = pm.row_launch(case.n_tokens * case.heads_q, case.head_dim, case.element_size)
    assert fraction == pytest.approx(pm.predicted_pct(launch, DEVICE))  # q and k alike (MHA): the same fraction
    assert pm.predict_case(case, "torch-compile", DEVICE) is None


def test_v3_and_v4_are_modelled_with_their_gpu_tiles_and_beat_the_row_kernels_on_prefill():
    from ropekit.bench import select_cases

    (case,) = select_cases(("main",), ["llama3-8b-prefill"])
    interpret = ropekit.device.INTERPRET
    rows, v3, v4 = (pm.predict_case(case, impl, DEVICE) for impl in ("triton-v2", "triton-v3", "triton-v4"))
    assert 0 < rows < v3 <= 100 and 0 < v4 <= 100
    launches = pm.LADDER_LAUNCHES["triton-v3"](case, DEVICE)
    assert len(launches) == 2  # q and k: one launch each
    assert all(launch.bytes_in_flight_per_program > case.head_dim * case.element_size for launch in launches)
    assert len(pm.LADDER_LAUNCHES["triton-v4"](case, DEVICE)) == 1  # q and k in one launch
    assert ropekit.device.INTERPRET == interpret  # modelling the GPU configuration leaves the flag as it was


def test_the_v3_tile_shrinks_until_the_grid_fills_the_sms():
    from ropekit.bench import select_cases

    (case,) = select_cases(("main",), ["decode"])  # one token a sequence: one-token tiles
    assert all(launch.programs == case.batch for launch in pm.LADDER_LAUNCHES["triton-v3"](case, DEVICE))


def test_the_peers_launch_shapes_predict_the_large_prefill_at_the_ceiling_and_decode_below_it():
    from ropekit import bench

    cases = {case.name: case for case in bench.MAIN_CASES}
    model = pm.ASSUMED_H100
    for impl in ("liger", "flash-attn"):
        assert pm.predict_case(cases["llama3-8b-prefill"], impl, model) == 100.0
    # decode: flash-attention's 8-token blocks hold one token each, two launches; Liger holds every head of a token
    flash = pm.predict_case(cases["decode"], "flash-attn", model)
    liger = pm.predict_case(cases["decode"], "liger", model)
    assert flash < liger < 100.0
    launches = pm.LADDER_LAUNCHES["flash-attn"](cases["decode"], model)
    assert len(launches) == 2 and launches[0].bytes_in_flight_per_program == 2 * 128 * 2  # 1 token x 2 heads x 128
    eager = pm.predict_case(cases["llama3-8b-prefill"], "torch-eager", model)
    assert eager == pytest.approx(20.0)  # five times the ideal bytes, each kernel at the ceiling
    assert pm.predict_case(cases["llama3-8b-prefill"], "torch-compile", model) is None


def test_issue_slots_a_byte_and_the_share_a_kernel_needs():
    from ropekit.triton import model

    # 2000 GB/s over 100 SMs at 2 GHz: 10 bytes an SM-cycle; 128 thread instructions a cycle: 12.8 a byte
    assert model.issue_slots_per_byte(DEVICE, 2.0) == pytest.approx(12.8)
    twice_the_bus = pm.DeviceModel("test", 100, 4000.0, 500.0, "test")
    assert model.issue_slots_per_byte(twice_the_bus, 2.0) == pytest.approx(6.4)
    # 9.6 instructions a byte keep three quarters of the slots busy at the ceiling, and all of them at twice the bus
    assert model.issue_share_needed(DEVICE, 2.0, 9.6) == pytest.approx(0.75)
    assert model.issue_share_needed(twice_the_bus, 2.0, 9.6) == pytest.approx(1.5)
