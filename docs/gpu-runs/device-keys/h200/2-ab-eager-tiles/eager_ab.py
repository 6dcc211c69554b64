"""Eager host cost, A/B of this tree against the exported base (.ab/ropekit_base): each op's call prepared and
checked by each package's own eager benchmark, warmed up, then 1000 back-to-back calls with one sync; in each of
--repeats runs every op's base and new calls run next to each other (alternating which goes first), so a host whose
speed drifts moves a pair alike. Rows: base, new (medians), new/base, the median of the runs' paired ratios, and the
ratio of the fastest runs."""
import argparse, gc, json, statistics, sys
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / ".ab"))
import ropekit_base.bench.eager as EB
import ropekit.bench.eager as E
from ropekit.bench.timing import back_to_back_us

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--repeats", type=int, default=9)
p.add_argument("--calls", type=int, default=1000)
p.add_argument("--peers", default=None)
p.add_argument("--cpu", action="store_true")
a = p.parse_args()
device = "cpu" if a.cpu else "cuda"
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
names = ["apply_rope", "apply_rope (in place)", "rope_and_cache", "rope_and_cache + QK-norm",
         "rope_and_cache, float8 cache", "qk_norm_rope", "mla_rope_and_cache", "Liger rope",
         "apply_rope + index_copy_ x2", "apply_rope + index_copy_ (latent cache)"]
print((torch.cuda.get_device_name() if device == 'cuda' else 'cpu'), flush=True)
doc = dict(gpu=(torch.cuda.get_device_name() if device == 'cuda' else 'cpu'), argv=sys.argv, rows=[])
pairs = zip(E.CASES, EB.CASES) if not a.cpu else zip(map(E.tiny, E.CASES), map(EB.tiny, EB.CASES))
for case_new, case_base in pairs:
    timed = {}
    with torch.no_grad():
        for label, module, case in (("base", EB, case_base), ("new", E, case_new)):
            for op in module.OPS:
                if op.name not in names or (label == "base" and op.name in ("Liger rope", "apply_rope + index_copy_ x2", "apply_rope + index_copy_ (latent cache)")):
                    continue
                try:
                    prepared = op.make(a.peers)(case, device)
                except Exception as error:  # noqa: BLE001
                    print(case.name, label, op.name, "skipped:", type(error).__name__, str(error)[:100], flush=True)
                    continue
                if prepared.message:
                    print(case.name, label, op.name, 'WRONG:', prepared.message[:120], flush=True)
                    continue
                timed[(op.name, label)] = [prepared.fn, []]
        for fn, _ in timed.values():
            for _ in range(50 if device == 'cuda' else 2):
                fn()
        sync()
        gc.collect(); gc.disable()
        ops_here = sorted({name for name, _ in timed})
        for r in range(a.repeats):
            for name in ops_here:
                order = ("base", "new") if r % 2 == 0 else ("new", "base")
                for label in order:
                    if (name, label) in timed:
                        fn, runs = timed[(name, label)]
                        runs.append(back_to_back_us(fn, a.calls, sync))
        gc.enable()
    for name in names:
        got = {label: statistics.median(timed[(name, label)][1]) for label in ("base", "new") if (name, label) in timed}
        ranges = {label: (min(timed[(name, label)][1]), max(timed[(name, label)][1])) for label in got}
        line = f"{case_new.name:14s} {name:30s} " + "  ".join(f"{k} {v:7.2f} ({ranges[k][0]:.1f}-{ranges[k][1]:.1f})" for k, v in got.items())
        if len(got) == 2:
            paired = [n / b for n, b in zip(timed[(name, "new")][1], timed[(name, "base")][1])]
            line += f"  new/base {got['new'] / got['base']:.4f}  paired median {statistics.median(paired):.4f}" \
                    f"  fastest {min(timed[(name, 'new')][1]) / min(timed[(name, 'base')][1]):.4f}"
        print(line, flush=True)
        doc["rows"].append(dict(case=case_new.name, op=name, **{f"{k}_us": v for k, v in got.items()},
                                runs={k: timed[(name, k)][1] for k in got}))
Path(a.out).write_text(json.dumps(doc, indent=1))
