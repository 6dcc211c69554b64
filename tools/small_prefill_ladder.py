"""Where does the small prefill's L2 time go? A ladder of experimental kernels from Liger's structure to v4's.

The small prefill (b1 s512, 32 q / 8 kv heads x 128, bf16) is L2-resident and latency-bound; Liger reads ~2.9 µs
in graph replay and v4 ~3.0-3.05. Tiles (run19) and bf16 arithmetic (run21) did not explain the gap. This probe
starts from a kernel with Liger's structure (one program per token, every q and k head, bf16 per-token cos/sin rows,
in place, arithmetic in bf16, head counts as constants) and changes one thing per rung towards what v4 does
(float32 table indexed by position, fp32 arithmetic, out of place, runtime head counts), so that the rung where the
time moves names the cause. The experimental kernel lives here, not in the package: it is a measuring device.

    python tools/small_prefill_ladder.py            # on the GPU; prints a table, writes $OUT/small_prefill_ladder.json
    python tools/small_prefill_ladder.py --no-rungs --configs 2x16x8,flat2048x8   # v4 launch configs only

``--configs`` adds v4 launch configurations: ``SxHxW`` (tokens x heads a program, warps), ``fusedSxW`` (every head
of q and k for S tokens), ``flatNxW`` (the flat path: N elements a program). The JSON lists each label's
``LaunchConfig`` fields (``configs``), which ``tools/bench_table_override.py --best-of`` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import triton
import triton.language as tl

from ropekit import api
from ropekit.bench.cases import select_cases
from ropekit.bench.inputs import check_outputs, expected_output, make_data, make_tables
from ropekit.triton import v4
from ropekit.triton.v4 import LaunchConfig
from probe_host_l2 import builders, graph_calls_us  # tools/ is on sys.path when this file runs as a script

OUT = os.environ.get("OUT", ".")


@triton.jit
def _block(base, heads, n_heads, HALF: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Offsets of the first halves of a block of head vectors of one token, and which heads exist."""
    return base + heads[:, None] * HEAD_DIM + tl.arange(0, HALF)[None, :], (heads < n_heads)[:, None]


@triton.jit
def _rotate_store(OUT, offs, mask, x_a, x_b, cos, sin, HALF: tl.constexpr):
    out_ty = OUT.dtype.element_ty
    tl.store(OUT + offs, (x_a * cos - x_b * sin).to(out_ty), mask=mask)
    tl.store(OUT + offs + HALF, (x_b * cos + x_a * sin).to(out_ty), mask=mask)


@triton.jit
def _rotate_rows(X, OUT, base, heads, n_heads, cos, sin, HALF: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One pass over a block of heads: load, rotate, store (OUT may be X: in place)."""
    offs, mask = _block(base, heads, n_heads, HALF, HEAD_DIM)
    x_a = tl.load(X + offs, mask=mask, other=0.0).to(cos.dtype)
    x_b = tl.load(X + offs + HALF, mask=mask, other=0.0).to(cos.dtype)
    _rotate_store(OUT, offs, mask, x_a, x_b, cos, sin, HALF)


@triton.jit
def _rotate_two(X, OUT_X, base_x, heads_x, n_x, Y, OUT_Y, base_y, heads_y, n_y, cos, sin, HALF: tl.constexpr,
                HEAD_DIM: tl.constexpr):
    """One pass over a block of q's heads and one of k's, the four loads issued before any store."""
    offs_x, mask_x = _block(base_x, heads_x, n_x, HALF, HEAD_DIM)
    offs_y, mask_y = _block(base_y, heads_y, n_y, HALF, HEAD_DIM)
    x_a = tl.load(X + offs_x, mask=mask_x, other=0.0).to(cos.dtype)
    y_a = tl.load(Y + offs_y, mask=mask_y, other=0.0).to(cos.dtype)
    x_b = tl.load(X + offs_x + HALF, mask=mask_x, other=0.0).to(cos.dtype)
    y_b = tl.load(Y + offs_y + HALF, mask=mask_y, other=0.0).to(cos.dtype)
    _rotate_store(OUT_X, offs_x, mask_x, x_a, x_b, cos, sin, HALF)
    _rotate_store(OUT_Y, offs_y, mask_y, y_a, y_b, cos, sin, HALF)


@triton.jit
def ladder_kernel(Q, K, OQ, OK, COS, SIN, stride_q_token, stride_k_token, stride_cos_token, position_offset,
                  n_heads_q, n_heads_k,
                  HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, HEAD_DIM: tl.constexpr,
                  TABLE: tl.constexpr, FP32_MATH: tl.constexpr, RUNTIME_HEADS: tl.constexpr,
                  SCALAR_BASE: tl.constexpr, CHUNK: tl.constexpr, K_WITH_LAST: tl.constexpr = False,
                  SEQ_DIVISION: tl.constexpr = False, seqlen=1, SAME_POINTERS: tl.constexpr = False):
    """One program per token, every head of q then of k. SCALAR_BASE: the token's row start is added to the
    pointers once, in int64 (Liger's addressing), instead of to every element's offset. CHUNK: heads per pass
    (each pass loads, rotates and stores before the next loads; CHUNK >= HQ: one pass over all of q, k's loads
    issued with q's). K_WITH_LAST: k's loads are issued with q's last pass. (run33's three ladders ran an earlier
    copy of this file in which K_WITH_LAST's pass issued q's two loads before k's; the all-at-once order is kept.) SEQ_DIVISION: the cos/sin row is
    ``token % seqlen`` (a runtime integer division before the first load, as in a flat (batch x seq) grid).
    SAME_POINTERS (in place): stores go through the load pointers Q and K, as in Liger's kernel, so that the
    compiler can prove which loads a store does not alias (OQ/OK are ignored)."""
    if SAME_POINTERS:
        OQ = Q
        OK = K
    token = tl.program_id(0)
    pairs = tl.arange(0, HALF)
    s_local = token % seqlen if SEQ_DIVISION else token
    if TABLE:
        # float32 half-width table row at position s + offset (v4's tables)
        row = (s_local + position_offset) * stride_cos_token
    else:
        # per-token full-width rows in the model dtype (Liger's inputs): the first half holds every angle
        row = s_local * stride_cos_token
    cos = tl.load(COS + row + pairs)
    sin = tl.load(SIN + row + pairs)
    if FP32_MATH:
        cos = cos.to(tl.float32)[None, :]
        sin = sin.to(tl.float32)[None, :]
    else:
        cos = cos.to(Q.dtype.element_ty)[None, :]
        sin = sin.to(Q.dtype.element_ty)[None, :]
    n_q = n_heads_q if RUNTIME_HEADS else HQ
    n_k = n_heads_k if RUNTIME_HEADS else HK
    if SCALAR_BASE:
        token64 = token.to(tl.int64)
        Q, OQ = Q + token64 * stride_q_token, OQ + token64 * stride_q_token
        K, OK = K + token64 * stride_k_token, OK + token64 * stride_k_token
        base_q = 0
        base_k = 0
    else:
        base_q = token * stride_q_token
        base_k = token * stride_k_token
    if CHUNK >= HQ:
        _rotate_two(Q, OQ, base_q, tl.arange(0, HQ), n_q, K, OK, base_k, tl.arange(0, HK), n_k, cos, sin, HALF,
                    HEAD_DIM)
    elif K_WITH_LAST:
        for c in tl.static_range(HQ // CHUNK - 1):
            _rotate_rows(Q, OQ, base_q, c * CHUNK + tl.arange(0, CHUNK), n_q, cos, sin, HALF, HEAD_DIM)
        # the last pass of q and all of k together (HK <= CHUNK here)
        _rotate_two(Q, OQ, base_q, HQ - CHUNK + tl.arange(0, CHUNK), n_q, K, OK, base_k, tl.arange(0, HK), n_k,
                    cos, sin, HALF, HEAD_DIM)
    else:
        for c in tl.static_range(HQ // CHUNK):
            _rotate_rows(Q, OQ, base_q, c * CHUNK + tl.arange(0, CHUNK), n_q, cos, sin, HALF, HEAD_DIM)
        for c in tl.static_range(max(HK // CHUNK, 1)):
            _rotate_rows(K, OK, base_k, c * CHUNK + tl.arange(0, min(CHUNK, HK)), n_k, cos, sin, HALF,
                         HEAD_DIM)


RUNGS = {
    # name: (table, fp32 math, in place, runtime head counts, warps, scalar base, heads per pass, k with q's last
    # pass, cos/sin row through token % seqlen)
    # Liger's contract: per-token bf16 rows, bf16 arithmetic, in place
    "A0 liger-like": (False, False, True, False, 4, False, 32, False, False),
    "A2 scalar base, 16 heads a pass": (False, False, True, False, 4, True, 16, False, False),
    "A5 A2, k with q's last pass": (False, False, True, False, 4, True, 16, True, False),
    "A6 A2, row = token % seqlen": (False, False, True, False, 4, True, 16, False, True),
    "A7 A2, both": (False, False, True, False, 4, True, 16, True, True),
    # ropekit's contract: float32 table by position, fp32 arithmetic, out of place
    "B0 table, fp32, out of place": (True, True, False, False, 4, False, 32, False, False),
    "B2 + scalar base, 16 heads a pass": (True, True, False, False, 4, True, 16, False, False),
    "B5 B2, k with q's last pass": (True, True, False, False, 4, True, 16, True, False),
    "B6 B2, row = token % seqlen": (True, True, False, False, 4, True, 16, False, True),
    "B7 B2, both": (True, True, False, False, 4, True, 16, True, True),
    "B8 B2 in place, both": (True, True, True, False, 4, True, 16, True, True),
    # Liger's structure exactly (scalar base, every head in one pass), then ropekit's contract one item at a time
    "L0 scalar base, every head in one pass": (False, False, True, False, 4, True, 32, False, False),
    "L1 L0 + fp32 arithmetic": (False, True, True, False, 4, True, 32, False, False),
    "L2 L1 + float32 table by position": (True, True, True, False, 4, True, 32, False, False),
    "L3 L2 out of place": (True, True, False, False, 4, True, 32, False, False),
    "L0s L0, stores through the load pointers": (False, False, True, False, 4, True, 32, False, False, True),
    "L1s L1, stores through the load pointers": (False, True, True, False, 4, True, 32, False, False, True),
}

V4_CONFIGS = {
    "v4 default": None,
    "v4 1 token x 8 heads, 2 warps": LaunchConfig(1, 8, 2),
    "v4 2 tokens x 8 heads, 4 warps": LaunchConfig(2, 8, 4),
}


def parse_config(spec: str) -> tuple[str, LaunchConfig]:
    """``2x16x8`` / ``fused1x8`` / ``flat2048x8`` -> (label, LaunchConfig)."""
    if spec.startswith("fused"):
        block_s, warps = map(int, spec[5:].split("x"))
        return f"v4 fused {block_s} token(s), {warps} warps", LaunchConfig(block_s, 1, warps, fused_qk=True)
    if spec.startswith("flat"):
        block, warps = map(int, spec[4:].split("x"))
        # no streaming hint: the small prefill is L2-resident
        return f"v4 flat {block}/{warps}w", LaunchConfig(2, 16, 4, flat=block, flat_warps=warps, flat_streaming=False)
    block_s, block_h, warps = map(int, spec.split("x"))
    return f"v4 {block_s} token(s) x {block_h} heads, {warps} warps", LaunchConfig(block_s, block_h, warps)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-rungs", action="store_true", help="only v4's launch configs, Liger and ropekit")
    parser.add_argument("--rungs", default="", help="only the rungs whose names start with these prefixes (A,B,L)")
    parser.add_argument("--configs", default="", help="extra v4 launch configs, comma-separated (see above)")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    v4_configs = dict(V4_CONFIGS)
    v4_configs.update(parse_config(spec) for spec in options.configs.split(",") if spec)
    prefixes = tuple(options.rungs.split(",")) if options.rungs else ("",)
    rungs = {} if options.no_rungs else {name: rung for name, rung in RUNGS.items() if name.startswith(prefixes)}
    case = select_cases(names=["small-prefill"])[0]
    tables = make_tables(case, "cuda")
    data = make_data(case, "cuda", 3)
    n_tokens = case.batch * case.seqlen
    expected = [expected_output(case, tables, x) for x in (data.q, data.k)]
    half = case.head_dim // 2
    # Liger's inputs: per-token full-width rows in the model dtype, positions 0..S-1 (the offset is 0 here)
    rows_cos = torch.cat((tables.cos_half[:n_tokens],) * 2, -1).to(case.dtype).contiguous()
    rows_sin = torch.cat((tables.sin_half[:n_tokens],) * 2, -1).to(case.dtype).contiguous()
    fns, errors = {}, {}

    for name, (table, fp32_math, inplace, runtime_heads, warps, scalar_base, chunk, k_with_last, seq_division,
               *same_pointers) in rungs.items():
        q, k = data.q.clone(), data.k.clone()
        out_q, out_k = (q, k) if inplace else (torch.empty_like(q), torch.empty_like(k))
        cos, sin = (tables.cos_half, tables.sin_half) if table else (rows_cos, rows_sin)
        args = (q, k, out_q, out_k, cos, sin, q.stride(1), k.stride(1), cos.stride(0), 0, case.heads_q, case.heads_k)
        kw = dict(HQ=triton.next_power_of_2(case.heads_q), HK=triton.next_power_of_2(case.heads_k), HALF=half,
                  HEAD_DIM=case.head_dim, TABLE=table, FP32_MATH=fp32_math, RUNTIME_HEADS=runtime_heads,
                  SCALAR_BASE=scalar_base, CHUNK=chunk, K_WITH_LAST=k_with_last, SEQ_DIVISION=seq_division,
                  seqlen=case.seqlen, SAME_POINTERS=bool(same_pointers and same_pointers[0]), num_warps=warps)
        ladder_kernel[(n_tokens,)](*args, **kw)  # check once (in place: on a fresh copy)
        torch.cuda.synchronize()
        errors[name] = check_outputs(case, (out_q, out_k), expected)[0]
        fns[name] = lambda args=args, kw=kw: ladder_kernel[(n_tokens,)](*args, **kw)

    spec = api.resolve_positions(batch=case.batch, seqlen=case.seqlen, positions=tables.offsets)
    for name, config in v4_configs.items():
        out_q, out_k = torch.empty_like(data.q), torch.empty_like(data.k)
        fn = lambda out_q=out_q, out_k=out_k, config=config: v4.rope_v4(  # noqa: E731
            data.q, data.k, tables.cos_half, tables.sin_half, out_q=out_q, out_k=out_k, positions=spec,
            rotary_dim=case.rotary, config=config)
        fn()
        torch.cuda.synchronize()
        errors[name] = check_outputs(case, (out_q, out_k), expected)[0]
        fns[name] = fn
    try:  # Liger's own kernel on this probe's buffers (its inputs, in place): separates code from buffers
        from liger_kernel.ops.rope import _triton_rope
        q, k = data.q.clone(), data.k.clone()
        args = (q, q.stride(1), k, k.stride(1), rows_cos, rows_cos.stride(0), rows_sin, rows_sin.stride(0),
                case.seqlen, case.batch, 1, case.heads_q, case.heads_k, case.head_dim,
                triton.next_power_of_2(case.heads_q), triton.next_power_of_2(case.heads_k), case.head_dim,
                case.head_dim, case.head_dim)
        kw = dict(BLOCK_SIZE=triton.next_power_of_2(case.heads_q), BACKWARD_PASS=False)
        _triton_rope[(n_tokens,)](*args, **kw)
        torch.cuda.synchronize()
        errors["liger kernel, this probe's buffers"] = check_outputs(case, (q, k), expected)[0]
        fns["liger kernel, this probe's buffers"] = lambda args=args, kw=kw: _triton_rope[(n_tokens,)](*args, **kw)
    except ImportError as error:
        print("no Liger kernel:", error)
    make, _ = builders(case, {"liger", "ropekit"})
    for name in ("liger", "ropekit"):
        if name in make:
            fns[name] = make[name](5).fn

    samples = {name: [] for name in fns}
    for _ in range(options.rounds):  # interleaved rounds: drift over the run hits every row alike
        for name, fn in fns.items():
            samples[name].append(graph_calls_us([fn], 128))
    rows = {name: statistics.median(values) for name, values in samples.items()}
    liger = rows.get("liger")
    for name, us in rows.items():
        ratio = f"{us / liger:6.3f}x liger" if liger else ""
        error = f"  error {errors[name]:.2e}" if name in errors else ""
        spread = f"[{min(samples[name]):.2f}-{max(samples[name]):.2f}]"
        print(f"{name:45s} {us:6.2f} us {spread:13s} {ratio}{error}", flush=True)
    with open(os.path.join(OUT, "small_prefill_ladder.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "median_us": rows, "samples_us": samples,
                   "errors": errors, "configs": {name: config._asdict() for name, config in v4_configs.items()
                                                 if config is not None}}, f, indent=1)


if __name__ == "__main__":
    main()
