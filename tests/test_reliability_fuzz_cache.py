"""ropekit.reliability.fuzz_cache: the cache-writing ops under hostile inputs find no violation, and the targets'
checks fail when a written slot is wrong, when a slot no token names changes, or when v's bits change."""

import json

import pytest
import torch

from ropekit.reliability import fuzz, fuzz_cache
from conftest import DEVICE

NAMES = ("rope_and_cache", "mla_rope_and_cache")
CACHE = {"rope_and_cache": "k_cache", "mla_rope_and_cache": "kv_cache"}


@pytest.mark.parametrize("name", NAMES)
def test_a_seeded_run_of_the_cache_ops_finds_no_violation(name):
    counts = fuzz.run(60, seed=11, device=DEVICE, targets=[name], max_findings=5)
    assert counts["cases"] == 60 and counts["matched"] > 15 and counts["documented_errors"] > 0
    assert counts["violations"] == 0, json.dumps(counts["findings"], indent=1, default=str)


def _case(name: str, want=lambda spec: True):
    """The first case of a seed that must succeed, writes at least one slot of a cache in the activations' dtype,
    and satisfies ``want(spec)``; with the cache it writes (:func:`_row` picks a slot's row of it, in place)."""
    for index in range(400):
        case = fuzz.draw_case(23, index, DEVICE, {name: fuzz_cache.TARGETS[name]})
        spec = case.spec
        if (case.expect == fuzz.MATCH and any(s >= 0 for s in spec["slots"]) and "float8" not in spec["cache_dtype"]
                and want(spec)):
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
                        < spec["num_blocks"] * spec["block_size"])
    named = {s for s in case.spec["slots"] if s >= 0}
    free = next(s for s in range(cache.shape[0] * cache.shape[1]) if s not in named)
    outcome, problems = fuzz.judge(_then(case, lambda: _row(cache, free).neg_()))
    assert outcome == "violation" and any("no token names" in p for p in problems), problems


def test_v_must_reach_its_cache_bit_for_bit():
    case, _ = _case("rope_and_cache")
    row = _row(case.tensors["v_cache"], next(s for s in case.spec["slots"] if s >= 0))
    outcome, problems = fuzz.judge(_then(case, lambda: row.copy_(torch.nextafter(row, torch.full_like(row, 1e9)))))
    assert outcome == "violation" and any("v_cache" in p for p in problems), problems
