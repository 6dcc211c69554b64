"""Fused attention pre-processing: QK-norm + RoPE (with its backward), RoPE + KV-cache write (contiguous or paged,
optionally fp8), and DeepSeek MLA's decoupled RoPE + latent-cache write, each one launch of
``ropekit.triton.fused``. Semantics: docs/fused.md."""

from .qk_norm_rope import qk_norm_rope

__all__ = ["qk_norm_rope"]
