"""decode-b64-e5m2 (and its prefill): each version's chosen fused tile and registers, then every version timed under
each chosen tile (a graph of 20 calls, replayed, median of 15)."""
import importlib, sys, statistics, torch
sys.path.insert(0, ".ab")
from ropekit.bench import fused as bench
from ropekit.bench.fused_cases import CASES
labels = {"base": "ropekit_base", "new": "ropekit", "p1": "ropekit_p1", "sel": "ropekit_sel"}
mods = {k: importlib.import_module(v) for k, v in labels.items()}
for name in sys.argv[1:]:
    case = next(c for c in CASES if c.name == name)
    chosen, calls = {}, {}
    for label, mod in mods.items():
        choice = importlib.import_module(mod.__name__ + ".triton.choice")
        real = choice.choose_fused
        def spy(shape, device=None, bench=None, registers=None, real=real, label=label):
            config = real(shape, device, bench, registers)
            chosen.setdefault(label, []).append((config, registers(config) if registers else None))
            return config
        choice.choose_fused = spy
        build = importlib.import_module(mod.__name__ + ".bench.fused").impls()["ropekit-fused"]
        result, data, fn = bench.checked_call(case, build, "cuda", 1)
        calls[label] = (fn, data, mod)
        print(name, label, "check", {k: v for k, v in result.items() if k in ("status", "max_error", "ok")}, "chosen", chosen.get(label, [])[:2], flush=True)
    configs = {label: cs[0][0] for label, cs in chosen.items() if cs}
    for cfg_label, config in configs.items():
        for label, (fn, data, mod) in calls.items():
            forced = importlib.import_module(mod.__name__ + ".triton.fused").forced_fused_config
            FC = type(config)
            cfg = importlib.import_module(mod.__name__ + ".triton.configs").FusedConfig(*config)
            with forced(cfg):
                fn(); torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    fn()
                torch.cuda.current_stream().wait_stream(s)
                with torch.cuda.graph(g):
                    for _ in range(20):
                        fn()
            times = []
            for _ in range(15):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); g.replay(); b.record(); b.synchronize()
                times.append(a.elapsed_time(b) * 1000 / 20)
            print(f"{name} tile-of-{cfg_label} {tuple(config)[:3]} {label}: {statistics.median(times):.3f} us", flush=True)
