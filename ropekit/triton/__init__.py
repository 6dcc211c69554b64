"""The Triton kernel ladder: v1 (the math) -> v2 (strides, dtypes) -> v3 (tiles) -> v4 (production).

Each module holds one kernel and one launcher; vN differs from vN-1 by one idea.
"""

from . import v1, v2, v3, v4

__all__ = ["v1", "v2", "v3", "v4"]
