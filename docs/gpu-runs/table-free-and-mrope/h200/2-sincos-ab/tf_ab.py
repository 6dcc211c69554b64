"""Table-free angles: this tree's sin/cos (one polynomial each after the quadrant) against the base's (libdevice's
float64 sin and cos), apply_rope on the angles benchmark's cases, graph replay, the versions in interleaved rounds;
the table beside them. argv: out.json"""
import importlib, json, sys
import torch
sys.path.insert(0, ".ab")
import ropekit
base = importlib.import_module("ropekit_base")
from ropekit.bench import angles
from ropekit.bench.timing import GpuTimer, Settings
from ropekit.frequencies import inverse_frequencies

timer = GpuTimer(Settings())
inv_freq = inverse_frequencies(128, 500_000.0).to("cuda")
rows = []
for case in [c for c in angles.CASES if c["op"] == "apply_rope"]:
    b, s = case["batch"], case["seqlen"]
    q = torch.randn(b, s, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, 8, 128, device="cuda", dtype=torch.bfloat16)
    positions = (torch.randint(case["offsets_from"], case["offsets_below"], (b,), device="cuda")
                 if case["offsets_below"] is not None else None)
    rows_needed = (case["offsets_below"] or 0) + s
    cos, sin = ropekit.cos_sin_table(rows_needed, 128, inv_freq=inv_freq, device="cuda")
    calls = {"table": lambda: ropekit.apply_rope(q, k, cos, sin, positions=positions),
             "base table-free": lambda: base.apply_rope(q, k, inv_freq=inv_freq, positions=positions),
             "new table-free": lambda: ropekit.apply_rope(q, k, inv_freq=inv_freq, positions=positions)}
    outs = {n: f() for n, f in calls.items()}
    same = all(torch.equal(outs["base table-free"][i], outs["new table-free"][i]) for i in range(2))
    diff = max(float((outs["new table-free"][i].float() - outs["table"][i].float()).abs().max()) for i in range(2))
    est = 2 * (q.numel() + k.numel()) * 2 / 3e6
    names = [n for n in calls for _ in range(2)]
    graphs = [timer.capture([calls[n]], est) for n in names]
    times = timer.replay_rounds(graphs)
    row = {"case": case["name"], "new_equals_base_bitwise": same, "new_vs_table_max_abs": diff}
    for n, (med, spread, calls_n) in zip(names, times):
        row.setdefault(n, []).append(med)
    row["new/base"] = sum(row["new table-free"]) / sum(row["base table-free"])
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
