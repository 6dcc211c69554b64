"""What an exception from the reader's code means, in the checker's words.

A kernel that does not compile, a name that is not defined, blocks whose shapes do not fit: the compiler (on a GPU)
and the Triton interpreter (on a CPU) both say so in one terse line. :func:`explain` keeps that line and adds what
usually causes it and how to fix it. Every hint is chosen from the error's own text, so it reads the same on a GPU
(``triton.compiler.errors.CompilationError``) and under the interpreter (``InterpreterError``).
"""

from __future__ import annotations

import traceback

from . import fence
from .diagnose import Finding

__all__ = ["explain", "hint_for", "IMPORT_ORDER", "COMPILE_HINTS", "INTERPRETER_HINTS"]

IMPORT_ORDER = (
    "This kernel was decorated with @triton.jit before ropekit chose where kernels run. On a machine without a GPU, "
    "`import ropekit` sets TRITON_INTERPRET=1 so that Triton runs kernels in its interpreter on the CPU, and Triton "
    "reads that setting when @triton.jit decorates a function: a kernel defined earlier looks for a GPU driver and "
    "finds none (\"0 active drivers\"). Put `import ropekit` first in the notebook (before `import triton`), or set "
    "TRITON_INTERPRET=1 in the environment before Python starts; then restart the kernel and run the cells again.")

# (words the error contains, what they usually mean): the first match wins, so the more specific come first.
COMPILE_HINTS: tuple[tuple[str, str], ...] = (
    ("active drivers", IMPORT_ORDER),
    ("arange's arguments must be of type tl.constexpr", (
        "tl.arange needs bounds known when the kernel is compiled (tl.constexpr). A value computed inside the kernel "
        "from a constexpr, such as `H = HEAD_DIM // 2`, is an ordinary runtime value unless you say otherwise: "
        "write `H: tl.constexpr = HEAD_DIM // 2`, or put `HEAD_DIM // 2` into the call itself.")),
    ("range must be a power of 2", (
        "tl.arange's length must be a power of two. For a row whose length is not one, take a block of "
        "triton.next_power_of_2(n) lanes (passed as a tl.constexpr) and mask the lanes past n in every load and "
        "store: `mask = offsets < n`.")),
    ("incompatible dimensions", (
        "Two blocks of different shapes met in one operation, and Triton could not broadcast them. Shapes line up "
        "from the right, as in NumPy: a cos tile [BLOCK_S, HALF] against x [BLOCK_S, BLOCK_H, HALF] pairs BLOCK_S "
        "with BLOCK_H. Insert the missing axis so each axis means the same thing: `cos[:, None, :]` is "
        "[BLOCK_S, 1, HALF] and spreads one token's row over its heads. `tl.static_print(x.shape)` prints a block's "
        "shape while the kernel compiles.")),
    ("cannot broadcast", (
        "Two blocks of different shapes met in one operation. Shapes line up from the right; add the missing axis "
        "with `[:, None]` (or `[None, :]`) so each axis means the same thing in both blocks.")),
    ("is not defined", (
        "A name used in the kernel is not defined there. A kernel sees only its arguments, names it assigns, and "
        "module-level constants (annotated tl.constexpr) or @triton.jit functions; check the spelling, and pass "
        "anything else in as an argument.")),
    ("unsupported ptr type", (
        "A load or store was given something that is not a pointer (or a block of pointers). Address = a tensor "
        "argument + integer offsets, e.g. `tl.load(X + row * HEAD_DIM + offsets)`.")),
    ("must be of type tl.constexpr", (
        "This argument must be known when the kernel compiles. Declare the kernel parameter as `NAME: tl.constexpr`, "
        "or annotate a derived value: `H: tl.constexpr = HEAD_DIM // 2`.")),
)


# Errors only the interpreter raises, for code the GPU compiler accepts: the reader's kernel is not wrong, the CPU
# cannot run it as written, and the hint says how to write it so that both run it.
INTERPRETER_HINTS: tuple[tuple[str, str], ...] = (
    ("mask has unsupported dtype", (
        "The Triton interpreter (the CPU) cannot use a mask made from a single loaded value, such as `slot >= 0` "
        "with `slot = tl.load(SLOTS + token)`, although the GPU's compiler accepts it. Either put the cache stores "
        "inside `if slot >= 0:` (a scalar condition: both run it), or give the condition the block's shape before "
        "combining it: `kv_mask = (heads < n_heads_kv) & ((slot + tl.zeros_like(heads)) >= 0)`.")),
)


def _compiler_said_it(error: BaseException, hint: str | None) -> bool:
    """Rejected by Triton's compiler (GPU), or by the interpreter for a reason the compiler would give (CPU)?"""
    names = {cls.__name__ for cls in type(error).__mro__}
    return "CompilationError" in names or ("InterpreterError" in names and hint is not None)


def hint_for(text: str, hints: tuple[tuple[str, str], ...] = COMPILE_HINTS) -> str | None:
    """The hint for an error whose text is ``text``, or None when the checker knows none."""
    lowered = text.lower()
    for words, hint in hints:
        if words.lower() in lowered:
            return hint
    return None


def explain(error: BaseException) -> Finding:
    """The finding for an exception raised while running the reader's code."""
    if isinstance(error, NotImplementedError):
        return Finding("not_solved", "Not yet solved: the template still raises NotImplementedError. Replace it "
                                     "with your code and run the check again.")
    stopped = fence.finding(error)
    if stopped is not None:
        return stopped
    if isinstance(getattr(error, "finding", None), Finding):  # a fault the CPU emulation of a CUDA kernel named
        return error.finding
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    if len(text) > 1500:
        text = text[:1500] + " ..."
    hint = hint_for(text)
    if hint is IMPORT_ORDER:
        return Finding("import_order", f"{IMPORT_ORDER}\n\nThe error was:\n{text}")
    if hint is None:
        interpreter_hint = hint_for(text, INTERPRETER_HINTS)
        if interpreter_hint is not None:
            return Finding("raised", f"Your code raised an exception in Triton's interpreter:\n{text}\n\n"
                                     f"Hint: {interpreter_hint}")
    hint_words = f"\n\nHint: {hint}" if hint else ""
    if _compiler_said_it(error, hint):
        return Finding("compile_error", f"Triton could not compile your kernel:\n{text}{hint_words}")
    return Finding("raised", f"Your code raised an exception:\n{text}{hint_words}")
