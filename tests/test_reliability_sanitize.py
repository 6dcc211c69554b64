"""ropekit.reliability.sanitize: the driver compute-sanitizer runs. On the GPU, tools/sanitize.sh runs it under the
sanitizer; here it runs under the interpreter, where every result is still checked against the reference."""

import pytest

import ropekit
from ropekit.frequencies import inverse_frequencies
from ropekit.reliability import sanitize, sanitize_fused
from ropekit.triton.configs import FlatConfig
from ropekit.reliability.configs import Config, Family
from conftest import DEVICE, ON_GPU


@pytest.mark.skipif(ON_GPU, reason="on the GPU, tools/sanitize.sh runs the driver under compute-sanitizer")
def test_sanitize_driver_runs_every_kernel_cleanly(capsys):
    assert sanitize.sanitize_driver(verbose=True, candidates=2) == 0
    lines = capsys.readouterr().out.splitlines()
    for kernel in ("triton v1", "triton v2", "triton v3", "out-of-table", "fused cache write",
                   "triton M-RoPE contiguous", "triton M-RoPE interleaved", "triton NoPE temperature",
                   "fused cache write: MLA table-free one cache", "fused cache write: MLA table-free (ckv_cache"):
        assert any(line.startswith("ok") and kernel in line for line in lines), kernel
    # the fused kernel's every quantising store (float8 e4m3/e5m2, int8 at each kind of scale)
    assert sum(line.startswith("ok    triton fused quantising store") for line in lines) == len(
        sanitize.QUANTISED_CACHES)
    # the norm across all heads of a token, before and after the rotation, forward and backward
    assert sum(line.startswith("ok    triton fused norm across all heads") for line in lines) == len(
        sanitize.NORM_PLACES) == 2
    # every configuration once with the launcher's own choice and once with each configuration the choice can reach
    # for it (here the first two candidates a call: the model's own first)
    configs = sanitize.sanitize_configs()
    reachable = [sanitize.reachable_configs(cfg, limit=2) for cfg in configs]
    assert sum(line.startswith("ok    triton ") and "config=" in line for line in lines) == sum(map(len, reachable))
    assert sum(line.startswith("ok    triton ") and "seed=" in line for line in lines) == len(configs) + sum(
        map(len, reachable))
    assert sum(len(r) == 2 for r in reachable) >= len(configs) // 2


def test_a_forced_launch_config_is_checked_against_the_reference(monkeypatch):
    # forward and the backward's conjugate rotation, here on the flat path of q and k paired
    cfg = Config(Family(dtype="fp32", head_dim=32, rotary_dim=32, backward="full"), seed=3, batch=2, seqlen=5,
                 heads_q=2, heads_k=2)
    assert sanitize.run_with_launch_config(cfg, FlatConfig(32, 1, paired=True)) == []
    real = sanitize.rope_v4
    monkeypatch.setattr(sanitize, "rope_v4", lambda *args, conjugate, **kwargs: real(*args, conjugate=not conjugate,
                                                                                     **kwargs))
    messages = sanitize.run_with_launch_config(cfg, FlatConfig(32, 1, paired=True))
    assert any(m.startswith("q:") for m in messages) and any(m.startswith("k (conjugate):") for m in messages)


@pytest.mark.parametrize("address,kv_layout,fp8", sanitize.CACHE_ADDRESS_MAPS,
                         ids=[f"{a}-{layout}{'-fp8' if fp8 else ''}" for a, layout, fp8 in sanitize.CACHE_ADDRESS_MAPS])
def test_the_driver_writes_through_every_cache_address_map_and_reads_it_back(address, kv_layout, fp8, monkeypatch):
    """Each address map of the fused forward, launched on the Triton kernel and read back through the map; a map
    that sends a token to the wrong row fails the check."""
    with ropekit.device.set_backend("triton"):
        assert sanitize.check_cache_address_map(address, kv_layout, fp8, DEVICE) == ""
        real = ropekit.rope_and_cache if not address.startswith("MLA") else ropekit.mla_rope_and_cache
        name = "rope_and_cache" if not address.startswith("MLA") else "mla_rope_and_cache"

        def shifted(*args, **kwargs):  # every token one row further: the wrong address
            for key in ("slot_mapping", "cache_positions"):
                if kwargs.get(key) is not None:
                    kwargs[key] = kwargs[key] + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(sanitize_fused, name, shifted)  # the module whose check makes the call
        assert "is not its reference" in sanitize.check_cache_address_map(address, kv_layout, fp8, DEVICE)


MLA_TABLE_FREE = [entry for entry in sanitize.CACHE_ADDRESS_MAPS if entry[0].startswith("MLA table-free")]


def test_the_driver_runs_mlas_table_free_angles_into_each_cache_form():
    """vLLM's one latent cache by slot mapping (float8) and FlashInfer's two caches by page table."""
    assert sorted(("kpe_cache" in address, "slot_mapping" in address, fp8)
                  for address, _, fp8 in MLA_TABLE_FREE) == [(False, True, True), (True, False, False)]


@pytest.mark.parametrize("wrong", ["scale 1", "plain frequencies", "one position on"])
@pytest.mark.parametrize("address,kv_layout,fp8", MLA_TABLE_FREE, ids=[a for a, _, _ in MLA_TABLE_FREE])
def test_the_table_free_mla_launch_checks_its_angles(address, kv_layout, fp8, wrong, monkeypatch):
    """The table-free launch is checked against YaRN's angles times its attention factor: a call without the scale,
    with the plain frequencies, or one position further fails the check."""
    real = ropekit.mla_rope_and_cache

    def changed(*args, **kwargs):
        if wrong == "scale 1":
            kwargs["scale"] = 1.0
        elif wrong == "plain frequencies":
            kwargs["inv_freq"] = inverse_frequencies(64).float().to(kwargs["inv_freq"].device)
        else:
            kwargs["positions"] = kwargs["positions"] + 1
        return real(*args, **kwargs)

    with ropekit.device.set_backend("triton"):
        monkeypatch.setattr(sanitize_fused, "mla_rope_and_cache", changed)
        assert sanitize.check_cache_address_map(address, kv_layout, fp8, DEVICE) != ""


def test_the_driver_reads_fp8_ds_mla_entries_back_byte_for_byte(monkeypatch):
    """DeepSeek's fp8_ds_mla entry through the page table: three 128-channel tiles (the kernel's fourth lane tile
    masked); a writer whose tiles are scaled otherwise (kv_c doubled, so every scale doubles) fails the check."""
    entry = next(e for e in sanitize.CACHE_ADDRESS_MAPS if "fp8_ds_mla" in e[0])
    with ropekit.device.set_backend("triton"):
        assert sanitize.check_cache_address_map(*entry, DEVICE) == ""
        real = ropekit.mla_rope_and_cache
        monkeypatch.setattr(sanitize_fused, "mla_rope_and_cache",
                            lambda q_pe, k_pe, kv_c, *args, **kwargs: real(q_pe, k_pe, kv_c * 2, *args, **kwargs))
        assert "is not its reference" in sanitize.check_cache_address_map(*entry, DEVICE)
