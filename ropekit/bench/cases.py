"""The benchmark cases: shapes, dtypes and position modes, and how many bytes each one must move.

The main cases are the ones the peers were measured on (the project's measuring rules fix their shapes); the sweep is
the seed benchmark's grid. Every case is a plain frozen dataclass so that tests, the notebook and the JSON all read the
same table.

Bytes: RoPE reads q and k once and writes them once; nothing else is counted (the cos/sin rows are a few percent at
most and shared by every head). Partial rotary in place moves only the rotary channels; out of place it also copies the
tail, so the tail counts too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

__all__ = [
    "Case",
    "MAIN_CASES",
    "SWEEP_SEQLENS",
    "SWEEP_BATCHES",
    "sweep_cases",
    "all_cases",
    "GROUPS",
    "TABLE_POSITIONS",
    "ROPE_BASE",
    "select_cases",
]

TABLE_POSITIONS = 8192  # every case uses cos/sin tables of 8192 positions ...
ROPE_BASE = 10000.0  # ... with base 10000
GROUPS = ("main", "sweep")
SWEEP_SEQLENS = tuple(range(256, 3968 + 1, 128))  # the seed benchmark's x axis: 128 * i for i in 2..31
SWEEP_BATCHES = (1, 2, 4, 8)
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


@dataclass(frozen=True)
class Case:
    """One benchmark shape. q is ``(batch, seq, heads_q, head_dim)`` in ``layout`` (``thd``: packed ``seq_lens``)."""

    name: str
    group: str
    title: str  # one line for tables and plots
    layout: str  # "bshd", "sbhd" or "thd"
    batch: int
    seqlen: int
    heads_q: int
    heads_k: int
    head_dim: int
    dtype: torch.dtype
    rotary_dim: int | None = None  # None: the whole head
    interleaved: bool = False  # GPT-J pairing
    positions: str = "none"  # "none" (0..S-1) or "offsets" (a (batch,) tensor of per-sequence offsets)
    seq_lens: tuple[int, ...] = ()  # thd only: the packed sequences' lengths
    inplace: bool | None = None  # None: each implementation uses its natural mode (same bytes at full rotary)
    backward: bool = False  # also time the backward pass (the conjugate rotation)

    def __post_init__(self):
        if self.group not in GROUPS:
            raise ValueError(f"group must be one of {GROUPS}, got {self.group!r}")
        if self.layout not in ("bshd", "sbhd", "thd"):
            raise ValueError(f"layout must be bshd, sbhd or thd, got {self.layout!r}")
        if self.positions not in ("none", "offsets"):
            raise ValueError(f"positions must be 'none' or 'offsets', got {self.positions!r}")
        if (self.layout == "thd") != bool(self.seq_lens):
            raise ValueError("seq_lens is given exactly when layout is 'thd'")
        if self.layout == "thd" and (self.batch != len(self.seq_lens) or self.seqlen != max(self.seq_lens)):
            raise ValueError("thd: batch must be len(seq_lens) and seqlen max(seq_lens)")
        rotary = self.rotary
        if rotary % 2 or not 0 < rotary <= self.head_dim:
            raise ValueError(f"rotary_dim must be even and in (0, head_dim], got {rotary}")

    # --- shapes -------------------------------------------------------------------------------------------------
    @property
    def rotary(self) -> int:
        """The number of rotated channels (``rotary_dim``, or the whole head)."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def partial(self) -> bool:
        return self.rotary < self.head_dim

    @property
    def n_tokens(self) -> int:
        return sum(self.seq_lens) if self.layout == "thd" else self.batch * self.seqlen

    @property
    def token_shape(self) -> tuple[int, ...]:
        """The leading (token) dimensions of q in this layout."""
        if self.layout == "thd":
            return (self.n_tokens,)
        if self.layout == "sbhd":
            return (self.seqlen, self.batch)
        return (self.batch, self.seqlen)

    @property
    def q_shape(self) -> tuple[int, ...]:
        return (*self.token_shape, self.heads_q, self.head_dim)

    @property
    def k_shape(self) -> tuple[int, ...]:
        return (*self.token_shape, self.heads_k, self.head_dim)

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def qk_bytes(self) -> int:
        """Bytes of q and k together (one buffer set's inputs)."""
        return self.n_tokens * (self.heads_q + self.heads_k) * self.head_dim * self.element_size

    def moved_bytes(self, inplace: bool = False) -> int:
        """Bytes read plus bytes written by an ideal kernel: q and k read once and written once.

        In place with partial rotary only the rotary channels move; out of place the tail is copied too.
        """
        channels = self.rotary if (inplace and self.partial) else self.head_dim
        return 2 * self.n_tokens * (self.heads_q + self.heads_k) * channels * self.element_size

    @property
    def working_set_bytes(self) -> int:
        """Inputs plus outputs of one out-of-place call: what has to fit in L2 for an L2-resident timing."""
        return 2 * self.qk_bytes

    @property
    def dtype_name(self) -> str:
        return _DTYPE_NAMES[self.dtype]

    def eager_formula_bytes(self) -> int:
        """A model (not a measurement) of the bytes transformers' eager formula moves: per tensor of N bytes,
        ``x*cos`` (N read, N written), the negated half (N/2, N/2), the concatenation (N, N), ``*sin`` (N, N) and the
        sum (2N, N): 10 N. Partial rotary does that on the rotary part R and then concatenates the tail: 10 R + 2 N.
        """
        full = self.qk_bytes
        rotary = full * self.rotary // self.head_dim
        return 10 * rotary + (2 * full if self.partial else 0)

    def scaled_down(self, **changes) -> "Case":
        """A copy with smaller dimensions (tests run cases under the Triton interpreter this way)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["dtype"] = self.dtype_name
        out["seq_lens"] = list(self.seq_lens)
        out["rotary_dim"] = self.rotary
        out["n_tokens"] = self.n_tokens
        out["moved_bytes"] = self.moved_bytes(inplace=bool(self.inplace))
        return out


def _llama(name: str, title: str, **changes) -> Case:
    """Llama-3-8B attention: 32 q heads, 8 kv heads, head_dim 128, bf16, (batch, seq, heads, head_dim)."""
    fields = dict(name=name, group="main", title=title, layout="bshd", batch=4, seqlen=4096, heads_q=32, heads_k=8,
                  head_dim=128, dtype=torch.bfloat16)
    fields.update(changes)
    return Case(**fields)


# Packed sequences of a varlen batch: 16384 tokens, the longest 4096 (a mix a packed training batch could hold).
VARLEN_SEQ_LENS = (4096, 3072, 2560, 2048, 1792, 1280, 1024, 512)

MAIN_CASES: tuple[Case, ...] = (
    _llama("llama3-8b-prefill", "Llama-3-8B prefill: b4 s4096, 32 q / 8 kv heads x 128, bf16, bshd", backward=True),
    _llama("small-prefill", "small prefill: b1 s512, 32 q / 8 kv heads x 128, bf16, bshd", batch=1, seqlen=512),
    _llama("decode", "decode: b64 s1, per-sequence offsets < 8192, 32 q / 8 kv heads x 128, bf16", batch=64,
           seqlen=1, positions="offsets"),
    Case("mha-fp16", "main", "MHA: b8 s2048, 64 heads x 128, fp16, bshd", "bshd", 8, 2048, 64, 64, 128,
         torch.float16, backward=True),
    Case("fp32", "main", "fp32: b2 s2048, 32 heads x 64 (MHA), bshd", "bshd", 2, 2048, 32, 32, 64, torch.float32,
         backward=True),
    _llama("gptj-interleaved", "GPT-J pairing (interleaved): Llama-3-8B prefill shape", interleaved=True),
    _llama("partial-rotary", "partial rotary 64 of 128, out of place (tail copied): Llama-3-8B prefill shape",
           rotary_dim=64, inplace=False),
    _llama("partial-rotary-inplace", "partial rotary 64 of 128, in place (tail untouched): Llama-3-8B prefill shape",
           rotary_dim=64, inplace=True),
    _llama("varlen", f"varlen packed batch (thd): {len(VARLEN_SEQ_LENS)} sequences, {sum(VARLEN_SEQ_LENS)} tokens, "
           "32 q / 8 kv heads x 128, bf16", layout="thd", batch=len(VARLEN_SEQ_LENS), seqlen=max(VARLEN_SEQ_LENS),
           seq_lens=VARLEN_SEQ_LENS),
)


# The cases whose rows are also divided by the launch-chain floor (``floor``): a decode call costs a dependent chain
# of one small launch more than it costs bytes, and the small prefill is a few of those chains' worth.
LAUNCH_FLOOR_CASES = ("small-prefill", "decode")


def sweep_cases(seqlens=SWEEP_SEQLENS, batches=SWEEP_BATCHES) -> tuple[Case, ...]:
    """The seed benchmark's grid: (seq, batch, 64 heads, 128) fp16, q and k both 64 heads.

    The seed rotated one tensor; here q and k (64 heads each) so that every peer, Liger included (it always takes
    both), does the same work. GB/s is the figure of merit either way.
    """
    return tuple(
        Case(f"sweep-b{b}-s{s}", "sweep", f"sweep: sbhd s{s} b{b}, 64 heads x 128, fp16", "sbhd", b, s, 64, 64, 128,
             torch.float16)
        for b in batches for s in seqlens)


def all_cases() -> tuple[Case, ...]:
    return MAIN_CASES + sweep_cases()


def select_cases(groups=("main",), names=None, cases=None) -> list[Case]:
    """Cases of the given groups, optionally only those whose name is in ``names`` (or starts with a name + '*')."""
    pool = list(all_cases() if cases is None else cases)
    chosen = [c for c in pool if c.group in groups]
    if names:
        wanted = list(names)
        unknown = [n for n in wanted if not any(_name_matches(c.name, n) for c in pool)]
        if unknown:
            raise ValueError(f"unknown case(s) {unknown}; known: {[c.name for c in MAIN_CASES]} and sweep-b*-s*")
        chosen = [c for c in pool if any(_name_matches(c.name, n) for n in wanted)]
    return chosen


def _name_matches(name: str, pattern: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern
