"""The fuzzer draws every argument of the fused ops: table-free angles (``inv_freq``, ``scale``) and M-RoPE
(``mrope_section``, ``mrope_interleaved``) in ``rope_and_cache``, ``qk_norm_rope`` and ``apply_rope``, the float8 q
output of ``rope_and_cache`` (``q_dtype``, ``q_scale``), FlashInfer's float8 calls (``rope_quantize_fp8``,
``rope_quantize_fp8_append_paged_kv_cache``), vLLM's ``rope_dim_offset`` and ``inverse``, FlashInfer's ``enable_pdl``
and SGLang's ``fused_set_kv_buffer_arg``; valid draws match the float64 reference, invalid ones are refused by name
before anything is written, and the new checks can fail."""

import json

import pytest
import torch

from ropekit.reliability import fuzz
from conftest import DEVICE

FP8_TARGETS = ("rope_quantize_fp8", "rope_quantize_fp8_append_paged_kv_cache")


@pytest.mark.parametrize("name", FP8_TARGETS + ("apply_rope_with_cos_sin_cache_inplace",))
def test_a_seeded_run_of_the_engines_float8_and_kv_buffer_calls_finds_no_violation(name):
    counts = fuzz.run(40, seed=11, device=DEVICE, targets=[name], max_findings=5)
    assert counts["cases"] == 40 and counts["matched"] > 15 and counts["documented_errors"] > 0
    assert counts["violations"] == 0, json.dumps(counts["findings"], indent=1, default=str)


DRAWS = 400  # drawn, not run


@pytest.fixture(scope="module")
def drawn():
    targets = fuzz.targets()
    names = ("apply_rope", "qk_norm_rope", "rope_and_cache", "rotary_embedding",
             "apply_rope_with_cos_sin_cache_inplace") + FP8_TARGETS
    return {name: [fuzz.draw_case(0, index, DEVICE, {name: targets[name]}) for index in range(DRAWS)]
            for name in names}


def _refused(case, why: str) -> bool:
    return case.expect == fuzz.RAISE and why in case.why_raise


def _angles(spec) -> bool:
    return bool(spec.get("angles"))


DRAWN = {
    **{f"{op}: inv_freq": (op, lambda case: _angles(case.spec) and case.expect == fuzz.MATCH)
       for op in ("apply_rope", "qk_norm_rope", "rope_and_cache")},
    **{f"{op}: inv_freq with a scale": (op, lambda case: _angles(case.spec) and case.spec["scale"] != 1.0
                                        and case.expect == fuzz.MATCH)
       for op in ("apply_rope", "qk_norm_rope", "rope_and_cache")},
    **{f"{op}: M-RoPE, {how}": (op, lambda case, interleaved=how == "interleaved": case.expect == fuzz.MATCH
                                and case.spec.get("mrope_section") is not None
                                and case.spec["mrope_interleaved"] == interleaved)
       for op in ("qk_norm_rope", "rope_and_cache") for how in ("contiguous", "interleaved")},
    "rope_and_cache: M-RoPE with inv_freq": ("rope_and_cache", lambda case: _angles(case.spec)
                                             and case.spec["mrope_section"] is not None),
    "rope_and_cache: M-RoPE packed (3, tokens)": ("rope_and_cache", lambda case: case.spec["layout"] == "thd"
                                                  and case.spec["mrope_section"] is not None),
    "rope_and_cache: inv_freq with a quantised cache": ("rope_and_cache", lambda case: _angles(case.spec)
                                                        and case.spec["scales_mode"] is not None),
    **{f"rope_and_cache: a {fmt} q output": ("rope_and_cache", lambda case, fmt=fmt: case.expect == fuzz.MATCH
                                             and case.spec["q_dtype"] == f"torch.{fmt}")
       for fmt in ("float8_e4m3fn", "float8_e5m2")},
    "rope_and_cache: q_dtype of q's own dtype": ("rope_and_cache", lambda case: case.spec["q_dtype"]
                                                 == case.spec["dtype"]),
    # refused by name, before anything is written
    **{f"{op} refuses {why}": (op, lambda case, why=why: _refused(case, why))
       for op in ("apply_rope", "rope_and_cache")
       for why in ("inv_freq of a half dtype", "inv_freq together with cos/sin", "a 2-D inv_freq",
                   "an mrope_section that does not sum to rotary_dim/2", "scale other than 1 without inv_freq")},
    **{f"rope_and_cache refuses {why}": ("rope_and_cache", lambda case, why=why: _refused(case, why))
       for why in ("a float8 q output in place", "no q_scale", "q_scale without q_dtype", "a float16 q_scale")},
    # FlashInfer's float8 calls
    "rope_quantize_fp8: MLA's 2-D k_rope": ("rope_quantize_fp8", lambda case: case.spec["mla"]
                                            and case.expect == fuzz.MATCH),
    "rope_quantize_fp8: every output given": ("rope_quantize_fp8", lambda case: len(case.spec["outputs"]) >= 3),
    "rope_quantize_fp8: e5m2": ("rope_quantize_fp8", lambda case: case.spec["quantize_dtype"] == "torch.float8_e5m2"
                                and case.expect == fuzz.MATCH),
    "rope_quantize_fp8: quantize_dtype from the outputs": ("rope_quantize_fp8", lambda case: case.spec[
        "quantize_dtype"] == "None" and case.spec["outputs"]),
    "rope_quantize_fp8 refuses a bad scale": ("rope_quantize_fp8", lambda case: _refused(case, "not a finite float")),
    "append: HND caches": ("rope_quantize_fp8_append_paged_kv_cache", lambda case: not case.spec["mla"]
                           and case.spec["kv_layout"] == "HND" and case.expect == fuzz.MATCH),
    "append: MLA's two caches": ("rope_quantize_fp8_append_paged_kv_cache", lambda case: case.spec["mla"]
                                 and case.expect == fuzz.MATCH),
    "append: a k_nope beside k_rope": ("rope_quantize_fp8_append_paged_kv_cache", lambda case: not case.spec["mla"]
                                       and case.spec["no_rope_dim"] and case.expect == fuzz.MATCH),
    "append: padded cache channels": ("rope_quantize_fp8_append_paged_kv_cache", lambda case: case.spec["pad"]),
    "append refuses a page_size not the caches'": ("rope_quantize_fp8_append_paged_kv_cache",
                                                   lambda case: _refused(case, "page_size")),
    "append, check mode: a page table entry refused": ("rope_quantize_fp8_append_paged_kv_cache",
                                                       lambda case: _refused(case, "check mode: a ")),
    # the engines' in-place signature's own switches
    "rotary_embedding: rope_dim_offset": ("rotary_embedding", lambda case: case.spec.get("rope_dim_offset", 0) > 0
                                         and case.expect == fuzz.MATCH),
    "rotary_embedding: inverse": ("rotary_embedding", lambda case: case.spec.get("inverse")
                                  and case.expect == fuzz.MATCH),
    "rotary_embedding refuses a rope_dim_offset outside the head": (
        "rotary_embedding", lambda case: _refused(case, "a rope_dim_offset outside the head")),
    "apply_rope_with_cos_sin_cache_inplace: enable_pdl": ("apply_rope_with_cos_sin_cache_inplace",
                                                          lambda case: "enable_pdl" in case.spec),
    # SGLang's fused_set_kv_buffer_arg
    "fused_set_kv_buffer_arg": ("apply_rope_with_cos_sin_cache_inplace", lambda case: case.expect == fuzz.MATCH
                                and case.spec["fused_set_kv_buffer_arg"] is not None),
    "fused_set_kv_buffer_arg with the packed projection's v": (
        "apply_rope_with_cos_sin_cache_inplace", lambda case: case.spec["fused_set_kv_buffer_arg"] is not None
        and case.spec["packed"] and case.spec["fused_set_kv_buffer_arg"]["value"]["stride"][0] > 2 * case.spec[
            "head_size"] * (case.spec["hk"] or 1)),
    "fused_set_kv_buffer_arg refuses a scale": ("apply_rope_with_cos_sin_cache_inplace",
                                                lambda case: _refused(case, "a scale other than None")),
}


@pytest.mark.parametrize("what", DRAWN)
def test_the_fuzzer_draws_every_argument(drawn, what):
    op, has = DRAWN[what]
    assert any(has(case) for case in drawn[op])


FEATURES = {
    "inv_freq": ("rope_and_cache", lambda spec: _angles(spec) and spec["scale"] != 1.0),
    "M-RoPE": ("rope_and_cache", lambda spec: spec["mrope_section"] is not None and spec["tokens"] > 0),
    "a float8 q output": ("rope_and_cache", lambda spec: "float8" in str(spec["q_dtype"]) and spec["hq"] > 0
                          and spec["tokens"] > 0),
    "qk_norm_rope's inv_freq": ("qk_norm_rope", lambda spec: _angles(spec)),
    "qk_norm_rope's M-RoPE": ("qk_norm_rope", lambda spec: spec.get("mrope_section") is not None),
    "apply_rope's inv_freq": ("apply_rope", lambda spec: _angles(spec) and spec["grad"]),
    "rotary_embedding's rope_dim_offset and inverse": ("rotary_embedding", lambda spec: spec.get(
        "rope_dim_offset", 0) > 0 and spec.get("inverse") and spec["tokens"] > 0),
}


def _matching_case(name: str, want, seed: int = 0):
    """The first drawn case of ``name`` that must match the reference and satisfies ``want(spec)``."""
    target = {name: fuzz.targets()[name]}
    for index in range(800):
        case = fuzz.draw_case(seed, index, DEVICE, target)
        if case.expect == fuzz.MATCH and want(case.spec):
            return case
    raise AssertionError("no such case drawn")


@pytest.mark.parametrize("what", FEATURES)
def test_a_valid_draw_matches_the_reference(what):
    name, want = FEATURES[what]
    assert fuzz.judge(_matching_case(name, want)) == ("matched", [])


# --- the new checks can fail ----------------------------------------------------------------------------------------

def _then(case, corrupt):
    call = case.call

    def corrupted():
        result = call()
        corrupt(result)
        return result

    case.call = corrupted
    return case


def _bump(t: torch.Tensor) -> None:
    """The first element of a float8 tensor two codes up: more than the one spacing the checks allow."""
    t.view(torch.uint8)[(0,) * t.ndim] += 2


def test_a_float8_q_output_off_by_two_codes_is_a_violation():
    case = _matching_case("rope_and_cache", FEATURES["a float8 q output"][1])
    outcome, problems = fuzz.judge(_then(case, lambda result: _bump(result[0])))
    assert outcome == "violation" and any(p.startswith("q (float8)") for p in problems), problems


@pytest.mark.parametrize("part", [0, 2], ids=["q_rope_out", "q_nope_out"])
def test_a_wrong_float8_part_of_rope_quantize_fp8_is_a_violation(part):
    case = _matching_case("rope_quantize_fp8", lambda spec: spec["tokens"] > 0 and spec["q_nope"] is not None)
    outcome, problems = fuzz.judge(_then(case, lambda result: _bump(result[part])))
    assert outcome == "violation" and any(("q_rope_out" if part == 0 else "q_nope_out") in p for p in problems)


def test_a_wrong_row_of_the_appended_cache_is_a_violation():
    case = _matching_case("rope_quantize_fp8_append_paged_kv_cache",
                          lambda spec: not spec["mla"] and any(s >= 0 for s in spec["slots"]))
    slot = next(s for s in case.spec["slots"] if s >= 0)
    cache = case.tensors["v_cache"]
    rows = cache.transpose(1, 2) if case.spec["kv_layout"] == "HND" else cache
    row = rows[slot // case.spec["page_size"], slot % case.spec["page_size"]]
    outcome, problems = fuzz.judge(_then(case, lambda result: _bump(row)))
    assert outcome == "violation" and any("v_cache" in p for p in problems), problems


def test_a_wrong_kv_buffer_row_is_a_violation():
    case = _matching_case("apply_rope_with_cos_sin_cache_inplace", lambda spec: (
        spec["fused_set_kv_buffer_arg"] is not None and any(s >= 0 for s in spec["fused_set_kv_buffer_arg"][
            "cache_loc"])))
    slot = next(s for s in case.spec["fused_set_kv_buffer_arg"]["cache_loc"] if s >= 0)
    row = case.tensors["v_buffer"][slot]
    outcome, problems = fuzz.judge(_then(case, lambda result: row[(0,) * row.ndim].add_(1.0)))
    assert outcome == "violation" and any("v_buffer" in p for p in problems), problems


# --- refusals name their argument -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["inv_freq", "scale", "mrope_section", "mrope_interleaved", "q_dtype", "q_scale",
                                  "norm", "norm_over", "write_k", "kv_cache_scale", "fused_set_kv_buffer_arg",
                                  "quantize_dtype", "quant_scale_q", "quant_scale_kv", "q_rope_out", "k_rope_out",
                                  "q_nope_out", "k_nope_out", "q_rope", "k_rope", "q_nope", "k_nope", "pos_ids",
                                  "paged_kv_cache", "page_size"])
def test_an_error_naming_the_new_arguments_is_documented(name):
    assert fuzz._documented(ValueError(f"{name} must be something else"), overlap=False) is None
    assert fuzz._documented(ValueError(f"x{name} must be something else"), overlap=False) is not None


NEW_REFUSALS = ("inv_freq of a half dtype", "a 2-D inv_freq", "a scale that is not finite",
                "inv_freq together with cos/sin", "scale other than 1 without inv_freq",
                "an mrope_section that does not sum to rotary_dim/2", "no q_scale", "q_scale without q_dtype",
                "an int8 q_dtype", "a float16 q_scale", "a q_scale of two elements", "a float8 q output in place")


@pytest.mark.parametrize("name", ["apply_rope", "qk_norm_rope", "rope_and_cache"])
def test_every_refusal_of_a_new_argument_is_documented_and_writes_nothing(drawn, name):
    """The drawn calls refused for one of the new arguments alone run and raise a documented error naming an
    argument, with every buffer unchanged (``fuzz.judge``)."""
    chosen = [case for case in drawn[name] if case.why_raise in NEW_REFUSALS][:10]
    assert len(chosen) >= 3
    for case in chosen:
        assert fuzz.judge(case) == ("documented_error", []), case.why_raise


def test_a_refused_k_nope_writes_nothing():
    target = {"x": fuzz.targets()["rope_quantize_fp8_append_paged_kv_cache"]}
    for index in range(2000):
        case = fuzz.draw_case(0, index, DEVICE, target)
        if case.why_raise == "a k_nope whose heads or dtype are not k_rope's" and any(
                s >= 0 for s in case.spec["slots"]):
            break
    else:
        raise AssertionError("no such case drawn")
    assert fuzz.judge(case) == ("documented_error", [])
