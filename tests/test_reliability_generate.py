"""ropekit.reliability.generate: the variant quota bounds the compiles while most configurations stay fresh
draws."""

from ropekit.reliability.configs import GPU_SCALE
from ropekit.reliability.generate import generate_configs, kernel_variants


def test_variant_quota_bounds_the_compiles():
    # A dry run (nothing executes) with this process's launch choice and device (a CPU tensor on a GPU machine is
    # refused by the Triton backend): each family stays within its quota of Triton kernel variants (compiles), while
    # most configurations are still fresh draws.
    configs, stats = generate_configs(60, seed=3, scale=GPU_SCALE, n_families=6, variant_quota=4)
    per_family = {}
    for cfg in configs:
        per_family.setdefault(cfg.family, set()).update(kernel_variants(cfg))
    assert all(len(keys) <= 4 for keys in per_family.values())
    assert stats["kernel_variants"] == len(set().union(*per_family.values())) <= 6 * 4
    assert stats["draws"]["fresh"] > 30 and len({(c.batch, c.seqlen, c.lengths) for c in configs}) > 30
    unbounded, _ = generate_configs(60, seed=3, scale=GPU_SCALE, n_families=6)
    free = set().union(*(kernel_variants(c) for c in unbounded))
    assert len(free) > stats["kernel_variants"]
