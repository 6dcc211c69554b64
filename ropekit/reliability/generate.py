"""Configurations for the property section, with the number of compiles bounded: each family may use only a few
Triton kernel variants, counted exactly by a dry run of the configuration's calls (nothing executes)."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter, defaultdict
from typing import Optional

from ropekit import device as _device
from ropekit.api import apply_rope

from .build import build_case
from .configs import GPU_SCALE, Config, Scale, draw_config, draw_family
from .kernels import record_launches

__all__ = ["kernel_variants", "run_config_dry", "generate_configs"]


def kernel_variants(cfg: Config, device=None) -> frozenset:
    """The Triton kernel variants (specialisation keys) that running ``cfg`` forward (and backward) compiles."""
    with record_launches() as recorder:
        run_config_dry(cfg, device or _device.DEVICE)
    return frozenset(recorder.keys)


def run_config_dry(cfg: Config, device) -> None:
    """The launches of :func:`ropekit.reliability.properties.run_config` on the Triton backend, without any checking."""
    case = build_case(cfg, device, values=False)
    operands = [case.q] + ([case.k] if case.k is not None else [])
    if cfg.family.backward:
        for op in operands:
            op.storage.requires_grad_()
    q = case.q.tensor()
    k = case.k.tensor() if case.k is not None else None
    out_q, out_k = apply_rope(q, k, case.cos, case.sin, backend="triton", **case.kwargs)
    if cfg.family.backward:
        (out_q.sum() + (out_k.sum() if out_k is not None else 0)).backward()


def generate_configs(count: int, *, seed: int = 0, scale: Scale = GPU_SCALE, n_families: int = 48,
                     variant_quota: Optional[int] = None, device=None,
                     jitter_tries: int = 3) -> tuple[list[Config], dict]:
    """``count`` configurations drawn round-robin from ``n_families`` random families.

    With ``variant_quota``, a family uses at most that many distinct Triton kernel variants (forward and backward
    together; each is a compile on the GPU), counted exactly by a dry run. A fresh draw is kept when its variants fit
    the family's quota; otherwise it is replaced by one of the family's earlier configurations with jittered sizes
    (kept if the dry run needs no new variant) or, failing that, with new values only (same sizes, new seed). Fresh
    draws are never redrawn, so the share of edge cases (empty tensors, one token) stays that of the generator.
    """
    rng = random.Random(seed)
    families = [draw_family(rng) for _ in range(n_families)]
    known: dict = defaultdict(set)      # family -> variants it uses
    templates: dict = defaultdict(list)  # family -> accepted configurations that launch something
    how = Counter()
    configs = []
    for i in range(count):
        family = families[i % n_families]
        cfg = draw_config(rng, family, scale)
        if variant_quota is not None:
            keys = kernel_variants(cfg, device)
            if keys <= known[family] or len(known[family] | keys) <= variant_quota:
                known[family] |= keys
                if keys:
                    templates[family].append(cfg)
                how["fresh"] += 1
            else:
                for _ in range(jitter_tries):
                    candidate = _jitter(rng, rng.choice(templates[family]), scale)
                    if kernel_variants(candidate, device) <= known[family]:
                        cfg = candidate
                        how["jittered sizes"] += 1
                        break
                else:
                    cfg = dataclasses.replace(rng.choice(templates[family]), seed=rng.randrange(2**31),
                                              base=rng.choice((10000.0, 500000.0, 1e6)))
                    how["new values"] += 1
        configs.append(cfg)
    stats = {"seed": seed, "families": n_families, "variant_quota": variant_quota,
             "kernel_variants": len(set().union(*known.values())) if variant_quota is not None else None,
             "draws": dict(how)}
    return configs, stats


def _jitter(rng: random.Random, template: Config, scale: Scale) -> Config:
    """``template`` with other sizes that usually keep its kernel variants (token counts moved by multiples of 16,
    another batch, other sequence lengths with the same longest one) and new values."""
    f = template.family
    changes = dict(seed=rng.randrange(2**31), base=rng.choice((10000.0, 500000.0, 1e6)),
                   span=max(0, template.span + 16 * rng.randint(-4, 4)))
    if f.varlen:
        longest = max(template.lengths, default=0)
        lengths = [rng.randint(0, longest) for _ in range(rng.randint(1, scale.max_seqs))] + [longest]
        rng.shuffle(lengths)
        if not (f.positions == "ids" and sum(lengths) == len(lengths) and longest != 1):
            changes["lengths"] = tuple(lengths)
    else:
        changes["batch"] = rng.choice([b for b in scale.batches if b > 0])
        if template.seqlen >= 2:
            changes["seqlen"] = max(2, template.seqlen + 16 * rng.randint(-4, 4))
    if template.offset >= 2:
        changes["offset"] = max(2, template.offset + 16 * rng.randint(-4, 4))
    candidate = dataclasses.replace(template, **changes)
    heads = max(candidate.heads_q, candidate.heads_k) * (f.head_dim + 16) * (2 if f.view == "sliced" else 1)
    return candidate if candidate.tokens * heads <= scale.max_numel else dataclasses.replace(template, **{
        k: v for k, v in changes.items() if k in ("seed", "base")})
