"""The Triton kernel ladder: v1 (the math) -> v2 (strides, dtypes) -> v3 (tiles) -> v4 (production).

v1-v3 each hold one kernel and one launcher; vN differs from vN-1 by one idea. v4 is split by job: ``v4`` the tile
kernel, ``v4_flat`` its flat path, ``launch`` the launch table, plans and the launcher :func:`launch.rope_v4`.
"""

from . import launch, v1, v2, v3, v4, v4_flat

__all__ = ["v1", "v2", "v3", "v4", "v4_flat", "launch"]
