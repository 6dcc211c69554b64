"""The hostile-input fuzzer (ropekit.reliability.fuzz) as a CI test: a seeded run on the interpreter must find no
oracle violation, and the fuzzer's own machinery (guards, the oracle, isolation) must be able to fail."""

import json
import os
import subprocess
import sys

import pytest
import torch

from ropekit.reliability import fuzz
from conftest import DEVICE

CI_CASES = 200  # seeded: the same cases every run; the GPU reliability run draws thousands (docs/fuzzing.md)


def test_a_seeded_run_finds_no_violation():
    # A child process, as the CLI runs it: a case that crashes the process is one finding, not the end of the run.
    counts = fuzz.run(CI_CASES, seed=0, device=DEVICE, isolate=True, max_findings=10)
    assert counts["cases"] == CI_CASES
    assert counts["matched"] > CI_CASES // 4 and counts["documented_errors"] > 0  # both sides of the oracle ran
    assert counts["violations"] == 0, json.dumps(counts["findings"], indent=1, default=str)


def test_the_cli_prints_counts_and_replays_one_case():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "ropekit.reliability.fuzz", "--cases", "3", "--seed", "5"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    counts = json.loads(done.stdout)
    assert counts["cases"] == 3 and counts["seed"] == 5
    assert counts["matched"] + counts["documented_errors"] + counts["violations"] == 3
    assert done.returncode == (1 if counts["violations"] else 0)
    replay = subprocess.run(command[:3] + ["--seed", "5", "--case", "1"], capture_output=True, text=True, env=env,
                            timeout=300)
    assert json.loads(replay.stdout)["case"] == 1


def test_cases_are_deterministic():
    rope = {"apply_rope": fuzz.targets()["apply_rope"]}
    a, b = fuzz.draw_case(3, 17, DEVICE, rope), fuzz.draw_case(3, 17, DEVICE, rope)
    assert a.spec == b.spec


# --- the oracle can fail ---------------------------------------------------------------------------------------------

def _case_with(call, check=lambda result: [], **kwargs):
    import random

    arena = fuzz.Arena(random.Random(0), torch.Generator().manual_seed(0), DEVICE)
    x = arena.place("x", (3, 4), torch.float32, "padded")
    return arena, x, fuzz.Case("probe", {}, arena, lambda: call(x), check, **kwargs)


def test_a_write_into_a_guard_is_a_violation():
    arena, x, case = _case_with(lambda x: x.as_strided((1,), (1,), x.storage_offset() + 4 * x.stride(0)).fill_(7))
    outcome, problems = fuzz.judge(case)
    assert outcome == "violation" and "wrote outside its outputs" in problems[0]


def test_a_write_before_an_error_is_a_violation():
    def write_then_raise(x):
        x.fill_(1)
        raise ValueError("q is wrong")

    arena, x, case = _case_with(write_then_raise)
    outcome, problems = fuzz.judge(case)
    assert outcome == "violation" and "raised ValueError but wrote" in problems[0]


def test_an_in_place_write_to_its_target_is_allowed_and_must_bump_the_version():
    arena, x, case = _case_with(lambda x: x.mul_(2))
    arena.allow_writes(x)
    case.inplace_targets = [x]
    assert fuzz.judge(case) == ("matched", [])

    def behind_autograds_back(x):
        x.data.mul_(2)  # .data: the version counter is not bumped

    arena, x, case = _case_with(behind_autograds_back)
    arena.allow_writes(x)
    case.inplace_targets = [x]
    outcome, problems = fuzz.judge(case)
    assert outcome == "violation" and "version counter" in problems[0]


@pytest.mark.parametrize("error, documented", [
    (ValueError("positions must be >= 0"), True),
    (TypeError("cu_seqlens must be an int32 or int64 tensor"), True),
    (ValueError("something is wrong"), False),  # names no argument
    (IndexError("index 64 is out of bounds"), False),
    (RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a single "
                  "memory location"), False),  # only documented for overlapping in-place arguments
    (NotImplementedError("thd on the CUDA backend"), True),
])
def test_only_documented_errors_pass(error, documented):
    def raise_it(x):
        raise error

    arena, x, case = _case_with(raise_it, expect=fuzz.EITHER)
    assert (fuzz.judge(case)[0] == "documented_error") is documented


def test_refusing_a_valid_call_and_accepting_an_invalid_one_are_violations():
    def refuse(x):
        raise ValueError("q is fine, but no")

    assert fuzz.judge(_case_with(refuse, expect=fuzz.MATCH)[2])[0] == "violation"
    assert fuzz.judge(_case_with(lambda x: None, expect=fuzz.RAISE, why_raise="test")[2])[0] == "violation"


def test_a_wrong_value_is_a_violation():
    case = _case_with(lambda x: None, check=lambda result: ["q: 3x off"])[2]
    assert fuzz.judge(case) == ("violation", ["q: 3x off"])
