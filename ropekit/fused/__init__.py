"""Fused attention pre-processing: QK-norm + RoPE (with its backward), RoPE + KV-cache write (contiguous or paged,
optionally float8), and DeepSeek MLA's decoupled RoPE + latent-cache write, each one launch of
``ropekit.triton.fused``. Semantics: docs/fused.md."""

from .kv_cache import rope_and_cache
from .mla import mla_rope_and_cache
from .qk_norm_rope import qk_norm_rope

__all__ = ["qk_norm_rope", "rope_and_cache", "mla_rope_and_cache"]
