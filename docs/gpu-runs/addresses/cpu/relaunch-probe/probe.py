import os, sys
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch, ropekit
from ropekit import device as D
from ropekit.triton import launch as L
from ropekit.fused import plan as P
torch.set_grad_enabled(False)

pending = []
stats = {"checked": 0, "bad": 0, "runs": 0}
def flat(x):
    if isinstance(x, tuple):
        out = []
        for y in x: out += flat(y)
        return out
    if isinstance(x, torch.Tensor): return [("T", x.dtype, tuple(x.shape))]
    return [x]
def fake_run(gx, gy, gz, stream, fn, md, lm, eh, xh, *args):
    stats["runs"] += 1
    if pending:
        want = pending.pop()
        stats["checked"] += 1
        if flat(want) != flat(args):
            stats["bad"] += 1
            a, b = flat(want), flat(args)
            print("   MISMATCH", [(j, x, y) for j, (x, y) in enumerate(zip(a, b)) if x != y][:8])
FAKE = [lambda *a, **k: None, False, (fake_run, None, None)]
class AnyEntry(dict):
    def get(self, key, default=None):
        return FAKE

def checking(self, at):
    r = self.calls.get(at)
    if r is None:
        return False
    cells = dict(zip(r.__code__.co_freevars, (c.cell_contents for c in r.__closure__)))
    pending.append(cells["prepared"][3])
    self.launch.prepared.clear()
    return False
P.FusedPlan.relaunch = checking

def go(name, fn, states, reps=4):
    for k in stats: stats[k] = 0
    fn(states[0])  # plan + interpreter run
    D.INTERPRET = False
    saved = L._runners, L._current_stream
    L._runners = AnyEntry(); L._current_stream = lambda: 0
    try:
        for i, st in enumerate(list(states) * reps):
            fn(st)
    finally:
        D.INTERPRET = True
        L._runners, L._current_stream = saved
        L.plans.clear()
    print(f"{name}: runs {stats['runs']} relaunches checked {stats['checked']} mismatches {stats['bad']} pending {len(pending)}")
    pending.clear()
