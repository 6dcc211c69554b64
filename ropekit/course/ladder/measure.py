"""The ladder's waterfall: v3, every step and the production kernel, timed in one run against one copy ceiling (GPU
only; the interpreter is never timed)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ... import api
from ...frequencies import cos_sin_table
from ...triton import v3
from .. import measure
from . import FEATURE_STEPS, SPEED_STEPS, STEPS, step
from .launch import FlatBlock, LadderConfig, bytes_moved, rope_ladder

__all__ = ["LLAMA3_8B_PREFILL", "PRODUCTION", "DATA_FILE", "measure_steps", "step_configs", "load_stored",
           "read_waterfall"]

# Llama-3-8B prefill (the benchmark's main case): batch 4, 4096 tokens, 32 q heads and 8 k heads of 128, bf16.
LLAMA3_8B_PREFILL = (4, 4096, 32, 8, 128, torch.bfloat16)
PRODUCTION = "ropekit.apply_rope"  # the last row: the library's own launch choice
# The waterfall of the course's stored GPU run, which notebook 05 shows on a machine without a GPU.
DATA_FILE = Path(__file__).resolve().parents[3] / "notebooks" / "data" / "ladder_waterfall.json"


def step_configs(shape, facts) -> dict:
    """The launches of the speed steps on ``shape`` from the library's model for a GPU's ``facts``
    (``ropekit.triton.model.model_rope``): step 7 the fused q+k tile it picks where neither the flat path nor its
    small streaming tile may run (a packed batch), step 8 the flat block it picks. Steps 1-6 take v3's tile (the
    launcher's default)."""
    from ...triton.configs import FlatConfig, RopeShape, TileConfig
    from ...triton.model import model_rope

    batch, seq, heads_q, heads_k, head_dim, dtype = shape
    call = RopeShape(batch * seq, heads_q, heads_k, head_dim, head_dim, torch.empty((), dtype=dtype).element_size(),
                     cos_per_token=False, flat_ok=True, same_shape=heads_q == heads_k)
    configs = {}
    tile = model_rope(facts, call._replace(flat_ok=False, varlen=True))
    if isinstance(tile, TileConfig) and tile.fused_qk:
        configs["step7_fused_qk"] = LadderConfig(tile.block_s, tile.block_h, tile.num_warps)
    flat = model_rope(facts, call)
    if isinstance(flat, FlatConfig) and not flat.paired:
        configs["step8_flat"] = FlatBlock(flat.block, flat.num_warps)
    return configs


def measure_steps(shape=LLAMA3_8B_PREFILL, *, timer=None, device="cuda", facts=None) -> list[dict]:
    """One row a kernel: v3 (q, then k: two launches), every ladder step, then the production kernel through
    ``ropekit.apply_rope`` (its own launch choice, model and autotune). Each row: its median time, GB/s of q and k
    moved and share of the copy ceiling.

    One run, one ceiling: every kernel is compiled (and the production kernel's autotune done) first, then each is
    captured in a CUDA graph and the graphs' replays are interleaved in rounds (``timer.replay_rounds``), so a drift
    of the GPU's clocks over the run reaches every row alike. Inputs are fresh random tensors far larger than the L2
    cache; positions are 0..seq-1 and nothing else is switched on, so the rows differ only in the code they run.
    ``facts``: the GPU's facts for the speed steps' launches (default ``ropekit.triton.choice.device_facts()`` on
    CUDA; without facts they take the launcher's defaults). ``timer``: as ``ropekit.course.measure.time_launch``.
    """
    batch, seq, heads_q, heads_k, head_dim, dtype = shape
    q = torch.randn(batch, seq, heads_q, head_dim, device=device).to(dtype)
    k = torch.randn(batch, seq, heads_k, head_dim, device=device).to(dtype)
    cos, sin = cos_sin_table(max(seq, 64), head_dim, device=device)
    out_q, out_k = torch.empty_like(q), torch.empty_like(k)
    if facts is None and torch.device(device).type == "cuda":
        from ...triton.choice import device_facts

        facts = device_facts(device)
    configs = step_configs(shape, facts) if facts is not None else {}

    def run_v3():
        v3.rope_v3(q, cos, sin, out_q)
        v3.rope_v3(k, cos, sin, out_k)

    runs = [("v3", "two launches, v3's tile", run_v3)]
    for name in STEPS:
        config = configs.get(name)

        def run(kernel=step(name).KERNEL, config=config):
            rope_ladder(kernel, q, k, cos, sin, out_q=out_q, out_k=out_k, config=config)

        runs.append((name, repr(config) if config else "the launcher's default", run))
    runs.append((PRODUCTION, "its own choice", lambda: api.apply_rope(q, k, cos, sin, backend="triton")))

    timer = timer or measure._default_timer()
    ceiling = measure.copy_ceiling(timer)["gbps"]
    moved = bytes_moved(q, k)
    for _, _, run in runs:
        run()  # compile, and the production kernel's autotune, outside the timing and outside any capture
    graphs = [timer.capture([run], moved / (ceiling * 1e9) * 1e6) for _, _, run in runs]
    rows = []
    for (name, launch, _), (time_us, spread, _calls) in zip(runs, timer.replay_rounds(graphs)):
        gbps = moved / (time_us * 1e-6) / 1e9
        rows.append({"step": name, "launch": launch, "time_us": time_us, "spread": spread, "gbps": gbps,
                     "share": gbps / ceiling, "ceiling_gbps": ceiling})
    return rows


def load_stored(path=None) -> dict | None:
    """The stored waterfall (``{"gpu": name, "rows": [...]}``, the rows as :func:`measure_steps` returns them), or
    None when there is none."""
    path = Path(path) if path else DATA_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def read_waterfall(rows: list[dict]) -> list[str]:
    """What a waterfall measured, step against step, in points of the copy ceiling (one run, one ceiling):
    step 1 against v3, the spread of the feature steps around step 1, each speed step against step 1, and the
    production kernel against the faster speed step."""
    share = {r["step"]: 100 * r["share"] for r in rows}
    features = [share[name] - share["step1_qk"] for name in FEATURE_STEPS[1:]]
    best = max(SPEED_STEPS, key=share.get)
    one_launch = share["step1_qk"] - share["v3"]
    lines = [f"step 1 against v3 (one launch for q and k instead of two): {one_launch:+.1f} points",
             f"steps 2-6 against step 1 (switches off): {min(features):+.1f} to {max(features):+.1f} points"]
    lines += [f"{name} against step 1: {share[name] - share['step1_qk']:+.1f} points" for name in SPEED_STEPS]
    lines.append(f"{PRODUCTION} against {best} (the faster speed step): {share[PRODUCTION] - share[best]:+.1f} points"
                 f" ({share[PRODUCTION]:.1f} % of the copy ceiling)")
    return lines


def main(argv=None) -> None:
    """``python -m ropekit.course.ladder.measure [--out FILE]``: the waterfall on this GPU, as a table (and JSON)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="write the rows and the GPU's name to this JSON file")
    args = parser.parse_args(argv)
    rows = measure_steps()
    for row in rows:
        print(f"{row['step']:20s} {row['time_us']:8.2f} µs {row['gbps']:7.0f} GB/s {100 * row['share']:6.1f} % of "
              f"copy (± {100 * row['spread']:.1f} %)  {row['launch']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "shape": repr(LLAMA3_8B_PREFILL), "rows": rows}, f,
                      indent=1)
    print("\n".join(read_waterfall(rows)))


if __name__ == "__main__":
    main()
