"""ropekit: Rotary Position Embedding kernels (Triton v1-v4, CUDA C++) and the course that builds them.

    import ropekit
    rope = ropekit.RotaryEmbedding(head_dim=128, base=500000.0)
    q, k = rope(q, k, positions=cache_lengths)          # (batch, seq, heads, head_dim), any dtype
"""

__version__ = "0.1.0"  # the one place the version is set (pyproject.toml reads it; docs/releasing.md says when it moves)

from .cli import answer_early  # noqa: E402  (standard library only)

answer_early(__version__)  # `python -m ropekit --help` / `--version` answer here and exit, before torch loads
del answer_early

from . import device  # first: decides CUDA vs the Triton interpreter before any kernel module imports triton

from . import frequencies, positions, reference  # noqa: E402
from . import triton  # noqa: E402
from . import te  # noqa: E402
from .api import apply_rope  # noqa: E402
from .frequencies import (  # noqa: E402
    cos_sin_from_freqs,
    cos_sin_table,
    inverse_frequencies,
    rope_init,
    rope_parameters_from_config,
)
from .engines import (apply_rope_with_cos_sin_cache_inplace, rope_quantize_fp8,  # noqa: E402
                      rope_quantize_fp8_append_paged_kv_cache, rotary_embedding)
from .fused import mla_rope_and_cache, qk_norm_rope, rope_and_cache  # noqa: E402
from .hf import apply_rotary_pos_emb, mrope_cos_sin  # noqa: E402
from .module import RopeTable, RotaryEmbedding  # noqa: E402
from .positions import (  # noqa: E402
    context_parallel_positions,
    context_parallel_shard,
    context_parallel_varlen_positions,
)


__all__ = [
    "apply_rope",
    "RotaryEmbedding",
    "RopeTable",
    "cos_sin_table",
    "cos_sin_from_freqs",
    "inverse_frequencies",
    "rope_init",
    "rope_parameters_from_config",
    "apply_rotary_pos_emb",
    "rotary_embedding",
    "apply_rope_with_cos_sin_cache_inplace",
    "rope_quantize_fp8",
    "rope_quantize_fp8_append_paged_kv_cache",
    "qk_norm_rope",
    "rope_and_cache",
    "mla_rope_and_cache",
    "mrope_cos_sin",
    "context_parallel_positions",
    "context_parallel_shard",
    "context_parallel_varlen_positions",
    "reference",
    "frequencies",
    "positions",
    "triton",
    "te",
    "device",
]
