"""ropekit.model_check: tiny random Llama and Qwen3 decoded through rope_and_cache into a paged cache, against
transformers' own forward over the same tokens.

The bound on the logits of the paged, fused decode: in float32 within 1e-4 of transformers' logits; in bfloat16 no
further from the float64 model than 1.5x transformers' own bfloat16 error, and within 2x that error of transformers'
bfloat16 logits. The CPU runs (Triton interpreter) decode 2 tokens; the GPU
runs decode 32, as the check is specified.
"""

import pytest
import torch

from conftest import DEVICE, gpu_only
from ropekit import model_check
from ropekit.frequencies import cos_sin_table

pytest.importorskip("transformers")


def assert_within_bound(result):
    if result.dtype == "float32":
        assert result.max_abs_vs_transformers <= 1e-4, result
    else:
        own = result.max_abs_transformers_vs_float64
        assert own > 0
        assert result.max_abs_ropekit_vs_float64 <= 1.5 * own, result
        assert result.max_abs_vs_transformers <= 2.0 * own, result


@pytest.mark.parametrize("family, dtype", [("llama", torch.float32), ("qwen3", torch.bfloat16)])
def test_paged_fused_decode_matches_transformers(family, dtype):
    result = model_check.decode_check(family, dtype, steps=2, prompt_lens=(3, 18), block_size=4, device=DEVICE)
    assert len(result.tokens[1]) == 18 + 2
    assert_within_bound(result)


def test_check_catches_a_wrong_rotation(monkeypatch):
    """The check can fail: tables for another base (every angle wrong) move the logits far past the bound."""
    init = model_check.PagedDecoder.__init__

    def wrong_base(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.cos, self.sin = cos_sin_table(self.cos.shape[0], 2 * self.cos.shape[1], base=500.0, device=DEVICE)

    monkeypatch.setattr(model_check.PagedDecoder, "__init__", wrong_base)
    result = model_check.decode_check("qwen3", torch.float32, steps=1, prompt_lens=(6,), block_size=4,
                                      device=DEVICE)
    assert result.max_abs_vs_transformers > 1e-2


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", model_check.FAMILIES)
def test_decode_32_tokens_on_gpu(family, dtype):
    result = model_check.decode_check(family, dtype, steps=32, prompt_lens=(5, 11, 40), block_size=16,
                                      device=DEVICE)
    print(result.to_json())
    assert_within_bound(result)


def test_cli_writes_every_family_and_dtype(tmp_path, monkeypatch):
    """The command's plumbing (the check itself is the tests above): one result per family and dtype, in JSON."""
    import json

    seen = []

    def fake_check(family, dtype, **kwargs):
        seen.append((family, dtype, kwargs["steps"]))
        return model_check.DecodeResult(family, str(dtype), kwargs["steps"], (1,), 16, 0.0, 0.0, 0.0, 1.0, [[1]])

    monkeypatch.setattr(model_check, "decode_check", fake_check)
    assert model_check.main(["--out", str(tmp_path), "--steps", "3"]) == 0
    doc = json.loads((tmp_path / "model_check.json").read_text())
    assert len(doc["results"]) == 4 and all("tokens" not in r for r in doc["results"])
    assert {(f, s) for f, _, s in seen} == {("llama", 3), ("qwen3", 3)}
