"""The exercises: for each, a task in a few sentences, a template, a solution, the launch, and the checker's cases.

Notebook NN holds the exercises whose name starts with NN. Files, by exercise ``NN_name``:

* ``templates/exNN_name.py`` (``.cu``): what the reader starts from (a function raising NotImplementedError, or a
  kernel with its body missing);
* ``solutions/exNN_name.py`` (``.cu``): shown only on request, by :func:`show_solution`;
* ``wrong/exNN_name.py`` (``wrong/exNN_name/*.cu``): deliberately wrong variants, one per diagnosis, for the tests.

Adding an exercise is one ``_add(Exercise(...))`` in the registry. ``names()`` is the course's order: by notebook
(the ``NN``), and within a notebook in the order of registration (02's warm-ups before its row kernel). A RoPE-shaped exercise gives ``cases`` and ``run``: the checker runs the reader's code on every
case and diagnoses its output. Any other exercise gives ``check``, a function of the reader's code returning a
:class:`~ropekit.course.diagnose.Finding` (``errors.explain`` turns an exception into one). Either may add ``grade``,
called only once the code is correct (e.g. speed against the copy ceiling): it returns a Finding, "correct" to pass.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import triton

from .buffers import Layout
from .cases import RopeCase, make_inputs
from .function_checks import check_pair_indices, check_rotate_pair
from .speed import QKShape, grade_speed
from .fusion.paged_check import check_rope_cache

__all__ = ["Exercise", "EXERCISES", "exercise", "names", "task", "template_source", "solution_source",
           "load_template", "load_solution", "wrong_variants", "show_task", "show_template", "show_solution"]

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Exercise:
    name: str  # "NN_what": NN is the notebook
    title: str
    language: str  # "pytorch", "triton" or "cuda"
    entry: str  # the name of the function or kernel the reader writes
    task: str  # the task, in a few sentences
    diagnoses: tuple[str, ...]  # what the checker can recognise for this exercise (besides correct / not solved)
    cases: tuple = ()  # RopeCase list (rope-shaped exercises)
    launch: Callable | None = None  # launch(kernel, x, cos, sin, out, ...) for kernels
    run: Callable | None = None  # run(code, inputs) -> output tensor, used by the checker
    notes: dict = field(default_factory=dict)
    check: Callable | None = None  # check(code) -> Finding, for exercises without RoPE cases
    grade: Callable | None = None  # grade(code) -> Finding | None, after the code is correct (e.g. its speed)

    @property
    def module(self) -> str:
        return "ex" + self.name

    @property
    def suffix(self) -> str:
        return ".cu" if self.language == "cuda" else ".py"


# --- launches (the given part of each kernel exercise) ------------------------------------------------------------

def launch_row(kernel, x, cos, sin, out):
    """02: one program per head vector of a contiguous (batch, seq, heads, head_dim) tensor."""
    batch, seq, heads, head_dim = x.shape
    kernel[(batch * seq * heads,)](x, cos, sin, out, seq, heads, HEAD_DIM=head_dim)


def launch_strided(kernel, x, cos, sin, out):
    """03: one program per head vector of (batch, seq, heads, head_dim) views with any strides."""
    batch, seq, heads, head_dim = x.shape
    kernel[(batch * seq * heads,)](x, cos, sin, out, seq, heads, *x.stride(), *out.stride(),
                                   HEAD_DIM=head_dim, BLOCK_HALF=triton.next_power_of_2(head_dim // 2))


def launch_tiled(kernel, x, cos, sin, out, block_s: int = 4, block_h: int = 2):
    """04: one program per tile of ``block_s`` tokens of one sequence; the program loops over the heads, ``block_h``
    at a time (fewer than the cases' heads, so a kernel without the loop leaves heads unwritten)."""
    batch, seq, heads, head_dim = x.shape
    if x.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("exercise 04 expects contiguous channels (head-dim stride 1)")
    grid = (triton.cdiv(seq, block_s), batch)
    kernel[grid](x, cos, sin, out, seq, heads, x.stride(0), x.stride(1), x.stride(2),
                 out.stride(0), out.stride(1), out.stride(2),
                 HEAD_DIM=head_dim, BLOCK_S=block_s, BLOCK_H=block_h)


def tile_of(kernel) -> tuple[int, int, int]:
    """(BLOCK_S, BLOCK_H, NUM_WARPS): the defaults of a q+k kernel's signature (the reader chooses the tile there)."""
    parameters = inspect.signature(getattr(kernel, "fn", kernel)).parameters
    missing = [name for name in ("BLOCK_S", "BLOCK_H", "NUM_WARPS")
               if name not in parameters or parameters[name].default is inspect.Parameter.empty]
    if missing:
        raise ValueError(f"give {', '.join(missing)} a default in the kernel's signature (the launch reads the tile "
                         "from there)")
    return tuple(int(getattr(parameters[name].default, "value", parameters[name].default))
                 for name in ("BLOCK_S", "BLOCK_H", "NUM_WARPS"))


def qk_grid(batch: int, seq: int, heads_q: int, heads_k: int, block_s: int, block_h: int) -> tuple[int, int, int]:
    """05's grid: (token tiles, q's head blocks then k's, batch)."""
    return triton.cdiv(seq, block_s), triton.cdiv(heads_q, block_h) + triton.cdiv(heads_k, block_h), batch


def launch_qk(kernel, q, k, cos, sin, offsets, out_q, out_k, tile: tuple[int, int, int] | None = None):
    """05: q and k in one launch on :func:`qk_grid`; the tile (BLOCK_S, BLOCK_H, NUM_WARPS) from the kernel's
    signature unless ``tile`` is given (the reference tiles of ``speed``)."""
    batch, seq, heads_q, head_dim = q.shape
    heads_k = k.shape[2]
    block_s, block_h, num_warps = tile or tile_of(kernel)
    grid = qk_grid(batch, seq, heads_q, heads_k, block_s, block_h)
    kernel[grid](q, k, out_q, out_k, cos, sin, offsets, seq, heads_q, heads_k, *q.stride()[:3], *k.stride()[:3],
                 *out_q.stride()[:3], *out_k.stride()[:3], HEAD_DIM=head_dim, BLOCK_S=block_s, BLOCK_H=block_h,
                 NUM_WARPS=num_warps, num_warps=num_warps)


def q_heads(heads: int) -> int:
    """05's cases split one tensor's heads into q (the first ones) and k (the last third: GQA, or MQA's single head)."""
    return heads - max(1, heads // 3)


def _run_kernel(launch):
    def run(kernel, inputs):
        launch(kernel, inputs.x.view, inputs.cos.view, inputs.sin.view, inputs.out.view)
        return inputs.out.view
    return run


def _run_qk(kernel, inputs):
    """q and k are two views of the case's x (its first and last heads), rotated at the same positions: the checker
    reads them back as one output."""
    split = q_heads(inputs.case.heads)
    x, out = inputs.x.view, inputs.out.view
    launch_qk(kernel, x[:, :, :split], x[:, :, split:], inputs.cos.view, inputs.sin.view, inputs.offsets,
              out[:, :, :split], out[:, :, split:])
    return out


def _run_rope_torch(fn, inputs):
    case = inputs.case
    x = inputs.x.view.clone()
    return fn(x, inputs.positions.clone(), base=case.base, rotary_dim=case.rotary_dim,
              interleaved=case.interleaved)


def _run_cuda(source, inputs):
    """Every thread of the launch emulated in turn on the CPU (``cuda_cpu``), which names the thread that read or
    stored outside its tensor or stored over another's element; then, on a GPU, the kernel itself. A GPU alone shows
    only the consequence (an element never written, or a wrong value), so the emulation runs there too wherever a
    host C++ compiler is."""
    from . import cuda, cuda_cpu
    if not inputs.x.view.is_cuda:
        return cuda_cpu.run(source, inputs)
    if cuda_cpu.find_cxx() is not None:
        try:
            cuda_cpu.build(source)
        except cuda.CompileError:  # what the emulation leaves out (shared memory, shuffles): the GPU's run decides
            pass
        else:
            cuda_cpu.run(source, make_inputs(inputs.case, "cpu"))
    return cuda.run(source, inputs)


# --- the cases -----------------------------------------------------------------------------------------------------

# x stored sequence-major (sbhd) and read through a (batch, seq, heads, head_dim) view whose channels are 2 apart.
_SBHD_CHANNEL_STRIDE_2 = Layout(order=(1, 0, 2, 3), last_stride=2,
                                label="x stored seq-major (sbhd) with channels 2 elements apart")
_SBHD = Layout(order=(1, 0, 2, 3), label="sbhd")
# Out with gaps after every head vector, token and sequence: a store past its row lands on a canary.
_GAPPED = Layout(gaps=(0, 0, 8, 4), label="out with gaps between head vectors")
_GAPPED_TILES = Layout(gaps=(0, 140, 10, 2), label="out with gaps between heads, tokens and sequences")

_TORCH_POSITIONS = ((3, 1, 0, 7, 12),)

EXERCISES: dict[str, Exercise] = {}


def _add(ex: Exercise) -> None:
    EXERCISES[ex.name] = ex


_add(Exercise(
    name="01_rotate_pair", title="The rotation of one pair", language="pytorch", entry="rotate_pair",
    task=("Write rotate_pair(a, b, theta): turn the 2-D points (a, b) counter-clockwise by theta radians and return "
          "the turned (a, b). Everything in RoPE is this one operation, applied to many pairs at many angles."),
    diagnoses=("wrong_direction", "wrong"),
    check=check_rotate_pair,
))

_add(Exercise(
    name="01_pair_indices", title="NeoX and GPT-J pairings as index maps", language="pytorch", entry="pair_indices",
    task=("Write pair_indices(rotary_dim, interleaved) -> (first, second): the channel numbers of the rotary_dim/2 "
          "pairs, so that pair i turns channels first[i] and second[i]. interleaved=False is NeoX/Llama (the two "
          "halves), interleaved=True is GPT-J (neighbours)."),
    diagnoses=("other_pairing", "wrong_direction", "wrong"),
    check=check_pair_indices,
))

_add(Exercise(
    name="01_rope_torch", title="RoPE in plain PyTorch", language="pytorch", entry="rope_torch",
    task=("Write rope_torch(x, positions, base=, rotary_dim=, interleaved=): the rotary embedding of x "
          "(batch, seq, heads, head_dim) at integer positions (batch, seq). Pair i turns by "
          "position * base ** (-2i / rotary_dim); only the first rotary_dim channels turn. Compute in float32 or "
          "better and return x's dtype."),
    diagnoses=("wrong_direction", "other_pairing", "position_shift", "wrong_positions", "tail_touched",
               "partial_pairing", "wrong_base", "half_precision_math", "wrong"),
    cases=(
        RopeCase("float32, NeoX pairs, head_dim 16", 1, 5, 2, 16, position_ids=_TORCH_POSITIONS, out_layout=None,
                 table_len=None),
        RopeCase("float32, GPT-J pairs (interleaved=True)", 1, 5, 2, 16, interleaved=True,
                 position_ids=_TORCH_POSITIONS, out_layout=None, table_len=None, seed=1),
        RopeCase("partial rotary: rotary_dim 8 of head_dim 16, base 500000", 1, 5, 2, 16, rotary_dim=8,
                 base=500000.0, position_ids=((0, 1, 2, 5, 12),), out_layout=None, table_len=None, seed=2),
        RopeCase("bfloat16 x", 1, 4, 4, 16, dtype=torch.bfloat16, position_ids=((1, 2, 100, 1000),),
                 out_layout=None, table_len=None, seed=3),
    ),
    run=_run_rope_torch,
))

# --- notebook 02's warm-ups (the Triton primer): checked by ropekit.course.warmups --------------------------------

from . import warmups as _warmups  # noqa: E402  (the warm-ups' launches and checks live in their own module)


def _add_warmup(name: str, title: str, entry: str, task: str, diagnoses: tuple[str, ...]) -> None:
    _add(Exercise(name=name, title=title, language="triton", entry=entry, task=task, diagnoses=diagnoses,
                  check=_warmups.checker(name)))


_add_warmup(
    "02_warmup_copy", "Warm-up 1: pointers, blocks and masks", "copy_kernel",
    "Fill in copy_kernel: copy the n elements of SRC to DST. Program p owns the BLOCK offsets "
    "p * BLOCK + tl.arange(0, BLOCK); n is not a multiple of BLOCK, so mask the lanes past the end in the load and "
    "the store. Checked for n = 64, 100, 1 and 300 with BLOCK = 64.",
    ("out_of_bounds", "load_out_of_bounds", "unwritten", "raised", "wrong"))
_add_warmup(
    "02_warmup_rotate_half", "Warm-up 2: a constexpr inside the kernel", "rotate_half_kernel",
    "Fill in rotate_half_kernel: program `row` writes cat(-x[D/2:], x[:D/2]) for its row of the contiguous "
    "(rows, D) tensor X, D a power of two. The block of D/2 lanes needs a compile-time length: declare "
    "`HALF: tl.constexpr = D // 2`. Checked on 3 rows of D = 8, 5 rows of 16 and 1 row of 64.",
    ("raised", "wrong_direction", "unwritten", "wrong"))
_add_warmup(
    "02_warmup_angles", "Warm-up 3: broadcasting and a 2-D mask", "angles_kernel",
    "Fill in angles_kernel: OUT[p, i] = p * INV_FREQ[i] (float32) for the BLOCK_P = 16 positions of the program "
    "and every pair. Make a (BLOCK_P, BLOCK_I) block from a column of positions (positions[:, None]) and a row of "
    "frequencies (inv_freq[None, :]), convert the integer positions to float32, and mask both axes. Checked for "
    "16 x 8, 37 x 12 and 5 x 3, and 40 x 6 with INV_FREQ stored in float16 (where int32 positions times float16 "
    "frequencies would be float16 math).",
    ("position_shift", "out_of_bounds", "load_out_of_bounds", "half_precision_math", "unwritten", "raised",
     "wrong"))

_add(Exercise(
    name="02_row_kernel", title="A one-row Triton kernel", language="triton", entry="rope_row_kernel",
    task=("Fill in rope_row_kernel: program `row` rotates one head vector (HEAD_DIM channels, a power of two) of a "
          "contiguous float32 (batch, seq, heads, HEAD_DIM) tensor, NeoX pairs (i, i + HEAD_DIM/2), at position "
          "(row // n_heads) % seq_len, with cos/sin from row `position` of the half-width tables. Launched as "
          "rope_row_kernel[(batch * seq * heads,)](x, cos, sin, out, seq, heads, HEAD_DIM=head_dim)."),
    diagnoses=("wrong_direction", "sign_in_one_channel", "other_pairing", "position_shift", "wrong_positions",
               "broadcast", "unwritten", "out_of_bounds", "compile_error", "wrong"),
    cases=(
        RopeCase("float32, contiguous, head_dim 16", 2, 3, 2, 16),
        RopeCase("float32, 3 sequences of 5 tokens, 3 heads (counts that are not powers of two), head_dim 8",
                 3, 5, 3, 8, seed=1),
        RopeCase("float32, 1 sequence of 7 tokens, 5 heads, head_dim 64", 1, 7, 5, 64, seed=2),
    ),
    launch=launch_row, run=_run_kernel(launch_row), notes={"program": "row"},
))

_add(Exercise(
    name="03_strided_kernel", title="Strides and masks for a head_dim that is not a power of two",
    language="triton", entry="rope_strided_kernel",
    task=("Fill in rope_strided_kernel: like 02, but x and out are views with any strides (all four are passed), "
          "any float dtype (compute in float32, round once when storing), and HEAD_DIM = 24 is not a power of two: "
          "the block has BLOCK_HALF = 16 lanes for 12 pairs, so loads and stores need a mask."),
    diagnoses=("unwritten", "out_of_bounds", "out_stride", "stride_ignored", "half_precision_math", "wrong_direction",
               "other_pairing", "position_shift", "wrong"),
    cases=(
        RopeCase("float32, head_dim 24, x a strided view, out with gaps", 1, 3, 2, 24,
                 x_layout=_SBHD_CHANNEL_STRIDE_2, out_layout=_GAPPED),
        # float16, not bfloat16: the Triton interpreter computes bfloat16 arithmetic wrongly (garbage values), which
        # would hide the half-precision diagnosis on a CPU machine.
        RopeCase("float16, head_dim 24, contiguous", 1, 3, 2, 24, dtype=torch.float16, seed=1),
        RopeCase("float32, head_dim 40 (20 pairs in 32 lanes), 3 sequences x 5 tokens x 3 heads, x stored "
                 "seq-major, out with gaps", 3, 5, 3, 40, x_layout=_SBHD, out_layout=_GAPPED, seed=2),
    ),
    launch=launch_strided, run=_run_kernel(launch_strided), notes={"program": "row"},
))

_add(Exercise(
    name="04_tiled_kernel", title="A tiled kernel with a loop over the heads", language="triton",
    entry="rope_tiled_kernel",
    task=("Fill in rope_tiled_kernel: a program rotates a tile of BLOCK_S = 4 tokens x every head of one sequence. It "
          "loads the tile's cos/sin rows once and then loops over the heads, BLOCK_H = 2 at a time, so that every "
          "step reuses them. Sequence lengths and head counts are not multiples of the block sizes: mask the token and "
          "head axes."),
    diagnoses=("unwritten", "out_of_bounds", "load_out_of_bounds", "position_shift", "cos_sin_reloaded",
               "compile_error", "broadcast", "wrong_direction", "other_pairing", "wrong"),
    cases=(
        RopeCase("float32, batch 2, seq 5, 3 heads, head_dim 8, x stored seq-major, out with gaps", 2, 5, 3, 8,
                 x_layout=_SBHD, out_layout=_GAPPED_TILES),
        RopeCase("float32, batch 1, seq 9 (two tiles and a 1-token tail), 5 heads (three head steps), head_dim 16",
                 1, 9, 5, 16, out_layout=_GAPPED_TILES, seed=1),
        RopeCase("float32, batch 3, seq 4, 8 heads, head_dim 32 (everything divides: four head steps)", 3, 4, 8, 32,
                 seed=2),
        # The table ends where the positions do (NaN rows after it): an unmasked cos/sin load of the last tile
        # reads past it.
        RopeCase("float32, batch 2, seq 6 (a 2-token tail), 3 heads, head_dim 16, a cos/sin table of exactly the "
                 "6 rows the positions reach", 2, 6, 3, 16, table_len=6, out_layout=_GAPPED_TILES, seed=3),
    ),
    launch=launch_tiled, run=_run_kernel(launch_tiled), notes={"check_reuse": True},
))

_add(Exercise(
    name="05_qk_offsets", title="q and k in one launch, at per-sequence offsets (and fast)", language="triton",
    entry="rope_qk_kernel",
    task=("Fill in rope_qk_kernel: one launch rotates q and k (k has fewer heads). The grid's second axis holds q's "
          "head blocks, then k's; a program finds out which from its index. Sequence b continues a KV cache of "
          "OFFSETS[b] tokens, so its token s sits at OFFSETS[b] + s. Choose the tile (BLOCK_S, BLOCK_H, NUM_WARPS) "
          "in the signature's defaults: on a GPU the speed check asks for 80 % of the copy ceiling on Llama-3-8B's "
          "prefill (b4 s4096, 32 q / 8 k heads x 128, bf16)."),
    diagnoses=("position_shift", "wrong_positions", "unwritten", "out_of_bounds", "too_slow", "wrong_direction",
               "other_pairing", "wrong"),
    cases=(
        RopeCase("float32, GQA: 4 q + 2 k heads x 16, 3 sequences of 5 tokens, offsets (0, 6, 3)", 3, 5, 6, 16,
                 offsets=(0, 6, 3), out_layout=_GAPPED),
        RopeCase("float16, MQA: 4 q + 1 k head x 32, decode (1 token per sequence), offsets (9, 2)", 2, 1, 5, 32,
                 dtype=torch.float16, offsets=(9, 2), seed=1),
        RopeCase("float32, 2 q + 1 k heads x 8, 7 tokens, offset 4", 1, 7, 3, 8, offsets=(4,), seed=2),
    ),
    launch=launch_qk, run=_run_qk, grade=grade_speed("05_qk_offsets"),
    notes={"speed_shape": QKShape(4, 4096, 32, 8, 128, torch.bfloat16), "split_heads": q_heads},
))

_add(Exercise(
    name="06_cuda_kernel", title="A CUDA kernel body", language="cuda", entry="rope_pairs_kernel",
    task=("Fill in the body of the CUDA kernel rope_pairs_kernel: one thread per pair of a contiguous float32 "
          "(batch, seq, heads, head_dim) tensor, NeoX pairs, position = the token's index in its sequence. The grid "
          "is rounded up to whole blocks of 128 threads. Pass the source (a string) to check(): on a GPU it runs "
          "there; on a CPU every thread of the launch runs in turn, and each access outside a tensor is named."),
    diagnoses=("wrong_direction", "other_pairing", "position_shift", "unwritten", "out_of_bounds",
               "load_out_of_bounds", "overlapping_stores", "compile_error", "wrong"),
    cases=(
        RopeCase("float32, contiguous, head_dim 24 (12 pairs per row)", 1, 3, 2, 24),
        RopeCase("float32, 3 sequences x 5 tokens x 3 heads, head_dim 16: 360 pairs, the last block part-filled",
                 3, 5, 3, 16, seed=1),
    ),
    run=_run_cuda, notes={"program": "thread"},
))


_add(Exercise(
    name="09_rope_cache_kernel", title="RoPE and the paged KV-cache write in one kernel", language="triton",
    entry="rope_cache_kernel",
    task=("Fill in rope_cache_kernel: program `token` rotates the token's query heads into Q_OUT and its key heads "
          "straight into the paged K_CACHE at slot SLOTS[token] (block slot // block_size, row slot % block_size), "
          "and copies its value heads unchanged to V_CACHE at the same slot. A slot of -1 is padding: nothing is "
          "written to the caches for it. One read of q, k and v, one write of each output: the fused step."),
    diagnoses=("wrong_direction", "position_shift", "wrong_positions", "other_pairing", "unwritten",
               "out_of_bounds", "stray_rows", "wrong"),
    check=check_rope_cache,
))

# --- access --------------------------------------------------------------------------------------------------------

def names() -> list[str]:
    """Every exercise in the course's order: by notebook, then as registered within it."""
    return sorted(EXERCISES, key=lambda name: name.split("_")[0])


def exercise(name: str) -> Exercise:
    try:
        return EXERCISES[name]
    except KeyError:
        raise KeyError(f"no exercise {name!r}; the exercises are: {', '.join(EXERCISES)}") from None


def _source(folder: str, name: str) -> str:
    ex = exercise(name)
    return (HERE / folder / (ex.module + ex.suffix)).read_text()


def task(name: str) -> str:
    ex = exercise(name)
    return f"Exercise {ex.name}: {ex.title}\n\n{ex.task}"


def template_source(name: str) -> str:
    return _source("templates", name)


def solution_source(name: str) -> str:
    return _source("solutions", name)


def _load(folder: str, name: str):
    ex = exercise(name)
    if ex.language == "cuda":
        return _source(folder, name)
    module = importlib.import_module(f"{__package__}.{folder}.{ex.module}")
    return getattr(module, ex.entry)


def load_template(name: str):
    """The template's function or kernel (CUDA: its source), as a reader who changed nothing would pass it."""
    return _load("templates", name)


def load_solution(name: str):
    """The solution's function or kernel (CUDA: its source)."""
    return _load("solutions", name)


def wrong_variants(name: str) -> dict:
    """{diagnosis: deliberately wrong code} for the tests."""
    ex = exercise(name)
    if ex.language == "cuda":
        folder = HERE / "wrong" / ex.module
        return {path.stem: path.read_text() for path in sorted(folder.glob("*.cu"))}
    return dict(importlib.import_module(f"{__package__}.wrong.{ex.module}").WRONG)


def show_task(name: str) -> None:
    print(task(name))


def show_template(name: str) -> None:
    print(template_source(name), end="")


def show_solution(name: str) -> None:
    """Print the solution's source (only when you ask for it)."""
    print(solution_source(name), end="")
