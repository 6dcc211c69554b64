"""ropekit.fused.validate: the fused ops' own argument checks, each error naming its argument; values inside device
tensors read only in check mode."""

import pytest
import torch

from ropekit.fused import validate
from conftest import DEVICE


def test_scales_are_read_with_a_float8_cache_only():
    validate.check_scale("k_scale", None, False, torch.device(DEVICE))
    validate.check_scale("k_scale", torch.ones(1, device=DEVICE), True, torch.device(DEVICE))
    validate.check_scale("k_scale", torch.ones(1, device=DEVICE), False, torch.device(DEVICE))  # accepted, unread
    with pytest.raises(TypeError, match="k_scale must be a tensor or None"):
        validate.check_scale("k_scale", 1.0, False, torch.device(DEVICE))
    for bad in (None, 0.5, torch.ones(2, device=DEVICE), torch.ones(1, device=DEVICE, dtype=torch.float16)):
        with pytest.raises(TypeError, match="v_scale"):
            validate.check_scale("v_scale", bad, True, torch.device(DEVICE))


def test_cache_offsets_int_becomes_a_device_tensor_and_check_mode_reads_the_range(monkeypatch):
    offsets = validate.check_cache_offsets(3, 2, lambda: [2, 2], 8, torch.device(DEVICE))
    assert offsets.tolist() == [3, 3] and offsets.device.type == torch.device(DEVICE).type
    with pytest.raises(ValueError, match="cache_offsets must be >= 0"):
        validate.check_cache_offsets(-1, 2, lambda: [2, 2], 8, torch.device(DEVICE))
    with pytest.raises(ValueError, match=r"cache_offsets must have shape \(2,\)"):
        validate.check_cache_offsets(torch.zeros(3, dtype=torch.int64, device=DEVICE), 2, None, 8,
                                     torch.device(DEVICE))
    past = torch.tensor([0, 7], device=DEVICE)  # 7 + 2 rows > 8
    validate.check_cache_offsets(past, 2, lambda: [2, 2], 8, torch.device(DEVICE))  # not read outside check mode
    monkeypatch.setenv("ROPEKIT_CHECK", "1")
    with pytest.raises(ValueError, match="cache_offsets must place every sequence"):
        validate.check_cache_offsets(past, 2, lambda: [2, 2], 8, torch.device(DEVICE))


def test_norm_arguments():
    q, k = torch.empty(1, 2, 2, 8, device=DEVICE), torch.empty(1, 2, 1, 8, device=DEVICE)
    w = torch.ones(8, device=DEVICE)
    assert validate.check_norm(q, k, w, w, 1e-6, 1) == (1e-6, 1.0)
    with pytest.raises(ValueError, match="k_weight is given but k is None"):
        validate.check_norm(q, None, w, w, 1e-6, 0.0)
    with pytest.raises(TypeError, match="eps"):
        validate.check_norm(q, k, w, w, True, 0.0)


def test_overlap_is_refused_by_name():
    buffer = torch.zeros(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="k_cache and v share memory"):
        validate.check_overlaps(("k_cache", "v"), (buffer[:, :5], buffer[:, 4:]), ("k_cache",))
    validate.check_overlaps(("k_cache", "v"), (buffer[:, :4], buffer[:, 4:]), ("k_cache",))
    validate.check_overlaps(("cos", "sin"), (buffer[:, :5], buffer[:, 4:]), ())  # two reads may share memory
