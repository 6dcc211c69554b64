"""The course's exercises: tasks, templates, a checker that diagnoses, solutions on request, and touch pictures.

    from ropekit import course
    course.show_task("02_row_kernel")
    result = course.check("02_row_kernel", rope_row_kernel)   # prints e.g. "[02_row_kernel] FAILED (position_shift)"
    course.show_solution("02_row_kernel")                     # only when you want to see it

    from ropekit.course import touch
    touches = touch.record(ropekit.triton.v1.rope_v1, x, cos, sin, out=out)
    touch.plot(touches, "out")

Exercises (notebook NN holds those named NN_...): see ``course.names()`` and ``course.DIAGNOSES`` for what the checker
can tell apart: wrong values (from the output alone), memory written out of bounds or never written, and code that
does not compile or run (from the error, with a hint that names the usual fix). How to add an exercise, with its own
check or a grade (e.g. speed) after correctness: see ``exercises.py``.

On a machine without a GPU, ``import ropekit`` before ``import triton``: ropekit switches Triton to its interpreter,
which Triton reads when ``@triton.jit`` decorates a kernel. The checker recognises a kernel decorated too early.
"""

from . import touch
from .checker import CheckResult, check
from .diagnose import DIAGNOSES, PASSING_NOTES
from .listing import show_source
from .exercises import (EXERCISES, Exercise, exercise, load_solution, load_template, names, show_solution,
                        show_task, show_template, solution_source, task, template_source)

__all__ = [
    "show_source",
    "check",
    "CheckResult",
    "DIAGNOSES",
    "PASSING_NOTES",
    "EXERCISES",
    "Exercise",
    "exercise",
    "names",
    "task",
    "show_task",
    "template_source",
    "show_template",
    "show_solution",
    "solution_source",
    "load_template",
    "load_solution",
    "touch",
]
