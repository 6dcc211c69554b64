"""Exercise 09_rope_cache_kernel: the launch of the reader's fused RoPE + paged-cache kernel and its check.

The check runs the kernel on small cases whose slots are shuffled over the cache and include -1 (padding). Every
output starts as a poison value, and the caches sit inside a larger buffer with guard rows on both sides, so that a
store for a -1 slot (the row before the cache) or past the end shows. The guard after a cache holds every row the
launch's head lanes can address (a slot's row taken ``BLOCK_H`` heads long), so a row-length mistake lands in it, at a
place the checker fixed, not beside whatever tensor the allocator placed after the cache. It then compares q, the written cache rows and
everything else against the float64 reference (:mod:`ropekit.reference`) and names the first mistake it recognises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ... import device as _device
from ... import reference
from ...frequencies import cos_sin_table
from .. import fence
from ..diagnose import Finding
from ..errors import explain

__all__ = ["PagedCase", "CASES", "launch_rope_cache", "check_rope_cache"]

POISON = -777.0
GUARD_SLOTS = 4  # poison rows before and after the cache inside its buffer
TABLE_ROWS = 64  # positions the cases' cos/sin tables hold


@dataclass(frozen=True)
class PagedCase:
    label: str
    positions: tuple  # one per token
    slots: tuple  # one per token; -1 skips
    heads_q: int
    heads_kv: int
    head_dim: int
    num_blocks: int
    block_size: int
    seed: int = 0


CASES = (
    PagedCase("5 tokens (one is padding, slot -1; the first and the last slot), 4 q / 2 kv heads of 16, "
              "6 blocks of 4 slots",
              positions=(3, 17, 0, 9, 30), slots=(13, 0, -1, 23, 6), heads_q=4, heads_kv=2, head_dim=16,
              num_blocks=6, block_size=4),
    PagedCase("7 tokens, 3 q / 1 kv head of 8 (a padded head block), 3 blocks of 8 slots",
              positions=(0, 1, 2, 40, 41, 5, 63), slots=(16, 17, 18, 3, 4, -1, 23), heads_q=3, heads_kv=1,
              head_dim=8, num_blocks=3, block_size=8, seed=1),
)


def launch_rope_cache(kernel, q, k, v, cos, sin, positions, slots, q_out, k_cache, v_cache) -> None:
    """One program per token."""
    tokens, heads_q, head_dim = q.shape
    heads_kv = k.shape[1]
    block_h = triton.next_power_of_2(max(heads_q, heads_kv))
    kernel[(tokens,)](q, k, v, cos, sin, positions, slots, q_out, k_cache, v_cache, heads_q, heads_kv,
                      HEAD_DIM=head_dim, BLOCK_H=block_h)


def _guard_rows_after(case: PagedCase) -> int:
    """Poison rows after a cache: :data:`GUARD_SLOTS`, plus what it takes for slot rows ``BLOCK_H`` heads long (the
    most heads the launch's lanes address) to end inside the buffer."""
    n_slots = case.num_blocks * case.block_size
    block_h = triton.next_power_of_2(max(case.heads_q, case.heads_kv))
    return GUARD_SLOTS + -(-n_slots * block_h // case.heads_kv) - n_slots


def _run(kernel, case: PagedCase, device):
    g = torch.Generator().manual_seed(case.seed)
    t = len(case.positions)
    q, k, v = (torch.randn(t, h, case.head_dim, generator=g).to(device) for h in (case.heads_q, case.heads_kv,
                                                                                  case.heads_kv))
    cos, sin = cos_sin_table(TABLE_ROWS, case.head_dim, device=device)
    positions = torch.tensor(case.positions, device=device)
    slots = torch.tensor(case.slots, device=device)
    n_slots = case.num_blocks * case.block_size
    buffers = [torch.full((GUARD_SLOTS + n_slots + _guard_rows_after(case), case.heads_kv, case.head_dim), POISON,
                          device=device) for _ in range(2)]
    k_cache, v_cache = (b[GUARD_SLOTS:GUARD_SLOTS + n_slots].view(case.num_blocks, case.block_size, case.heads_kv,
                                                                  case.head_dim) for b in buffers)
    q_out = torch.full_like(q, POISON)
    launch_rope_cache(kernel, q, k, v, cos, sin, positions, slots, q_out, k_cache, v_cache)
    def rope(x, shift=0, sign=1, at=None, interleaved=False):
        rows = positions.cpu() + shift if at is None else at
        return reference.rope_table(x, cos, sign * sin, rows, interleaved=interleaved)
    return dict(q=q, k=k, v=v, rope=rope, q_out=q_out.cpu().double(), buffers=[b.cpu().double() for b in buffers])


def _finding(case: PagedCase, r) -> Finding:
    q_ref = r["rope"](r["q"])
    if (r["q_out"] == POISON).all() and all((b == POISON).all() for b in r["buffers"]):
        return Finding("not_solved", "Not yet solved: your kernel wrote nothing (Q_OUT and both caches still hold "
                                     "the poison value).")
    close = lambda a, b: bool(torch.allclose(a, b, rtol=1e-5, atol=1e-5))  # noqa: E731
    if not close(r["q_out"], q_ref):
        if close(r["q_out"], r["rope"](r["q"], sign=-1)):
            return Finding("wrong_direction", "q turned by -θ: the rotation is a' = a cos - b sin, "
                                              "b' = b cos + a sin.")
        for shift in (1, -1):
            if close(r["q_out"], r["rope"](r["q"], shift=shift)):
                return Finding("position_shift", f"q rotated at position POS[token] {shift:+d}: the cos/sin row of "
                                                 "a token is row POS[token] of the tables.")
        if (r["q_out"] == POISON).any():
            return Finding("unwritten", "Some of Q_OUT was never written: every query head of every token.")
        positions = torch.tensor(case.positions)
        if close(r["q_out"], r["rope"](r["q"], at=torch.arange(len(case.positions)))):
            return Finding("wrong_positions", "q rotated at the token's index, not its position: a token's cos/sin "
                                              "row is row POS[token] of the tables (load the position first).")
        if 2 * max(case.positions) < TABLE_ROWS and close(r["q_out"], r["rope"](r["q"], at=2 * positions)):
            return Finding("wrong_positions", "q rotated at position 2·POS[token]: a table row holds HEAD_DIM // 2 "
                                              "values, so row p starts at p * (HEAD_DIM // 2), not p * HEAD_DIM.")
        if close(r["q_out"], r["rope"](r["q"], interleaved=True)):
            return Finding("other_pairing", "q rotated in GPT-J pairs (2i, 2i + 1); this exercise uses NeoX pairs "
                                            "(i, i + HEAD_DIM // 2): the first half of a head against its second.")
        return Finding("wrong", "The rotated q differs from the reference.")
    wanted = {"k_cache": r["rope"](r["k"]), "v_cache": r["v"].cpu().double()}
    errors = [float((r["q_out"] - q_ref).abs().max())]
    slots = list(case.slots)
    for (name, ref), buffer in zip(wanted.items(), r["buffers"]):
        expect = torch.full_like(buffer, POISON)
        for token, slot in enumerate(slots):
            if slot >= 0:
                expect[GUARD_SLOTS + slot] = ref[token]
        inside = slice(GUARD_SLOTS, GUARD_SLOTS + case.num_blocks * case.block_size)
        if (buffer[:GUARD_SLOTS] != POISON).any():
            return Finding("out_of_bounds", f"{name}: a row before the cache was written. A token with slot -1 "
                                            "is padding: it writes nothing (put the cache stores inside `if slot >= 0:`).")
        if (buffer[inside.stop:] != POISON).any():
            return Finding("out_of_bounds", f"{name}: a row past the end of the cache was written (the last slot "
                                            "is a token's). Only k's n_heads_kv heads exist: mask the head lanes "
                                            "with heads < n_heads_kv; and a slot's row is n_heads_kv · HEAD_DIM "
                                            "elements: start slot s's row at s * n_heads_kv * HEAD_DIM.")
        if close(buffer, expect):
            errors.append(float((buffer[inside] - expect[inside]).abs().max()))
            continue
        real = [t for t, slot in enumerate(slots) if slot >= 0]
        if close(buffer[GUARD_SLOTS:][real], ref[real]):
            return Finding("wrong", f"{name}: token t was written to row t; it belongs at slot SLOTS[t] (block "
                                    "SLOTS[t] // block_size, row SLOTS[t] % block_size).")
        written = [GUARD_SLOTS + s for s in slots if s >= 0]
        stray = [row - GUARD_SLOTS for row in range(inside.start, inside.stop)
                 if row not in written and bool((buffer[row] != POISON).any())]
        if stray:
            own = ("The tokens' own rows are right. " if close(buffer[written], ref[real]) else "")
            return Finding("stray_rows", (
                f"{name}: slot rows {stray[:6]} belong to no token, yet were written. {own}A slot's row of the "
                "cache starts at slot * n_heads_kv * HEAD_DIM (the cache is (num_blocks, block_size, n_heads_kv, "
                "HEAD_DIM), contiguous), and only k's n_heads_kv heads exist: mask the head lanes with "
                "heads < n_heads_kv, not with the block's width."))
        if (buffer[written] == POISON).any():
            return Finding("unwritten", f"{name}: some elements of the tokens' slot rows were never written "
                                        "(every head, both halves).")
        if name == "v_cache" and close(buffer[written], r["rope"](r["v"])[real]):
            return Finding("wrong", "v_cache: v was rotated. Values are copied into the cache unchanged; only q "
                                    "and k turn.")
        if name == "v_cache":
            for turned, k_values in (("unrotated", r["k"].cpu().double()), ("rotated", r["rope"](r["k"]))):
                if close(buffer[written], k_values[real]):
                    return Finding("wrong", f"v_cache holds k ({turned}), not v: the value rows were loaded from K. "
                                            "Load v's row from V (V + token * n_heads_kv * HEAD_DIM) and store it "
                                            "unchanged into V_CACHE.")
        if name == "k_cache" and close(buffer[written], r["k"].cpu().double()[real]):
            return Finding("wrong", "k_cache: k was copied unrotated. The cache keeps rotated keys: rotate k with "
                                    "the token's cos/sin row, like q, before the store.")
        return Finding("wrong", f"{name}: the rows at the tokens' slots differ from the reference"
                                + (" (k must be rotated like q)." if name == "k_cache" else "."))
    error = max(errors)
    return Finding("correct", f"Correct on {case.label}: max |error| {error:.3g}.", error)


def _cache_row_hint(error: BaseException, finding: Finding) -> Finding:
    """A store stopped outside every tensor (under the interpreter) most often comes from a slot's row start: say how
    long a row of the cache is. A row up to ``BLOCK_H`` heads long lands in the cache's own guard (:func:`_run`), so
    what gets here went further, and the nearest tensor is whichever the allocator placed there: only a store nearest
    Q_OUT, the one output that is no cache, goes without the hint."""
    stopped = fence.stopped(error)
    if stopped is None or stopped.kind != "store" or "q_out" in stopped.where.lower():
        return finding
    return Finding(finding.diagnosis, (
        f"{finding.message} In the caches, a slot's row is n_heads_kv · HEAD_DIM elements (the cache is (num_blocks, "
        "block_size, n_heads_kv, HEAD_DIM), contiguous): slot s starts at s * n_heads_kv * HEAD_DIM, not at "
        "s * n_heads_q * HEAD_DIM, and only the n_heads_kv head lanes are stored."), finding.max_error)


def check_rope_cache(kernel) -> Finding:
    """The checker's ``check`` hook: every case must pass; the first failing case's finding otherwise."""
    findings = []
    for case in CASES:
        try:
            result = _run(kernel, case, _device.DEVICE)
        except Exception as error:  # noqa: BLE001  (whatever the reader's kernel raises is reported)
            finding = _cache_row_hint(error, explain(error))
        else:
            finding = _finding(case, result)
        if finding.diagnosis != "correct":
            return Finding(finding.diagnosis, f"{finding.message}\n(case: {case.label})", finding.max_error)
        findings.append(finding)
    error = max(f.max_error for f in findings)
    return Finding("correct", f"Correct on all {len(CASES)} cases (slots shuffled over the blocks, -1 skipped); max "
                              f"|error| vs the float64 reference: {error:.3g} in float32.", error)
