"""The benchmark's JSON document: what it holds, how it is written, checked, merged and read back.

One document per run: the environment (GPU, versions, date), the settings, the copy ceiling measured at the start
(and again at the end, to show drift), the case table, every implementation with its availability, the rows
(``runner.ROW_FIELDS``), the large cases' copy floors and the small cases' launch-chain floors.
``docs/benchmarks.json`` is the published one (``load_published``).
"""

from __future__ import annotations

import datetime
import json
import math
import platform
from pathlib import Path

from .runner import LATER_ROW_FIELDS, RESIDENCIES, ROW_FIELDS, STATUSES

__all__ = ["SCHEMA", "environment", "make_document", "validate_document", "write_json", "load_document",
           "published_json_path", "load_published", "merge_documents"]

SCHEMA = "ropekit-bench/1"
TOP_FIELDS = ("schema", "created", "command", "complete", "aborted", "environment", "settings", "copy_ceiling",
              "copy_ceiling_end", "l2_bytes", "cases", "impls", "rows")
CEILING_FIELDS = ("gbps", "time_us", "bytes_read", "bytes_written", "method")


def environment() -> dict:
    """Where the numbers come from: versions, and the GPU when there is one."""
    import torch
    import triton

    from .. import __version__

    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "ropekit": __version__, "platform": platform.platform()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(gpu=torch.cuda.get_device_name(), capability=f"{props.major}.{props.minor}",
                   sm_count=props.multi_processor_count, memory_bytes=props.total_memory, cuda=torch.version.cuda)
    return env


def make_document(*, command: str, settings: dict, environment: dict, copy_ceiling: dict | None, l2_bytes,
                  cases: list, impls: list[dict], rows: list[dict], complete: bool, aborted: str | None = None,
                  copy_ceiling_end: dict | None = None, created: str | None = None,
                  duration_s: float | None = None, copy_floors: dict | None = None,
                  launch_floors: dict | None = None) -> dict:
    created = created or datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    return {
        "schema": SCHEMA, "created": created, "command": command, "complete": complete, "aborted": aborted,
        "environment": environment, "settings": settings, "copy_ceiling": copy_ceiling,
        "copy_ceiling_end": copy_ceiling_end, "l2_bytes": l2_bytes, "duration_s": duration_s,
        "copy_floors": copy_floors or {}, "launch_floors": launch_floors or {},
        "cases": [c if isinstance(c, dict) else c.to_json() for c in cases], "impls": impls, "rows": rows,
    }


def validate_document(doc: dict) -> None:
    """Raise ValueError naming the first problem: missing fields, unknown statuses, numbers that do not add up."""
    if not isinstance(doc, dict):
        raise ValueError("a benchmark document is a JSON object")
    missing = [f for f in TOP_FIELDS if f not in doc]
    if missing:
        raise ValueError(f"benchmark document lacks {missing}")
    if doc["schema"] != SCHEMA:
        raise ValueError(f"schema is {doc['schema']!r}, expected {SCHEMA!r}")
    ceiling = doc["copy_ceiling"]
    if ceiling is not None:
        lacking = [f for f in CEILING_FIELDS if f not in ceiling]
        if lacking:
            raise ValueError(f"copy_ceiling lacks {lacking}")
    case_names = {c["name"] for c in doc["cases"]}
    impl_names = {i["name"] for i in doc["impls"]}
    for index, row in enumerate(doc["rows"]):
        where = f"row {index} ({row.get('case')}/{row.get('impl')}/{row.get('direction')})"
        lacking = [f for f in ROW_FIELDS if f not in row and f not in LATER_ROW_FIELDS]
        if lacking:
            raise ValueError(f"{where} lacks {lacking}")
        if row["status"] not in STATUSES:
            raise ValueError(f"{where}: status {row['status']!r} not in {STATUSES}")
        if row["case"] not in case_names or row["impl"] not in impl_names:
            raise ValueError(f"{where}: unknown case or implementation")
        if row["status"] != "ok":
            if not row["reason"]:
                raise ValueError(f"{where}: a row that is not ok must say why")
            continue
        if row["residency"] not in RESIDENCIES:
            raise ValueError(f"{where}: residency {row['residency']!r} not in {RESIDENCIES}")
        if row["time_us"] is None or not row["time_us"] > 0 or not math.isfinite(row["time_us"]):
            raise ValueError(f"{where}: an ok row needs a positive time_us")
        if row["time_us"] != row[f"{row['time_source']}_us"]:
            raise ValueError(f"{where}: time_us is not its {row['time_source']} time")
        expected_gbps = row["bytes"] / (row["time_us"] * 1e-6) / 1e9
        if not math.isclose(row["gbps"], expected_gbps, rel_tol=1e-9):
            raise ValueError(f"{where}: gbps {row['gbps']} != bytes / time_us = {expected_gbps}")


def write_json(doc: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)  # a run killed mid-write leaves the previous file, never half a file
    return path


def load_document(path) -> dict:
    doc = json.loads(Path(path).read_text())
    validate_document(doc)
    return doc


def published_json_path() -> Path:
    return Path(__file__).resolve().parents[2] / "docs" / "benchmarks.json"


def load_published() -> dict | None:
    """The committed ``docs/benchmarks.json`` (the H100 run the docs and notebook 07 show), or None if absent."""
    path = published_json_path()
    return load_document(path) if path.is_file() else None


def merge_documents(docs: list[dict]) -> dict:
    """One document from several runs (e.g. the main cases and the sweep in two device calls).

    Later documents win for the same (case, impl, direction); each row keeps the ceiling it was computed against
    (``ceiling_gbps``); ``runs`` lists every source run.
    """
    if not docs:
        raise ValueError("nothing to merge")
    for doc in docs:
        validate_document(doc)
    merged = json.loads(json.dumps(docs[-1]))  # the latest run heads the document
    rows: dict[tuple, list[dict]] = {}
    cases: dict[str, dict] = {}
    impls: dict[str, dict] = {}
    for doc in docs:
        for case in doc["cases"]:
            cases[case["name"]] = case
        for impl in doc["impls"]:
            impls[impl["name"]] = impl
        fresh: dict[tuple, list[dict]] = {}
        for row in doc["rows"]:
            fresh.setdefault((row["case"], row["impl"], row["direction"]), []).append(row)
        rows.update(fresh)
    merged["cases"] = list(cases.values())
    merged["impls"] = list(impls.values())
    merged["rows"] = [row for group in rows.values() for row in group]
    merged["copy_floors"] = {name: floor for doc in docs for name, floor in doc.get("copy_floors", {}).items()}
    merged["launch_floors"] = {name: floor for doc in docs for name, floor in doc.get("launch_floors", {}).items()}
    merged["complete"] = all(doc["complete"] for doc in docs)
    merged["aborted"] = "; ".join(doc["aborted"] for doc in docs if doc["aborted"]) or None
    # every source run once: a document that is itself a merge contributes the runs it lists
    runs = {}
    for d in docs:
        for run in d.get("runs") or [{"created": d["created"], "command": d["command"],
                                      "copy_ceiling": d["copy_ceiling"], "gpu": d["environment"].get("gpu")}]:
            runs[(run["created"], run["command"])] = run
    merged["runs"] = sorted(runs.values(), key=lambda run: run["created"])
    validate_document(merged)
    return merged
