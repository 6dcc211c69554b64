"""ropekit.reliability.run: the outcome tally, the time budget, and jobs in worker processes."""

import pytest

from ropekit.reliability.configs import CPU_SCALE
from ropekit.reliability.generate import generate_configs
from ropekit.reliability.properties import property_job
from ropekit.reliability.run import MAX_FAILURES_KEPT, Tally, run_jobs
from conftest import ON_GPU

CONFIGS, _ = generate_configs(3, seed=7, scale=CPU_SCALE, n_families=3)


def test_a_spent_time_budget_leaves_jobs_not_run():
    jobs = [(property_job, c, ("triton",), {}) for c in CONFIGS]
    tally = Tally()
    for outcome in run_jobs(jobs, [0, 1, 2], workers=1, budget_s=0):
        tally.add_outcomes("job", outcome)
    assert tally.as_dict()["not_run"] == 3 and tally.checked == 0


def test_the_tally_counts_passes_failures_unsupported_and_crashes():
    tally = Tally()
    tally.add_outcomes("a", {"triton": [], "cuda": "unsupported: thd"})
    tally.add_outcomes("b", {"triton": ["q: off by one ulp"]})
    tally.record("c", "triton", lambda: 1 / 0)
    for i in range(MAX_FAILURES_KEPT + 5):
        tally.add(f"d{i}", "triton", ["wrong"])
    result = tally.as_dict()
    assert result["checked"] == 3 + MAX_FAILURES_KEPT + 5 and result["passed"] == 1
    assert result["unsupported"] == {"cuda: thd": 1} and len(result["failures"]) == MAX_FAILURES_KEPT
    assert result["failures"][1]["messages"][0].startswith("raised ZeroDivisionError")


@pytest.mark.skipif(ON_GPU, reason="on the GPU, `python -m ropekit stress` runs its sections in worker processes")
def test_jobs_in_worker_processes_match_in_process():
    jobs = [(property_job, c, ("triton",), {}) for c in CONFIGS[:2]]
    assert run_jobs(jobs, [0, 1], workers=2) == run_jobs(jobs, [0, 0], workers=1)
