"""Showing the package's own code in a notebook: the course renders the source, never a copy kept in the notebook."""

from __future__ import annotations

import inspect

__all__ = ["show_source"]


def show_source(obj) -> None:
    """Render the source of ``obj`` (a function, class, module or ``@triton.jit`` kernel) as a Python listing."""
    from IPython.display import Markdown, display  # the notebooks' dependency, not the package's

    obj = getattr(obj, "fn", obj)  # a @triton.jit kernel wraps the Python function it was written as
    display(Markdown(f"```python\n{inspect.getsource(obj)}```"))
