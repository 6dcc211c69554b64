"""Run every launch configuration the tune tool can reach once, on each benchmark case's real shape, so that
compute-sanitizer (memcheck, ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``) sees each one alone. Each output is also compared
with the launch table's, bit for bit.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python tools/sanitize_configs.py
    python tools/sanitize_configs.py --cases decode --configs "table; block_s=2"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tune_v4  # noqa: E402  (puts the checkout first on sys.path)

import ropekit  # noqa: E402
from ropekit.bench.cli import resolve_cases  # noqa: E402
from ropekit.bench.inputs import make_data, make_tables, seed_for  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=tune_v4.DEFAULT_CASES)
    parser.add_argument("--configs", default=None)
    args = parser.parse_args(argv)
    device = ropekit.device.DEVICE
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    failures = 0
    for case in resolve_cases(args.cases.split(",")):
        tables = make_tables(case, device)
        data = make_data(case, device, seed_for(case.name, "0"))
        expected = [t.clone() for t in tune_v4.launches(case, None, tables, [data])[0]()]
        sync()
        for label, config in tune_v4.parse_configs(args.configs, case):
            try:
                got = tune_v4.launches(case, config, tables, [data])[0]()
                sync()
                same = all(torch.equal(a, b) for a, b in zip(got, expected))
                verdict = "same as table" if same else "DIFFERS from table"
            except Exception as error:  # noqa: BLE001
                verdict = f"refused: {type(error).__name__}: {str(error)[:160]}"
            failures += verdict.startswith("DIFFERS")
            print(f"{case.name:20s} {label:40s} {verdict}", flush=True)
    print(f"configs differing from the table: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
