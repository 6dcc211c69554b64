"""ropekit.reliability.fuzz_cache: the cache-writing ops under hostile inputs find no violation; the fuzzer draws
what callers do (every layout, both cache addressings, engines' cache views, every overlap kind, DeepSeek's fp8_ds_mla
entry and its misuses); and the targets' checks fail when a written slot is wrong (an fp8_ds_mla entry's tile scale,
e4m3 values or k_pe bytes too), when a slot no token names changes, when v's bits change, and when an aliased call is
accepted or writes before it is refused."""

import collections
import json
import random
import re

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.reliability import fuzz, fuzz_cache
from conftest import DEVICE

NAMES = ("rope_and_cache", "mla_rope_and_cache")
CACHE = {"rope_and_cache": "k_cache", "mla_rope_and_cache": "kv_cache"}


@pytest.mark.parametrize("name", NAMES)
def test_a_seeded_run_of_the_cache_ops_finds_no_violation(name):
    # aliased calls among them: each must be refused, before anything is written
    counts = fuzz.run(40, seed=11, device=DEVICE, targets=[name], max_findings=5)
    assert counts["cases"] == 40 and counts["matched"] > 15 and counts["documented_errors"] > 0
    assert sum(kind["cases"] for kind in counts["by_overlap_kind"].values()) > 0
    assert counts["violations"] == 0, json.dumps(counts["findings"], indent=1, default=str)


# drawn, not run: a draw places the tensors and states what the call must do (a cache over norm weights, the rarest
# overlap kind, comes about once in 400 draws)
DRAWS = 1000


@pytest.fixture(scope="module")
def drawn():
    targets = fuzz.targets()
    chosen = {name: targets[name] for name in NAMES + ("qk_norm_rope",)}
    return [fuzz.draw_case(0, index, DEVICE, chosen).spec for index in range(DRAWS)]


@pytest.mark.parametrize("kind", fuzz_cache.OVERLAP_KINDS)
def test_every_overlap_kind_is_drawn(drawn, kind):
    counts = collections.Counter(spec.get("overlap_kind") for spec in drawn)
    assert counts[kind] > 0, counts


def _cache_specs(drawn, op):
    return [spec for spec in drawn if spec.get("op") == op]


CALLERS = {
    **{f"layout {layout}": ("rope_and_cache", lambda spec, layout=layout: spec["layout"] == layout)
       for layout in ("bshd", "sbhd", "bhsd", "thd")},
    "a paged cache": ("rope_and_cache", lambda spec: spec["paged"]),
    "a contiguous cache with cache_offsets": ("rope_and_cache", lambda spec: not spec["paged"]),
    "vLLM's kv[:, 0] and kv[:, 1]": ("rope_and_cache", lambda spec: spec["engine_cache"]["pair"]),
    "FlashInfer's HND transpose": ("rope_and_cache", lambda spec: spec["engine_cache"]["hnd"]),
    "head dim padded in the allocation": ("rope_and_cache", lambda spec: spec["engine_cache"]["pad"] > 0),
    "blocks a step apart": ("rope_and_cache", lambda spec: spec["engine_cache"]["step"] > 1),
    "a uint8 cache": ("rope_and_cache", lambda spec: spec["cache_dtype"] == "torch.uint8"),
    "write_k": ("rope_and_cache", lambda spec: spec["write_k"]),
    "a short slot mapping": ("rope_and_cache", lambda spec: spec["paged"] and len(spec["slot_mapping"])
                             < spec["tokens"]),
    "Hq = 0": ("rope_and_cache", lambda spec: spec["hq"] == 0 and spec["tokens"] > 0),
    "a cache that requires grad": ("rope_and_cache", lambda spec: spec["cache_requires_grad"]),
    "tensors apart in one byte pool": ("rope_and_cache", lambda spec: spec.get("overlap") == "apart in one pool"),
    "a float8 e5m2 cache": ("rope_and_cache", lambda spec: spec["cache_dtype"] == "torch.float8_e5m2"),
    "vLLM's uint8 e5m2 cache": ("rope_and_cache", lambda spec: spec["kv_cache_dtype"] == "fp8_e5m2"
                                and spec["cache_dtype"] == "torch.uint8"),
    "an int8 cache": ("rope_and_cache", lambda spec: spec["cache_dtype"] == "torch.int8"),
    "per-head scales": ("rope_and_cache", lambda spec: spec["scales_mode"] == "head"),
    "per-(token, head) scales": ("rope_and_cache", lambda spec: spec["scales_mode"] == "token_head"),
    "vLLM's fp8_per_token_head": ("rope_and_cache", lambda spec: spec["kv_cache_dtype"] == "fp8_per_token_head"),
    "an NVFP4 cache": ("rope_and_cache", lambda spec: spec["kv_cache_dtype"] == "nvfp4"),
    "an NVFP4 cache in FlashInfer's HND": ("rope_and_cache", lambda spec: spec["kv_cache_dtype"] == "nvfp4"
                                           and spec["kv_layout"] == "HND"),
    "an NVFP4 cache with NeoX pairing": ("rope_and_cache", lambda spec: spec["kv_cache_dtype"] == "nvfp4"
                                         and not spec["interleaved"]),
    "a NoPE layer": ("rope_and_cache", lambda spec: spec["nope_misuse"] == "valid"),
    "a NoPE layer given what it does not take": ("rope_and_cache", lambda spec: spec["nope_misuse"] not in (
        None, "valid")),
    "MLA out of place": ("mla_rope_and_cache", lambda spec: not spec["inplace"]),
    "MLA's uint8 cache": ("mla_rope_and_cache", lambda spec: spec["cache_dtype"] == "torch.uint8"),
    "MLA's float8 e5m2 cache": ("mla_rope_and_cache", lambda spec: spec["cache_dtype"] == "torch.float8_e5m2"),
    "MLA's uint8 e5m2 cache named fp8_e5m2": ("mla_rope_and_cache", lambda spec: spec["kv_cache_dtype"] == "fp8_e5m2"
                                              and spec["cache_dtype"] == "torch.uint8"),
    "MLA's engines' cos_sin_cache": ("mla_rope_and_cache", lambda spec: spec["engines_table"]),
    "MLA's short slot mapping": ("mla_rope_and_cache", lambda spec: len(spec["slot_mapping"]) < spec["tokens"]),
    "MLA out of place on an aliased cache": ("mla_rope_and_cache", lambda spec: not spec["inplace"]
                                             and spec.get("overlap_kind", "").startswith("a cache")),
}


@pytest.mark.parametrize("what", CALLERS)
def test_the_fuzzer_draws_what_callers_do(drawn, what):
    op, has = CALLERS[what]
    assert any(has(spec) for spec in _cache_specs(drawn, op))


def _aliased_case(name: str):
    """The first drawn case of ``name`` whose cache lies on another tensor's bytes, and nothing else makes it refused
    (it must be refused for that)."""
    for index in range(400):
        case = fuzz.draw_case(5, index, DEVICE, {name: fuzz_cache.TARGETS[name]})
        if case.spec.get("overlap_kind", "").startswith("a cache over") and case.expect == fuzz.RAISE and \
                ";" not in case.why_raise:
            return case
    raise AssertionError("no aliased case drawn")


@pytest.mark.parametrize("name", NAMES)
def test_an_accepted_aliased_call_is_a_violation_named_by_its_overlap(name):
    case = _aliased_case(name)
    case.call = lambda: None  # accepted, nothing written
    outcome, problems = fuzz.judge(case)
    written, other = case.spec["overlap"].split(" over ")
    assert outcome == "violation" and f"must refuse ({written} lies on {other}'s bytes" in problems[-1], problems
    assert case.spec["overlap_kind"] in fuzz_cache.OVERLAP_KINDS


@pytest.mark.parametrize("name", NAMES)
def test_an_aliased_call_refused_by_name_is_a_documented_error_unless_it_wrote_first(name):
    case = _aliased_case(name)
    written = case.spec["overlap"].split(" over ")[0]  # the cache (MLA: its one cache, or ckv_cache or kpe_cache)
    cache = case.tensors[written]

    def refuse():
        raise ValueError(f"{written} and another argument share memory")

    case.call = refuse
    assert fuzz.judge(case) == ("documented_error", [])

    def write_then_refuse():
        cache[(0,) * (cache.ndim - 1)].view(torch.uint8)[0].add_(1)  # one byte of the cache's first row
        refuse()

    case = _aliased_case(name)
    cache = case.tensors[written]
    case.call = write_then_refuse
    outcome, problems = fuzz.judge(case)
    assert outcome == "violation" and "raised ValueError but wrote" in problems[0], problems


def test_footprints_and_overlaps_are_in_bytes_whatever_the_dtypes():
    arena = fuzz.Arena(random.Random(0), torch.Generator().manual_seed(0), DEVICE)
    arena.share("cache", "v", apart=False)
    cache = arena.place("cache", (4, 8), torch.uint8)
    v = arena.place("v", (2, 4), torch.bfloat16)
    base = arena.buffer_of(v).base
    assert int(fuzz.footprint(v, base).sum()) == 2 * v.numel() and arena.pooled()
    assert fuzz_cache.pool_overlaps(arena, {}, {"cache": cache}, {"v": v})[0] == ["cache lies on v's bytes"]
    arena = fuzz.Arena(random.Random(0), torch.Generator().manual_seed(0), DEVICE)
    arena.share("cache", "v", apart=True)
    cache, v = arena.place("cache", (4, 8), torch.uint8), arena.place("v", (2, 4), torch.bfloat16)
    spec = {}
    assert fuzz_cache.pool_overlaps(arena, spec, {"cache": cache}, {"v": v}) == ([], False)
    assert spec == {"overlap": "apart in one pool"}


def _case(name: str, want=lambda spec: True):
    """The first case of a seed that must succeed, writes at least one slot of a cache in the activations' dtype,
    and satisfies ``want(spec)``; with the cache it writes (:func:`_row` picks a slot's row of it, in place)."""
    for index in range(400):
        case = fuzz.draw_case(23, index, DEVICE, {name: fuzz_cache.TARGETS[name]})
        spec = case.spec
        if (case.expect == fuzz.MATCH and any(s >= 0 for s in spec["slots"]) and "float8" not in spec["cache_dtype"]
                and "int8" not in spec["cache_dtype"] and want(spec)):
            return case, case.tensors[CACHE[name]]
    raise AssertionError("no such case drawn")


def _row(cache, slot: int):
    return cache[slot // cache.shape[1], slot % cache.shape[1]]


def _then(case, corrupt):
    """The case with ``corrupt()`` run right after its call."""
    call = case.call

    def corrupted():
        result = call()
        corrupt()
        return result

    case.call = corrupted
    return case


@pytest.mark.parametrize("name", NAMES)
def test_the_drawn_case_matches_before_it_is_corrupted(name):
    case, _ = _case(name)
    assert fuzz.judge(case)[0] == "matched"


@pytest.mark.parametrize("name", NAMES)
def test_a_wrong_value_in_a_written_slot_is_a_violation(name):
    case, cache = _case(name)
    slot = next(s for s in case.spec["slots"] if s >= 0)
    outcome, problems = fuzz.judge(_then(case, lambda: _row(cache, slot).add_(1.0)))
    assert outcome == "violation" and any("cache" in p for p in problems), problems


@pytest.mark.parametrize("name", NAMES)
def test_a_change_to_a_slot_no_token_names_is_a_violation(name):
    case, cache = _case(name, lambda spec: len({s for s in spec["slots"] if s >= 0})
                        < spec["cache_shape"][0] * spec["cache_shape"][1])
    named = {s for s in case.spec["slots"] if s >= 0}
    free = next(s for s in range(cache.shape[0] * cache.shape[1]) if s not in named)
    outcome, problems = fuzz.judge(_then(case, lambda: _row(cache, free).neg_()))
    assert outcome == "violation" and any("no token names" in p for p in problems), problems


def test_a_wrong_per_token_head_scale_is_a_violation():
    for index in range(400):
        case = fuzz.draw_case(23, index, DEVICE, {"rope_and_cache": fuzz_cache.TARGETS["rope_and_cache"]})
        spec = case.spec
        if case.expect == fuzz.MATCH and spec["scales_mode"] == "token_head" and any(s >= 0 for s in spec["slots"]):
            break
    else:
        raise AssertionError("no such case drawn")
    assert fuzz.judge(case)[0] == "matched"
    slot = next(s for s in spec["slots"] if s >= 0)
    outcome, problems = fuzz.judge(_then(case, lambda: _row(case.tensors["v_scale_cache"], slot).mul_(2)))
    assert outcome == "violation" and any("v_scale_cache" in p for p in problems), problems


@pytest.mark.parametrize("written", ["v_cache", "v_scale_cache"])
def test_a_wrong_nvfp4_value_or_block_scale_is_a_violation(written):
    for index in range(800):
        case = fuzz.draw_case(29, index, DEVICE, {"rope_and_cache": fuzz_cache.TARGETS["rope_and_cache"]})
        spec = case.spec
        if case.expect == fuzz.MATCH and spec["kv_cache_dtype"] == "nvfp4" and spec["kv_layout"] == "NHD" and \
                any(s >= 0 for s in spec["slots"]):
            break
    else:
        raise AssertionError("no such case drawn")
    assert fuzz.judge(case)[0] == "matched"
    row = _row(case.tensors[written].view(torch.uint8), next(s for s in spec["slots"] if s >= 0))
    outcome, problems = fuzz.judge(_then(case, lambda: row.add_(3)))  # a value two codes off, or a scale 3 steps
    assert outcome == "violation" and any("v_cache" in p for p in problems), problems


def test_v_must_reach_its_cache_bit_for_bit():
    case, _ = _case("rope_and_cache")
    row = _row(case.tensors["v_cache"], next(s for s in case.spec["slots"] if s >= 0))
    outcome, problems = fuzz.judge(_then(case, lambda: row.copy_(torch.nextafter(row, torch.full_like(row, 1e9)))))
    assert outcome == "violation" and any("v_cache" in p for p in problems), problems


def _nope_cases(seed: int, want=lambda case: True):
    """The drawn NoPE layers (``nope_temperature``) of a seed's rope_and_cache cases that satisfy ``want``."""
    for index in range(4000):
        case = fuzz.draw_case(seed, index, DEVICE, {"rope_and_cache": fuzz_cache.TARGETS["rope_and_cache"]})
        if case.spec["nope_misuse"] is not None and want(case):
            yield case


def test_nope_layers_valid_and_refused_find_no_violation(monkeypatch):
    """The drawn NoPE layers, until 12 that must succeed and 6 given one thing a NoPE layer does not take (tables,
    inv_freq, a norm, fewer channels, M-RoPE, an invalid pair): each valid one matches the reference (q times its
    temperature; k's output and cache k's bits, v's), each misuse is refused before anything is written, and a
    misuse alone is refused by an error that names nope_temperature."""
    valid, misused, outcomes = 0, collections.Counter(), collections.Counter()
    for case in _nope_cases(31):
        misuse = case.spec["nope_misuse"]
        outcome, problems = fuzz.judge(case)
        assert outcome != "violation", (problems, case.spec)
        outcomes[misuse, outcome] += 1
        if misuse == "valid" and case.expect == fuzz.MATCH:
            valid += 1
        elif misuse != "valid":
            assert case.expect == fuzz.RAISE and outcome == "documented_error"
            if ";" not in case.why_raise:  # refused for the misuse alone: the error says so
                for name, value in case.env.items():
                    monkeypatch.setenv(name, value)
                with pytest.raises((TypeError, ValueError), match="nope_temperature"):
                    case.call()
                misused[misuse] += 1
        if valid >= 12 and sum(misused.values()) >= 6 and len(misused) >= 3:
            break
    else:
        raise AssertionError(f"too few NoPE cases drawn: {outcomes}")


def _valid_nope_case(want):
    return next(_nope_cases(37, lambda case: case.expect == fuzz.MATCH and case.spec["nope_misuse"] == "valid"
                            and case.spec["tokens"] > 0 and want(case.spec)))


def test_a_nope_layers_k_output_off_by_one_bit_is_a_violation():
    def want(spec):
        return spec["write_k"] and not spec["inplace"]

    assert fuzz.judge(_valid_nope_case(want))[0] == "matched"
    case = _valid_nope_case(want)
    call = case.call

    def nudged():
        q_out, k_out = call()
        first = (0,) * k_out.ndim
        k_out[first] = torch.nextafter(k_out[first], torch.full_like(k_out[first], 1e9))
        return q_out, k_out

    case.call = nudged
    outcome, problems = fuzz.judge(case)
    assert outcome == "violation" and any("a NoPE layer passes k through" in p for p in problems), problems


def test_a_nope_layers_k_cache_off_by_one_bit_is_a_violation():
    """k reaches a cache of its own dtype bit for bit (a rotation's tolerance would let a one-bit change pass)."""
    case = _valid_nope_case(lambda spec: spec["cache_dtype"] == spec["dtype"] and any(s >= 0 for s in spec["slots"]))
    row = _row(case.tensors["k_cache"], next(s for s in case.spec["slots"] if s >= 0))
    outcome, problems = fuzz.judge(_then(case, lambda: row.copy_(torch.nextafter(row, torch.full_like(row, 1e9)))))
    assert outcome == "violation" and any(p.startswith("k_cache:") for p in problems), problems


def test_a_pool_grown_for_its_second_tensor_keeps_the_first_ones_writable_bytes():
    arena = fuzz.Arena(random.Random(0), torch.Generator().manual_seed(0), DEVICE)
    arena.share("q", "sin", apart=True)
    q = arena.place("q", (4, 8), torch.bfloat16)
    arena.allow_writes(q)
    arena.place("sin", (1024, 8), torch.float32)  # more bytes than the pool has room for past q
    q.mul_(2)
    assert arena.changed(allow=True) == [] and arena.changed(allow=False)


# mla_rope_and_cache's table-free angles (inv_freq, scale), drawn in a share of its cases: drawn, not run
MLA_DRAWS = 1000


@pytest.fixture(scope="module")
def mla_drawn():
    target = {"mla_rope_and_cache": fuzz_cache.TARGETS["mla_rope_and_cache"]}
    return [fuzz.draw_case(0, index, DEVICE, target).spec for index in range(MLA_DRAWS)]


def _table_free(spec) -> bool:
    return spec["angle_misuse"] == "valid"


MLA_ANGLES = {
    "inv_freq without a table": _table_free,
    "YaRN's frequencies": lambda spec: _table_free(spec) and spec["frequencies"] == "yarn",
    "plain frequencies": lambda spec: _table_free(spec) and spec["frequencies"] == "plain",
    "a float64 inv_freq": lambda spec: _table_free(spec) and spec["inv_freq"]["dtype"] == "torch.float64",
    "an inv_freq longer than rope_dim / 2": lambda spec: _table_free(spec) and spec["inv_freq"]["shape"][-1]
    > spec["rope_dim"] // 2,
    "a scale of 1": lambda spec: _table_free(spec) and spec["angle_scale"] == 1.0,
    "a scale other than 1": lambda spec: _table_free(spec) and spec["angle_scale"] != 1.0,
    "positions past 10^6": lambda spec: _table_free(spec) and max(spec["positions"], default=0) > 10**6,
    "into (ckv_cache, kpe_cache) by page table": lambda spec: _table_free(spec) and spec["separate"]
    and spec["page_table"],
    "inv_freq with cos_sin_cache (refused)": lambda spec: spec["angle_misuse"] == "cos_sin_cache",
    "inv_freq with cos/sin (refused)": lambda spec: spec["angle_misuse"] == "cos/sin",
    "an inv_freq too short (refused)": lambda spec: spec["angle_misuse"] == "short",
    "a scale with a table (refused)": lambda spec: spec["angle_misuse"] == "scale with a table",
}


@pytest.mark.parametrize("what", MLA_ANGLES)
def test_the_fuzzer_draws_mlas_table_free_angles(mla_drawn, what):
    assert any(MLA_ANGLES[what](spec) for spec in mla_drawn)


def test_mlas_table_free_angles_are_a_share_of_its_cases(mla_drawn):
    """About 15 % of the cases; the engines' cos_sin_cache keeps its 30 % (one draw decides both), and a table case
    draws no inv_freq or scale."""
    angles = sum(spec["angles"] for spec in mla_drawn)
    assert 0.1 * MLA_DRAWS < angles < 0.2 * MLA_DRAWS
    engines = sum(spec["engines_table"] and not spec["angles"] for spec in mla_drawn)
    assert 0.25 * MLA_DRAWS < engines < 0.35 * MLA_DRAWS
    assert all(spec["inv_freq"] is None and spec["angle_scale"] is None for spec in mla_drawn
               if not spec["angles"])


def _mla_angle_cases(seed: int, want=lambda case: True):
    """The drawn table-free cases of a seed's mla_rope_and_cache cases (misused ones among them) that satisfy
    ``want``."""
    target = {"mla_rope_and_cache": fuzz_cache.TARGETS["mla_rope_and_cache"]}
    for index in range(4000):
        case = fuzz.draw_case(seed, index, DEVICE, target)
        if case.spec["angles"] and want(case):
            yield case


# what a misuse alone must be refused by: the argument its error names
MISUSE_NAMES = {"inv_freq together with cos_sin_cache": "inv_freq", "inv_freq together with cos/sin": "inv_freq",
                "an inv_freq shorter than rope_dim / 2": "inv_freq", "inv_freq of a half dtype": "inv_freq",
                "a 2-D inv_freq": "inv_freq", "scale other than 1 without inv_freq": "scale",
                "a scale that is not finite": "scale"}


def test_mlas_table_free_angles_valid_and_refused_find_no_violation(monkeypatch):
    """The drawn table-free cases, until 16 that must succeed (YaRN's frequencies and plain ones, a scale other
    than 1 among them) and 6 misuses refused for the misuse alone: each valid one matches the float64 angles, each
    misuse is refused before anything is written, by an error that names the argument."""
    valid, misused, outcomes = collections.Counter(), collections.Counter(), collections.Counter()
    for case in _mla_angle_cases(43):
        outcome, problems = fuzz.judge(case)
        assert outcome != "violation", (problems, case.spec)
        outcomes[case.spec["angle_misuse"], outcome] += 1
        if case.expect == fuzz.MATCH:
            valid[case.spec["frequencies"]] += 1
            valid["scaled"] += case.spec["angle_scale"] != 1.0
        elif case.why_raise in MISUSE_NAMES:  # refused for the misuse alone: the error names the argument
            assert outcome == "documented_error"
            for name, value in case.env.items():
                monkeypatch.setenv(name, value)
            with pytest.raises((TypeError, ValueError), match=rf"\b{MISUSE_NAMES[case.why_raise]}\b"):
                case.call()
            misused[case.why_raise] += 1
        if valid["plain"] + valid["yarn"] >= 16 and min(valid.values()) >= 3 and sum(misused.values()) >= 6 and \
                len(misused) >= 3:
            break
    else:
        raise AssertionError(f"too few table-free cases drawn: {outcomes}")


def _mla_angle_case(want):
    """A table-free case that must match, writes q_pe and k_pe at some position and at least one cache slot."""
    return next(_mla_angle_cases(47, lambda case: case.expect == fuzz.MATCH and case.spec["tokens"] > 0
                                 and any(s >= 0 for s in case.spec["slots"]) and want(case.spec)))


def _recalled(case, **changes):
    """The case's call made again from its drawn tensors and spec, with ``changes`` to its arguments."""
    t, spec = case.tensors, case.spec
    kwargs = dict(interleaved=spec["interleaved"], inplace=spec["inplace"], kv_cache_scale=t.get("kv_cache_scale"),
                  inv_freq=t["inv_freq"], scale=spec["angle_scale"], positions=t["positions"],
                  **{n: t[n] for n in ("kv_indices", "kv_indptr", "batch_indices", "cache_positions") if n in t},
                  **({} if spec["kv_cache_dtype"] is None else dict(kv_cache_dtype=spec["kv_cache_dtype"])))
    kwargs.update(changes)
    caches = (t["ckv_cache"], t["kpe_cache"]) if spec["separate"] else t["kv_cache"]
    case.call = lambda: ropekit.mla_rope_and_cache(t["q_pe"], t["k_pe"], t["kv_c"], caches, t.get("slot_mapping"),
                                                   **kwargs)
    return case


def _far(spec) -> bool:  # positions past 10^6, none of them negative or at int32's limits
    return 10**6 < max(spec["positions"]) <= 10**7 and min(spec["positions"]) >= 0


def test_a_table_free_case_made_again_from_its_spec_matches():
    """(what the corrupted calls below start from)"""
    case = _mla_angle_case(lambda spec: spec["angle_scale"] != 1.0 and _far(spec))
    assert fuzz.judge(_recalled(case))[0] == "matched"


def test_a_table_free_call_at_another_scale_is_a_violation():
    case = _recalled(_mla_angle_case(lambda spec: spec["angle_scale"] != 1.0), scale=1.0)
    outcome, problems = fuzz.judge(case)
    assert outcome == "violation" and any(p.startswith("q_pe:") for p in problems), problems


def test_a_table_free_call_one_position_off_at_long_positions_is_a_violation():
    """At positions past 10^6 the check still tells one position from the next (the float64 angles, no table)."""
    case = _mla_angle_case(_far)
    outcome, problems = fuzz.judge(_recalled(case, positions=case.tensors["positions"] + 1))
    assert outcome == "violation" and any(p.startswith("k_pe:") for p in problems), problems


def test_a_table_free_call_reading_the_frequencies_one_pair_on_is_a_violation():
    """An inv_freq longer than rope_dim / 2: the first rope_dim / 2 entries are the frequencies."""
    def want(spec):
        pairs, values = spec["rope_dim"] // 2, spec["inv_freq"]["values"]
        return len(values) > pairs and values[1:pairs + 1] != values[:pairs]  # (not an expanded view: one value)

    case = _mla_angle_case(want)
    outcome, problems = fuzz.judge(_recalled(case, inv_freq=case.tensors["inv_freq"][1:]))
    assert outcome == "violation" and any(p.startswith("q_pe:") for p in problems), problems


def test_a_wrong_rotated_k_pe_in_a_table_free_case_is_a_violation():
    case = _mla_angle_case(lambda spec: "float8" not in spec["cache_dtype"] and spec["cache_dtype"] != "torch.uint8")
    cache = case.tensors["kpe_cache" if case.spec["separate"] else "kv_cache"]
    slot = next(s for s in case.spec["slots"] if s >= 0)
    outcome, problems = fuzz.judge(_then(case, lambda: _row(cache, slot)[..., -1].add_(1.0)))
    assert outcome == "violation" and any("rope part" in p or p.startswith("kpe_cache") for p in problems), problems


# DeepSeek's fp8_ds_mla entry (kv_cache_dtype="fp8_ds_mla"), drawn in a share of mla_rope_and_cache's cases: drawn,
# not run (mla_drawn above)
def _ds(spec) -> bool:
    return spec["ds_misuse"] == "valid"


def _tiles(spec, kind) -> bool:
    return _ds(spec) and any(kind in row for row in spec["ds"]["tiles"])


# the argument a misuse alone must be refused by (its error's own words, before the call's argument names)
DS_MISUSES = {"pair": "kv_cache", "entry size": "kv_cache", "not whole tiles": "kv_c", "float8 cache": "kv_cache",
              "unaligned": "kv_cache", "misspelt": "kv_cache_dtype"}

MLA_DS = {
    "the fp8_ds_mla entry": _ds,
    **{f"{dtype} inputs": lambda spec, dtype=dtype: _ds(spec) and spec["dtype"] == f"torch.{dtype}"
       for dtype in ("bfloat16", "float16", "float32")},
    **{f"a latent of {latent}": lambda spec, latent=latent: _ds(spec) and spec["latent"] == latent
       for latent in (128, 256, 512)},
    "DeepSeek's rope_dim 64": lambda spec: _ds(spec) and spec["rope_dim"] == 64,
    "an all-zero tile": lambda spec: _tiles(spec, "zero"),
    "a tile past 448": lambda spec: _tiles(spec, "past 448"),
    "a tile below 448 x 2^-126": lambda spec: _tiles(spec, "tiny"),
    "by the page table": lambda spec: _ds(spec) and bool(spec["page_table"]),
    "a short slot mapping": lambda spec: _ds(spec) and not spec["page_table"]
    and len(spec["slot_mapping"]) < spec["tokens"],
    "angles without a table": lambda spec: _ds(spec) and spec["angle_misuse"] == "valid",
    "the engines' cos_sin_cache": lambda spec: _ds(spec) and spec["engines_table"] and not spec["angles"],
    "out of place": lambda spec: _ds(spec) and not spec["inplace"],
    "a kv_cache_scale beside it (unread)": lambda spec: _ds(spec) and spec["scale"] is not None,
    "padded rows": lambda spec: _ds(spec) and spec["engine_cache"]["pad"] > 0,
    "blocks a step apart": lambda spec: _ds(spec) and spec["engine_cache"]["step"] > 1,
    "apart from another tensor in one byte pool": lambda spec: _ds(spec) and spec.get("overlap") == "apart in one pool",
    "on another tensor's bytes (refused)": lambda spec: _ds(spec) and "overlap_kind" in spec,
    **{f"{misuse} (refused)": lambda spec, misuse=misuse: spec["ds_misuse"] == misuse for misuse in DS_MISUSES},
}


@pytest.mark.parametrize("what", MLA_DS)
def test_the_fuzzer_draws_the_fp8_ds_mla_entry(mla_drawn, what):
    assert any(MLA_DS[what](spec) for spec in mla_drawn)


def test_the_fp8_ds_mla_entry_is_a_share_of_mlas_cases(mla_drawn):
    """About 12 %, in the model's 16-bit dtypes or float32, its latent whole tiles unless that is the misuse; every
    other case draws no entry."""
    entries = [spec for spec in mla_drawn if spec["ds_misuse"] is not None]
    assert 0.08 * MLA_DRAWS < len(entries) < 0.16 * MLA_DRAWS
    assert all(spec["dtype"] != "torch.float64" and not spec["separate"] for spec in entries)
    assert all((spec["latent"] % 128 == 0) == (spec["ds_misuse"] != "not whole tiles") for spec in entries)
    assert all(spec["kv_cache_dtype"] == "fp8_ds_mla" for spec in entries if spec["ds_misuse"] != "misspelt")
    assert all(spec["ds"] is None and spec["kv_cache_dtype"] != "fp8_ds_mla" for spec in mla_drawn
               if spec["ds_misuse"] is None)


def _ds_cases(seed: int, want=lambda case: True):
    """The drawn fp8_ds_mla cases of a seed's mla_rope_and_cache cases (misused ones among them) that satisfy
    ``want``."""
    target = {"mla_rope_and_cache": fuzz_cache.TARGETS["mla_rope_and_cache"]}
    for index in range(4000):
        case = fuzz.draw_case(seed, index, DEVICE, target)
        if case.spec["ds_misuse"] is not None and want(case):
            yield case


def test_fp8_ds_mla_entries_valid_and_refused_find_no_violation(monkeypatch):
    """The drawn entry cases, until 16 that must succeed and write (bf16 and fp16 among them, tiles all zeros and
    past 448) and 6 misuses refused for the misuse alone (4 kinds): each valid one writes the reference's bytes,
    each misuse is refused before anything is written, by an error that names the argument."""
    valid, misused, outcomes = collections.Counter(), collections.Counter(), collections.Counter()
    for case in _ds_cases(59):
        spec = case.spec
        outcome, problems = fuzz.judge(case)
        assert outcome != "violation", (problems, spec)
        outcomes[spec["ds_misuse"], outcome] += 1
        if case.expect == fuzz.MATCH and any(s >= 0 for s in spec["slots"]):
            valid[spec["dtype"]] += 1
            valid["zero"] += _tiles(spec, "zero")
            valid["past 448"] += _tiles(spec, "past 448")
        elif spec["ds_misuse"] in DS_MISUSES and ";" not in case.why_raise:  # refused for the misuse alone
            assert outcome == "documented_error"
            for name, value in case.env.items():
                monkeypatch.setenv(name, value)
            with pytest.raises((TypeError, ValueError)) as raised:
                case.call()
            own = str(raised.value).split(" [in mla_rope_and_cache")[0]  # (the suffix names every argument)
            assert re.search(rf"\b{DS_MISUSES[spec['ds_misuse']]}\b", own), own
            misused[spec["ds_misuse"]] += 1
        if valid["torch.bfloat16"] + valid["torch.float16"] + valid["torch.float32"] >= 16 and \
                min(valid["torch.bfloat16"], valid["torch.float16"], valid["zero"], valid["past 448"]) >= 2 and \
                sum(misused.values()) >= 6 and len(misused) >= 4:
            break
    else:
        raise AssertionError(f"too few fp8_ds_mla cases drawn: {outcomes}")


def _ds_case(want=lambda spec: True):
    """An entry case that must match and writes a slot, its positions in the table (k_pe's rotation finite), with
    its first written token and slot."""
    def fits(case):
        spec = case.spec
        n_slots = spec["cache_shape"][0] * spec["cache_shape"][1]
        inside = spec["angles"] or all(0 <= p < spec["rows"] for p in spec["positions"][:spec["tokens"]])
        return case.expect == fuzz.MATCH and _ds(spec) and inside and any(
            0 <= s < n_slots for s in spec["slots"]) and want(spec)

    case = next(_ds_cases(61, fits))
    n_slots = case.spec["cache_shape"][0] * case.spec["cache_shape"][1]
    token, slot = next((t, s) for t, s in enumerate(case.spec["slots"]) if 0 <= s < n_slots)
    return case, token, slot


def test_the_drawn_fp8_ds_mla_case_matches_before_it_is_corrupted():
    assert fuzz.judge(_ds_case()[0])[0] == "matched"


def _two_tiles(spec) -> bool:  # two tiles, the first written token's not both zeros
    return spec["latent"] >= 256 and all(row[:2] != ["zero", "zero"] for row in spec["ds"]["tiles"])


def _free(spec) -> bool:  # a slot no token names
    return len({s for s in spec["slots"] if s >= 0}) < spec["cache_shape"][0] * spec["cache_shape"][1]


@pytest.mark.parametrize("wrong,want,words", [
    ("a doubled tile scale", lambda spec: True, "tile scales"),
    ("a k_pe byte changed", lambda spec: True, "k_pe"),
    ("a tile's values at another tile's scale", _two_tiles, "e4m3 values"),
    ("a byte of a slot no token names", _free, "no token names"),
])
def test_a_wrong_fp8_ds_mla_entry_is_a_violation(wrong, want, words):
    """Corrupted after the call: the first tile's float32 scale doubled, the exponent byte of k_pe's first value, the
    second tile's e4m3 bytes rounded at the first tile's scale, or a byte of an entry no token names."""
    case, token, slot = _ds_case(want)
    spec, cache = case.spec, case.tensors["kv_cache"]
    latent, dtype = spec["latent"], getattr(torch, spec["dtype"].split(".")[1])
    row = _row(cache, slot)
    if wrong == "a doubled tile scale":
        def corrupt():
            row[latent:latent + 4].view(torch.float32).mul_(2)
    elif wrong == "a k_pe byte changed":
        at = latent + 4 * (latent // 128) + dtype.itemsize - 1  # (little-endian: the first value's sign and exponent)

        def corrupt():
            row[at] ^= 0x40
    elif wrong == "a tile's values at another tile's scale":
        kv_c = case.tensors["kv_c"][token].detach().cpu().to(torch.float64)
        scales = ref.token_head_scale(kv_c.view(-1, 128), torch.float8_e4m3fn)
        stored = ref.quantise(kv_c[128:256], scales[0], torch.float8_e4m3fn).to(torch.float8_e4m3fn).view(torch.uint8)
        right = ref.quantise(kv_c[128:256], scales[1], torch.float8_e4m3fn).to(torch.float8_e4m3fn).view(torch.uint8)
        assert not torch.equal(stored, right)

        def corrupt():
            row[128:256].copy_(stored.to(row.device))
    else:
        named = {s for s in spec["slots"] if s >= 0}
        free = _row(cache, next(s for s in range(cache.shape[0] * cache.shape[1]) if s not in named))

        def corrupt():
            free[0] ^= 1
    outcome, problems = fuzz.judge(_then(case, corrupt))
    assert outcome == "violation" and any(p.startswith("kv_cache (fp8_ds_mla)") and words in p for p in problems), \
        problems
