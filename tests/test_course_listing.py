"""ropekit.course.listing: notebooks render the package's own source."""

import inspect

import pytest

from ropekit.course import show_source
from ropekit.triton import v1

IPython_display = pytest.importorskip("IPython.display")


def test_a_jitted_kernel_is_shown_as_the_source_it_was_written_as(monkeypatch):
    shown = []
    monkeypatch.setattr(IPython_display, "display", shown.append)
    show_source(v1.rope_v1_kernel)
    assert len(shown) == 1
    text = shown[0].data
    assert text.startswith("```python\n") and text.endswith("```")
    assert inspect.getsource(v1.rope_v1_kernel.fn) in text
