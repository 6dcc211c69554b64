"""The benchmark harness: every RoPE implementation against the device's copy ceiling, in one run.

    python -m ropekit bench                  # main cases (a few minutes on a GPU): JSON + PNGs + benchmarks.md
    python -m ropekit bench --quick          # smoke run
    python -m ropekit bench --groups sweep   # the seed sweep (seq 256..3968 x batch 1/2/4/8)
    python -m ropekit bench --render docs/benchmarks.json   # pages and plots from a published run (any machine)
    python -m ropekit bench --side-by-side H100.json H200.json --out docs   # GPUs side by side in the page
    python -m ropekit.bench.fused --out DIR  # the fused ops (its own command)
    python -m ropekit.bench.eager --out DIR  # eager host cost of every op, back-to-back calls (its own command)

Rooms: ``cases`` (what is measured and how many bytes it must move), ``inputs`` (fresh inputs, the pre-timing check),
``impls`` (one adapter per implementation, peers loaded by ``peers``), ``timing`` (the clocks), ``runner`` (the loop
and the rows), ``floor`` (the launch-chain floor of the small cases), ``report`` (the JSON), ``plots``, ``markdown``
(docs/benchmarks.md), ``cli``; ``angles`` and ``mrope`` (their own commands, ``python -m ropekit.bench.angles``:
table-free angles' accuracy and their speed against the table; ``python -m ropekit.bench.mrope``: M-RoPE's bytes and
speed), whose options, GPU-only timing and JSON come from ``study``; ``fused`` and ``eager`` (their own commands,
above).
On a machine without a GPU nothing is timed: the Triton interpreter is correct but it is not a benchmark.
"""

from .cases import MAIN_CASES, Case, all_cases, select_cases, sweep_cases
from .cli import main, resolve_cases, resolve_impls, run
from .impls import IMPL_NAMES, PEER_NAMES, make_impls
from .markdown import targets, write_markdown, write_side_by_side
from .plots import plot_cases, plot_model, plot_small, plot_sweep, write_plots
from .report import load_document, load_published, merge_documents, validate_document, write_json
from .runner import BenchRefused, derive_metrics, refusal_reason
from .timing import QUICK, Settings

__all__ = [
    "main", "run", "load_published", "write_markdown", "write_side_by_side",
    "Case", "MAIN_CASES", "all_cases", "sweep_cases", "select_cases", "resolve_cases", "resolve_impls",
    "IMPL_NAMES", "PEER_NAMES", "make_impls",
    "Settings", "QUICK", "BenchRefused", "refusal_reason", "derive_metrics", "targets",
    "load_document", "validate_document", "write_json", "merge_documents",
    "plot_cases", "plot_small", "plot_sweep", "plot_model", "write_plots",
]
