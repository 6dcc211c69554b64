"""ropekit.reliability.configs: the configuration space covers every dimension and describes each configuration
well enough to rebuild it."""

import random

from ropekit.reliability.configs import CPU_SCALE, HEAD_DIMS, coverage, draw_config, draw_family
from ropekit.reliability.generate import generate_configs


def test_generator_covers_every_dimension():
    configs, _ = generate_configs(120, seed=7, scale=CPU_SCALE, n_families=40)
    counts = coverage(configs)
    assert set(counts["layout"]) == {"bshd", "sbhd", "bhsd", "thd"}
    assert set(counts["view"]) == {"contiguous", "transposed", "sliced", "expanded", "misaligned", "packed"}
    assert set(counts["dtype"]) == {"fp32", "bf16", "fp16", "fp64"}
    assert set(counts["mode"]) == {"in-place", "out-of-place"}
    assert {"sum", "full"} <= set(counts["backward"])
    assert set(counts["seqlen"]) == {"0", "1", ">1"}
    assert len(counts["positions"]) >= 8 and len(counts["k heads"]) == 5


def test_draws_are_seeded_bounded_and_described():
    def draw(seed):
        rng = random.Random(seed)
        return [draw_config(rng, draw_family(rng), CPU_SCALE) for _ in range(30)]

    first, again = draw(11), draw(11)
    assert first == again and first != draw(12)
    for cfg in first:
        f = cfg.family
        assert (f.head_dim, f.rotary_dim) in HEAD_DIMS
        assert cfg.tokens * max(cfg.heads_q, cfg.heads_k) * f.head_dim <= CPU_SCALE.max_numel or cfg.tokens == 1
        assert f"seed={cfg.seed}" in cfg.describe() and cfg.short_id().startswith(f.layout)
        assert not (f.inplace and f.view == "expanded")  # an expanded view aliases itself
