"""Launch choices: the performance model, its candidates, shape buckets, and the autotune with its disk cache.

The GPUs are described by their published specifications (NVIDIA's data sheets): the H100 SXM has 132 SMs, a 50 MB
L2 and 3.35 TB/s of HBM3; the H200 has 132 SMs, the same L2 and 4.8 TB/s of HBM3e. The latency is the model's assumed
600 ns. The small GPU is invented: 20 SMs, a 4 MB L2, 400 GB/s.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ropekit
from ropekit.triton import choice, model
from ropekit.triton.configs import FlatConfig, FusedConfig, FusedShape, RopeShape, TileConfig
from ropekit.triton.fused_tiles import E4M3, INT8, NVFP4, PER_BLOCK, PER_TOKEN_HEAD

H100 = model.DeviceFacts("H100 SXM (published)", n_sms=132, ceiling_gbps=3350.0, latency_ns=600.0,
                         latency_source="assumed", l2_bytes=50 * 2**20)
H200 = model.DeviceFacts("H200 (published)", n_sms=132, ceiling_gbps=4800.0, latency_ns=600.0,
                         latency_source="assumed", l2_bytes=50 * 2**20)
SMALL = model.DeviceFacts("a small GPU", n_sms=20, ceiling_gbps=400.0, latency_ns=600.0, latency_source="assumed",
                          l2_bytes=4 * 2**20, capability=(8, 6), max_warps_per_sm=48, max_programs_per_sm=16,
                          shared_bytes_per_program=99 * 1024)
GPUS = {"h100": H100, "h200": H200, "small": SMALL}
# each GPU with its kernels launched plainly (ROPEKIT_PDL=0, or before compute capability 9.0)
PLAIN = {facts: dataclasses.replace(facts, programmatic_launch=False) for facts in GPUS.values()}


def rope(batch, seq, heads_q, heads_k, head_dim, element_size=2, flat_ok=True, cos_per_token=False):
    return RopeShape(batch * seq, heads_q, heads_k, head_dim, head_dim, element_size, cos_per_token, flat_ok,
                     same_shape=heads_q == heads_k)


# The benchmark's shapes, and what the H100 launch table (measured: docs/tuning.md#launch-table) chose for each.
TABLE = {
    "llama3-8b-prefill": (rope(4, 4096, 32, 8, 128), FlatConfig(2048, 8)),
    "llama3-8b-prefill-in-place": (rope(4, 4096, 32, 8, 128, flat_ok=False),
                                   TileConfig(2, 32, 16, fused_qk=True, evict_first=True)),
    "mha-fp16": (rope(8, 2048, 64, 64, 128), FlatConfig(2048, 8)),
    "mha-fp16-in-place": (rope(8, 2048, 64, 64, 128, flat_ok=False),
                          TileConfig(2, 64, 32, fused_qk=True, evict_first=True)),
    "fp32": (rope(2, 2048, 32, 32, 64, 4), FlatConfig(512, 8, paired=True)),
    "fp32-in-place": (rope(2, 2048, 32, 32, 64, 4, flat_ok=False),
                      TileConfig(2, 32, 32, fused_qk=True, evict_first=True)),
    "llama3-8b-fp32": (rope(4, 4096, 32, 8, 128, 4), FlatConfig(1024, 8)),
    "small-prefill": (rope(1, 512, 32, 8, 128), TileConfig(2, 16, 4)),
    "small-prefill-cos-per-token": (rope(1, 512, 32, 8, 128, cos_per_token=True), TileConfig(1, 32, 4)),
    "decode": (rope(64, 1, 32, 8, 128), TileConfig(1, 8, 4)),
}
# Where the model and the table differ, the measurements were within the run-to-run spread on the H100
# (docs/tuning.md): the flat kernel's 4 warps against the table's 8 (0.2-0.4 % on the H100; 4 warps 2.1-2.3 % faster on
# the H200), and fp32's pairing. In place, the model's streaming tile replaced the table's fused q+k tile: 2.7-3.1 %
# faster on the H200, not measured on the H100 (docs/tuning.md#launch-table); the fused tile stays among the
# candidates (the sanitizer and the tune tool run them; the autotune times only calls the flat kernel can take).
MODEL_DIFFERS = {"fp32", "llama3-8b-prefill", "mha-fp16", "llama3-8b-fp32", "llama3-8b-prefill-in-place",
                 "mha-fp16-in-place", "fp32-in-place"}

FUSED_TABLE = {  # ropekit's fused launch table on the H100 (docs/tuning.md#fused-launch-table)
    "decode": (FusedShape(64, 32, 128, 2), FusedConfig(1, 8, 4)),
    "decode-fp8": (FusedShape(64, 32, 128, 2, cache_format=E4M3), FusedConfig(1, 4, 4)),
    "decode-norm": (FusedShape(64, 32, 128, 2, norm=True), FusedConfig(1, 8, 4)),
    "mla-decode": (FusedShape(64, 128, 576, 2), FusedConfig(1, 32, 4)),
    "prefill": (FusedShape(16384, 32, 128, 2), FusedConfig(2, 8, 4, True, True)),
    "prefill-norm": (FusedShape(16384, 32, 128, 2, norm=True), FusedConfig(4, 8, 4, True, True)),
    "prefill-fp8": (FusedShape(16384, 32, 128, 2, cache_format=E4M3), FusedConfig(2, 8, 4, True, True)),
    "prefill-wide": (FusedShape(16384, 16, 192, 2), FusedConfig(2, 8, 8)),
    # MLA: q's heads of 64 channels, v's latent row of 512 in the k programs: the tile of a prefill that streams q's
    # heads, not the wide rule (2 x 8 at 8 warps without the streaming hint measured 223.7 us on the H200, this
    # tile's neighbours 140-143 us)
    "mla-prefill": (FusedShape(16384, 128, 512, 2, head_dim=64), FusedConfig(2, 8, 4, True, True)),
    # a store with per-head arithmetic: 16 heads a program; where only the cache's scales are reduced, a scale per
    # (token, head) with v's heads in programs of their own (measured on the H200; with a norm or a float8 q,
    # v apart measured slower), NVFP4, whose k programs keep v's, 32 (measured on the H100 and the H200)
    "prefill-int8-token-head": (FusedShape(16384, 32, 128, 2, cache_format=INT8, cache_scales=PER_TOKEN_HEAD),
                                FusedConfig(2, 16, 4, True, True, v_apart=True)),
    "prefill-int8-token-head-norm": (FusedShape(16384, 32, 128, 2, norm=True, cache_format=INT8,
                                                cache_scales=PER_TOKEN_HEAD), FusedConfig(2, 16, 4, True, True)),
    "prefill-fp8-q": (FusedShape(16384, 32, 128, 2, cache_format=E4M3, q_format=E4M3), FusedConfig(2, 16, 4, True, True)),
    "prefill-int8-token-head-fp8-q": (FusedShape(16384, 32, 128, 2, cache_format=INT8, cache_scales=PER_TOKEN_HEAD,
                                                 q_format=E4M3), FusedConfig(2, 16, 4, True, True)),
    "prefill-nvfp4": (FusedShape(16384, 32, 128, 2, cache_format=NVFP4, cache_scales=PER_BLOCK),
                      FusedConfig(2, 32, 4, True, True)),
    # a norm over all heads (OLMo-2): 1 token x every head at 4 warps, the fastest of the tiles measured on the H100
    # and the H200
    "prefill-norm-all-heads": (FusedShape(16384, 32, 128, 2, norm=True, norm_over_heads=True),
                               FusedConfig(1, 32, 4, True, True)),
    # ... which keeps v in the k programs with a scale per (token, head) too, as any norm does
    "prefill-norm-all-heads-int8-token-head": (FusedShape(16384, 32, 128, 2, norm=True, norm_over_heads=True,
                                                          cache_format=INT8, cache_scales=PER_TOKEN_HEAD),
                                               FusedConfig(1, 32, 4, True, True)),
    # the backward: 16 heads of 128 bf16 channels a step give a thread 16 bytes of each half (16-byte copies)
    "backward": (FusedShape(16384, 32, 128, 2, norm=True, backward=True), FusedConfig(1, 16, 4, True, True, 16, 4)),
}

SHAPES = {**{name: shape for name, (shape, _) in TABLE.items()},
          "gptj-few-heads": rope(2, 300, 4, 4, 64, flat_ok=False),
          "one-head-huge-dim": rope(1, 8192, 1, 0, 512, 4),
          "many-heads-no-fused-tile": rope(2, 4096, 128, 128, 256, flat_ok=False),
          "fp64": rope(1, 2048, 8, 8, 64, 8),
          "fp64-long": rope(1, 65536, 8, 8, 64, 8),
          # past the L2 and not flat: the streaming tile's bounds (16 tokens, 32 heads; a head wider than 8 vectors
          # a thread takes the fused q+k tile's rule)
          "one-narrow-head-long": rope(1, 1 << 20, 1, 1, 32, flat_ok=False),
          "many-narrow-heads-long": rope(4, 65536, 128, 128, 16, flat_ok=False),
          "wide-heads-long": rope(1, 65536, 2, 2, 16384, flat_ok=False)}
FUSED_SHAPES = {**{name: shape for name, (shape, _) in FUSED_TABLE.items()},
                "decode-very-wide": FusedShape(8, 64, 2304, 2),
                "prefill-very-wide": FusedShape(4096, 16, 4096, 4),
                # a norm over all 128 heads of float32: shared memory bounds the backward's pipeline to two stages
                "backward-all-128-heads-fp32": FusedShape(4096, 128, 128, 4, norm=True, backward=True,
                                                          norm_over_heads=True)}


# --------------------------------------------------------------------------------------------------------------------
# The model.
# --------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", [c for c in TABLE if c not in MODEL_DIFFERS])
def test_with_h100_facts_the_model_picks_what_the_h100_table_measured_best(case):
    shape, table = TABLE[case]
    assert model.model_rope(H100, shape) == table


@pytest.mark.parametrize("gpu", ["h100", "h200"])
@pytest.mark.parametrize("case", list(TABLE))
def test_the_h100_tables_choice_is_among_the_candidates(case, gpu):
    shape, table = TABLE[case]
    assert table in model.rope_candidates(GPUS[gpu], shape)


@pytest.mark.parametrize("case", list(FUSED_TABLE))
def test_with_h100_facts_the_fused_model_picks_the_fused_table(case):
    """The table was measured with plain launches: its decode rows are the plain launch's rule."""
    shape, table = FUSED_TABLE[case]
    assert model.model_fused(PLAIN[H100], shape) == table
    assert table in model.fused_candidates(PLAIN[H200], shape)


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("case", ["decode", "decode-fp8", "decode-norm", "mla-decode", "decode-int8-token-head",
                                  "decode-nvfp4", "decode-fp8-q", "decode-wide"])
def test_a_decode_step_launched_programmatically_takes_every_head_of_a_token(gpu, case):
    """Launched programmatically (compute capability 9.0 and later), a decode step's program holds every head of its
    token, up to 32, at 4 warps: on the H200 every head beat fewer heads a program on every decode format at 64
    tokens (plain decode b64 1.44 us at 8 heads, 1.36 at 32; float8 per (token, head) 2.28 at 4 heads, 1.88).
    Launched plainly, and for vectors wider than 128 channels (MLA's latent), the table's rule. Where the cache's
    scales are reduced (per (token, head), NVFP4), v's heads then get programs of their own (on the H200: int8 per
    (token, head) 1.78 -> 1.50 us, NVFP4 2.04 -> 1.83; seven of the nine other decode formats 1.05-1.16x slower with
    them)."""
    formats = {"decode-int8-token-head": dict(cache_format=INT8, cache_scales=PER_TOKEN_HEAD),
               "decode-nvfp4": dict(cache_format=NVFP4, cache_scales=PER_BLOCK),
               "decode-fp8-q": dict(cache_format=E4M3, q_format=E4M3)}
    shape = (FUSED_TABLE[case][0] if case in FUSED_TABLE else FusedShape(64, 16, 192, 2) if case == "decode-wide"
             else FusedShape(64, 32, 128, 2, **formats[case]))
    facts = GPUS[gpu]
    config = model.model_fused(facts, shape)
    plain = model.model_fused(PLAIN[facts], shape)
    if model.launched_programmatically(facts) and shape.width <= 128:
        assert config == FusedConfig(1, 32, 4, v_apart=shape.reduces_scales) and plain.block_h <= 8
        assert not plain.v_apart
    else:
        assert config == plain and config.block_h <= (32 if shape.width > 128 else 8)
    assert config in model.fused_candidates(facts, shape)


@pytest.mark.parametrize("tokens", [1, 4, 16, 32])
def test_a_small_decode_keeps_spreading_its_heads_over_the_gpu(tokens):
    """Every head of a token a program is taken only where a program a token's q heads and one its k heads give at
    least half the SMs a program (measured at 64 tokens): fewer tokens keep the plain rule, which halves the heads a
    program until the grid gives each SM two programs."""
    shape = FusedShape(tokens, 32, 128, 2)
    config = model.model_fused(H200, shape)
    assert config == model.model_fused(PLAIN[H200], shape)
    assert config.block_h < 32
    assert model.model_fused(H200, shape._replace(n_tokens=64)).block_h == 32


def test_pdl_off_makes_the_facts_say_kernels_are_launched_plainly(monkeypatch):
    """``ROPEKIT_PDL=0`` launches plainly, and the device's facts say so, so that the decode rule follows the launch."""
    monkeypatch.setitem(choice._facts, 0, H200)
    cuda0 = torch.device("cuda", 0)
    monkeypatch.delenv("ROPEKIT_PDL", raising=False)
    assert choice.device_facts(cuda0) is H200 and model.launched_programmatically(H200)
    monkeypatch.setenv("ROPEKIT_PDL", "0")
    facts = choice.device_facts(cuda0)
    assert not model.launched_programmatically(facts)
    assert model.model_fused(facts, FUSED_TABLE["decode"][0]) == FUSED_TABLE["decode"][1]


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("kind", ["decode", "prefill", "backward"])
@pytest.mark.parametrize("heads, element_size, warps", [(32, 2, 4), (16, 2, 4), (128, 2, 16), (128, 4, 16)])
def test_a_norm_over_all_heads_takes_one_token_at_32_values_a_thread(gpu, kind, heads, element_size, warps):
    """Every head of a token in one program, one token, 32 values a thread (at least 4 warps): the norm's reductions
    cross fewer warps. OLMo-2-7B's backward (32 heads x 128) on the H200: 16 warps 372 us, 4 warps 216 us."""
    tokens = 64 if kind == "decode" else 16384
    shape = FusedShape(tokens, heads, 128, element_size, norm=True, norm_over_heads=True, backward=kind == "backward")
    config = model.model_fused(GPUS[gpu], shape)
    assert (config.block_s, config.block_h, config.num_warps) == (1, heads, warps)
    assert model.is_valid_fused(config, shape) and config in model.fused_candidates(GPUS[gpu], shape)


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("heads, width, element_size", [(8, 128, 2), (32, 128, 2), (32, 128, 4), (32, 64, 2),
                                                        (128, 128, 2), (128, 128, 4), (4, 512, 2)])
def test_the_backward_copies_16_bytes_a_thread_and_walks_four_stages_within_the_gpus_shared_memory(
        gpu, heads, width, element_size):
    """A backward step gives each thread 16 bytes of each half of its head vectors where the call has the heads
    (fewer heads: all of them, and fewer bytes; a norm over all heads takes every head, whatever that gives), and
    walks four stages deep, as deep as the GPU's shared memory a program allows, up to that
    (docs/tuning.md#fused-launch-table)."""
    facts = GPUS[gpu]
    for over_heads in (False, True):
        shape = FusedShape(16384, heads, width, element_size, norm=True, backward=True, norm_over_heads=over_heads)
        config = model.model_fused(facts, shape)
        assert config.token_blocks == 16 and config in model.fused_candidate_space(shape)
        threads = 32 * config.num_warps
        half_bytes = config.block_s * config.block_h * width // 2 * element_size // threads  # a thread's, a half
        assert half_bytes >= 16 or config.block_h == heads
        assert over_heads or half_bytes <= 16

        def held(stages):  # the pipeline's copies: stages - 1 token blocks of the input and the gradient
            return (stages - 1) * 2 * config.block_s * config.block_h * width * element_size
        room = facts.shared_bytes_per_program - 8 * 1024
        assert config.stages <= 4 and (config.stages == 1 or held(config.stages) <= room)
        assert config.stages == 4 or held(config.stages + 1) > room


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("case", list(TABLE))
def test_the_flat_kernel_runs_only_where_the_call_allows_it_and_only_beyond_the_l2(case, gpu):
    shape, _ = TABLE[case]
    facts = GPUS[gpu]
    chosen = model.model_rope(facts, shape)
    assert isinstance(chosen, FlatConfig) == (shape.flat_ok and not model.fits_in_l2(facts, shape))
    assert not isinstance(model.model_rope(facts, shape._replace(flat_ok=False)), FlatConfig)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
@pytest.mark.parametrize("case, block_s, block_h", [("llama3-8b-prefill-in-place", 1, 8), ("mha-fp16-in-place", 1, 8),
                                                    ("fp32-in-place", 1, 8), ("fp64-long", 1, 4),
                                                    ("many-heads-no-fused-tile", 1, 4)])
def test_past_the_l2_a_whole_head_rotation_the_flat_kernel_cannot_run_takes_the_streaming_tile(case, block_s, block_h,
                                                                                               gpu):
    """2 KiB a program (one 16-byte vector a thread at 4 warps), heads of one token first, the hint, head blocks
    inner; a partial rotation, a packed batch and angles computed in the kernel keep the fused q+k tile
    (docs/tuning.md#launch-table)."""
    facts = GPUS[gpu]
    shape = SHAPES[case]._replace(flat_ok=False)
    assert not model.fits_in_l2(facts, shape)
    assert model.model_rope(facts, shape) == TileConfig(block_s, block_h, 4, evict_first=True, heads_inner=True)
    wide = SHAPES["wide-heads-long"]  # 32 KiB a head: more than 8 vectors a thread at 4 warps
    assert not model.model_rope(facts, wide).heads_inner
    for other in (shape._replace(rotary_dim=shape.head_dim // 2), shape._replace(varlen=True),
                  shape._replace(computed_angles=True)):
        chosen = model.model_rope(facts, other)
        assert not chosen.heads_inner and (chosen.fused_qk or chosen.block_h == 1)
    # where the resident programs would keep too little in flight, the tile grows
    slow_latency = dataclasses.replace(facts, latency_ns=facts.latency_ns * 4)
    grown = model.model_rope(slow_latency, shape)
    assert grown.block_s * grown.block_h > block_s * block_h
    assert grown in model.rope_candidate_space(shape)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
@pytest.mark.parametrize("case", ["llama3-8b-prefill", "mha-fp16", "llama3-8b-fp32"])
def test_the_flat_kernel_runs_programs_of_four_warps_one_vector_a_thread(case, gpu):
    shape, table = TABLE[case]
    chosen = model.model_rope(GPUS[gpu], shape)
    assert chosen == FlatConfig(32 * 4 * 16 // shape.element_size, 4)
    assert table in model.rope_candidates(GPUS[gpu], shape)  # the H100 table's 8 warps stay a candidate


def test_a_gpu_with_a_smaller_l2_streams_sooner():
    small_prefill = TABLE["small-prefill"][0]  # 10.5 MB moved: in the H100's L2, not in a 4 MB one
    assert isinstance(model.model_rope(H100, small_prefill), TileConfig)
    assert isinstance(model.model_rope(SMALL, small_prefill), FlatConfig)


def test_the_flat_block_grows_with_the_bytes_in_flight_littles_law_asks():
    shape = TABLE["llama3-8b-prefill"][0]
    blocks = [model.model_rope(dataclasses.replace(H100, ceiling_gbps=gbps), shape).block
              for gbps in (3350.0, 20_000.0, 80_000.0)]
    assert blocks[0] == 1024 and blocks[0] < blocks[1] < blocks[2]


def test_fewer_sms_take_more_heads_a_program_so_that_a_decode_step_still_fills_the_gpu():
    decode = TABLE["decode"][0]
    h100, small = model.model_rope(H100, decode), model.model_rope(SMALL, decode)
    assert (h100.block_s, h100.block_h) == (1, 8)  # 320 programs on 132 SMs
    assert (small.block_s, small.block_h) == (2, 16)  # 96 programs on 20 SMs


def test_the_predicted_fraction_of_the_ceiling_follows_littles_law():
    needed = H100.needed_bytes_in_flight_per_sm  # 3350 / 132 x 600 bytes
    assert needed == pytest.approx(3350 / 132 * 600)
    launch = model.Launch(programs=10**6, num_warps=8, bytes_in_flight_per_program=1024)
    assert model.resident_programs(launch, H100) == 8
    assert model.predicted_pct(launch, H100) == pytest.approx(100 * 8 * 1024 / needed)


# --------------------------------------------------------------------------------------------------------------------
# Candidates.
# --------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("case", list(SHAPES))
def test_rope_candidates_are_few_valid_and_start_with_the_models_choice(case, gpu):
    shape, facts = SHAPES[case], GPUS[gpu]
    candidates = model.rope_candidates(facts, shape)
    space = model.rope_candidate_space(shape)
    assert 1 <= len(candidates) <= 8 and len(set(candidates)) == len(candidates)
    assert candidates[0] == model.model_rope(facts, shape)
    for config in candidates:
        assert config in space and model.is_valid_rope(config, shape)


@pytest.mark.parametrize("case", list(SHAPES))
def test_every_configuration_of_the_candidate_space_is_one_the_kernels_accept(case):
    shape = SHAPES[case]
    for config in model.rope_candidate_space(shape):
        assert config.num_warps in (1, 2, 4, 8, 16, 32)
        if isinstance(config, FlatConfig):
            assert shape.flat_ok
            assert config.block & (config.block - 1) == 0 and config.block % (32 * config.num_warps) == 0
            assert not config.paired or shape.same_shape
        else:
            assert config.block_s & (config.block_s - 1) == 0 and config.block_h & (config.block_h - 1) == 0
            heads = config.block_h * (2 if config.fused_qk else 1)
            assert config.block_s * heads * shape.head_dim <= 2 * 32768  # the register bound (padded heads aside)


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("case", list(FUSED_SHAPES))
def test_fused_candidates_are_few_valid_and_start_with_the_models_choice(case, gpu):
    shape, facts = FUSED_SHAPES[case], GPUS[gpu]
    candidates = model.fused_candidates(facts, shape)
    assert 1 <= len(candidates) <= 8 and candidates[0] == model.model_fused(facts, shape)
    space = model.fused_candidate_space(shape)
    for config in candidates:
        assert config in space
    for config in space:
        assert model.is_valid_fused(config, shape) and config.num_warps in model.WARPS
        assert config.block_h <= 1 << (shape.n_heads - 1).bit_length()
        assert shape.backward or (config.token_blocks, config.stages) == (1, 1)
    # where the cache's scales are reduced, the autotune may also take the model's tile with v's programs apart or not
    apart = {config.v_apart for config in candidates if config[:5] == candidates[0][:5]}
    assert apart == ({False, True} if shape.reduces_scales and not shape.backward else {False})


# A float8 store's prefill tile (2 tokens x 8 heads of 128 bf16 channels, 4 warps) at 72 registers a thread, as Triton
# 3.6 compiles it for sm_90: 7 programs an SM, each with 4 KiB of q loaded over two round trips, 14336 bytes in flight
# on average. Little's law asks 2950 / 132 x 600 = 13409 bytes of the H100's measured copy bandwidth, 4200 / 132 x 600
# = 19091 of the H200's.
FP8_PREFILL = FusedShape(16384, 32, 128, 2, cache_format=E4M3)
H100_COPY, H200_COPY = (dataclasses.replace(gpu, ceiling_gbps=gbps) for gpu, gbps in ((H100, 2950.0), (H200, 4200.0)))


def test_a_prefill_takes_twice_the_heads_while_its_registers_keep_too_little_in_flight():
    registers = lambda config: 72  # noqa: E731
    assert model.fused_bytes_in_flight_per_sm(H100_COPY, FP8_PREFILL, FusedConfig(2, 8, 4), 72) == 7 * 4096 / 2
    assert model.model_fused(H100_COPY, FP8_PREFILL, registers) == model.model_fused(H100_COPY, FP8_PREFILL)
    doubled = model.model_fused(H200_COPY, FP8_PREFILL, registers)
    assert doubled == model.model_fused(H200_COPY, FP8_PREFILL)._replace(block_h=16)
    assert model.fused_candidates(H200_COPY, FP8_PREFILL, registers)[0] == doubled
    # more registers, fewer programs an SM: the H100 asks for twice the heads too
    assert model.model_fused(H100_COPY, FP8_PREFILL, lambda config: 96).block_h == 16
    # a kernel that holds an SM with one program doubles up to the call's heads, never past them
    assert model.model_fused(H200_COPY, FP8_PREFILL, lambda config: 255).block_h == 32
    assert model.model_fused(H200_COPY, FP8_PREFILL._replace(n_heads=8), lambda config: 255).block_h == 8
    # unknown registers (None): the rule's tile
    assert model.model_fused(H200_COPY, FP8_PREFILL, lambda config: None) == model.model_fused(H200_COPY, FP8_PREFILL)


def test_a_prefill_whose_tile_keeps_enough_in_flight_takes_the_models_choice_untimed(gpu):
    # the gpu fixture's memory asks more in flight than any tile keeps: the autotune decides; with the H200's
    # measured bandwidth the doubled tile keeps enough, and the model's choice stands untimed
    registers = lambda config: 72  # noqa: E731
    assert not model.fused_meets_littles_law(gpu, FP8_PREFILL, registers)
    bench = FakeBench({})
    choice.choose_fused(FP8_PREFILL, gpu, bench, registers=registers)
    assert bench.calls and bench.calls[0] == model.model_fused(gpu, FP8_PREFILL, registers)
    sure = dataclasses.replace(H200_COPY, name=gpu.name + " (sure)")
    assert model.fused_meets_littles_law(sure, FP8_PREFILL, registers)
    assert not model.fused_meets_littles_law(sure, FP8_PREFILL, lambda config: None)
    bench = FakeBench({})
    assert choice.choose_fused(FP8_PREFILL, sure, bench, registers=registers) == \
        model.model_fused(sure, FP8_PREFILL, registers) and bench.calls == []


def test_a_choice_counted_from_one_calls_registers_is_not_kept_for_its_bucket(tmp_path, monkeypatch):
    # two calls of one bucket (a slot mapping and a page table: FusedShape does not tell them apart) compile to other
    # registers, and each gets the tile its own kernel asks for; a pick the autotune stored for the bucket, when a call
    # whose tile kept too little in flight timed it, does not stand in for a call whose tile keeps enough
    monkeypatch.setenv("ROPEKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ROPEKIT_AUTOTUNE", raising=False)
    monkeypatch.setattr(ropekit.device, "INTERPRET", False)  # choosing (and timing) as on a GPU
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    sure = dataclasses.replace(H200_COPY, name="H200 registers test")
    few, many = (lambda config: 40), (lambda config: 255)
    assert choice.choose_fused(FP8_PREFILL, sure, registers=few) == model.model_fused(sure, FP8_PREFILL, few)
    assert choice.choose_fused(FP8_PREFILL, sure, registers=many) == model.model_fused(sure, FP8_PREFILL, many) != \
        model.model_fused(sure, FP8_PREFILL, few)
    assert not model.fused_meets_littles_law(sure, FP8_PREFILL, many)  # 2 programs an SM even at 32 heads
    timed = model.fused_candidates(sure, FP8_PREFILL, many)[-1]
    assert choice.choose_fused(FP8_PREFILL, sure, FakeBench({timed: 0.5}), registers=many) == timed
    assert choice.choose_fused(FP8_PREFILL, sure, FakeBench({}), registers=many) == timed  # kept for the bucket
    assert choice.choose_fused(FP8_PREFILL, sure, FakeBench({}), registers=few) == \
        model.model_fused(sure, FP8_PREFILL, few) != timed


@pytest.mark.parametrize("shape", [FusedShape(64, 32, 128, 2, cache_format=E4M3), FusedShape(512, 32, 128, 2),
                                   FP8_PREFILL._replace(backward=True)], ids=["decode", "in-l2", "backward"])
def test_registers_are_asked_only_for_a_forward_prefill_past_the_l2(shape):
    asked = []
    assert model.model_fused(H200, shape, lambda config: asked.append(config) or 255) == model.model_fused(H200, shape)
    assert asked == []


def test_the_fused_choice_counts_registers_where_the_caller_can_compile(gpu):
    registers = lambda config: 255  # noqa: E731
    chosen = choice.choose_fused(FP8_PREFILL, gpu, registers=registers)
    assert chosen == model.model_fused(gpu, FP8_PREFILL, registers) != model.model_fused(gpu, FP8_PREFILL)
    bench = FakeBench({})
    assert choice.choose_fused(FP8_PREFILL, gpu, bench, registers=registers) == chosen
    assert bench.calls[0] == chosen  # the autotune times the model's choice first


def test_a_tile_too_large_for_the_registers_is_refused():
    shape = SHAPES["many-heads-no-fused-tile"]  # 2 tokens x 256 heads x 256 channels: 131072 values
    assert not model.is_valid_rope(TileConfig(2, 128, 32, fused_qk=True), shape)
    # a partial rotation past the L2 takes the fused q+k tile, which here falls back to 16 tokens x 1 head
    assert model.model_rope(H100, shape._replace(rotary_dim=128)) == TileConfig(16, 1, 8, evict_first=True)


@pytest.mark.parametrize("gpu", sorted(GPUS))
@pytest.mark.parametrize("heads,element_size", [(32, 2), (32, 4), (128, 2), (128, 4)])
def test_the_backward_pipeline_fits_in_shared_memory_even_over_every_head_of_128(gpu, heads, element_size):
    """A norm over all heads walks one token of every head a step; pipelined three deep, 128 heads x 128 float32
    channels would need 256 KiB of shared memory, more than a Hopper program gets (227 KiB): the launch failed."""
    for over_heads in (False, True):
        shape = FusedShape(4096, heads, 128, element_size, norm=True, backward=True, norm_over_heads=over_heads)
        config = model.model_fused(GPUS[gpu], shape)
        held = (config.stages - 1) * 2 * config.block_s * config.block_h * 128 * element_size
        assert held <= 219 * 1024 and model.is_valid_fused(config, shape)
        assert all(model.is_valid_fused(c, shape) for c in model.fused_candidates(GPUS[gpu], shape))
    too_deep = FusedConfig(1, 128, 16, token_blocks=16, stages=3)
    over_128_heads = dict(norm=True, backward=True, norm_over_heads=True)
    assert not model.is_valid_fused(too_deep, FusedShape(4096, 128, 128, 4, **over_128_heads))
    assert model.is_valid_fused(too_deep, FusedShape(4096, 128, 128, 2, **over_128_heads))


# --------------------------------------------------------------------------------------------------------------------
# Buckets.
# --------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, bucket", [(1, 1), (64, 64), (65, 128), (3000, 4096), (4096, 4096), (4097, 8192)])
def test_buckets_round_the_token_count_up_to_a_power_of_two_and_keep_everything_else(tokens, bucket):
    shape = rope(1, tokens, 32, 8, 128)
    assert choice.rope_bucket(shape) == shape._replace(n_tokens=bucket)
    fused = FUSED_SHAPES["prefill"]._replace(n_tokens=tokens)
    assert choice.fused_bucket(fused) == fused._replace(n_tokens=bucket)


# --------------------------------------------------------------------------------------------------------------------
# Choosing: the autotune and its disk cache.
# --------------------------------------------------------------------------------------------------------------------

class FakeBench:
    """Times a configuration by a table of seconds (default 1.0); records what it was asked."""

    def __init__(self, seconds=None, fails=()):
        self.seconds, self.fails, self.calls = seconds or {}, set(fails), []

    def __call__(self, config):
        self.calls.append(config)
        if config in self.fails:
            raise RuntimeError("out of resources")
        return self.seconds.get(config, 1.0)


@pytest.fixture
def gpu(tmp_path, monkeypatch, request):
    """A GPU of the H100's facts but a memory that outruns what the flat block can keep in flight (so the model is
    unsure and the autotune times its prefills), named after the test (so no other test's choices are in memory),
    choosing outside the interpreter, with the disk cache in a temporary directory."""
    monkeypatch.setenv("ROPEKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ROPEKIT_AUTOTUNE", raising=False)
    monkeypatch.setattr(ropekit.device, "INTERPRET", False)
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return dataclasses.replace(H100, name=f"test GPU {request.node.name}", ceiling_gbps=80_000.0)


# the autotune times contiguous out-of-place calls past the L2 (where the tile and the flat kernel compete)
SMALL_PREFILL = TABLE["llama3-8b-prefill"][0]


@pytest.mark.parametrize("case", ["small-prefill", "decode", "llama3-8b-prefill-in-place"])
def test_calls_the_clock_cannot_judge_are_never_timed(gpu, case):
    # the L2 serves them (their launch chain is what one event-timed launch would measure), or the benchmark call
    # would not be theirs (in place, GPT-J pairs, per-token rows): the model's choice, untimed
    shape = TABLE[case][0]
    bench = FakeBench({model.rope_candidates(gpu, shape)[-1]: 0.5})
    if model.fits_in_l2(gpu, shape) or not shape.flat_ok:
        assert choice.choose_rope(shape, gpu, bench) == model.model_rope(gpu, shape) and bench.calls == []


@pytest.mark.parametrize("facts", ["h100", "h200"])
@pytest.mark.parametrize("case", ["llama3-8b-prefill", "mha-fp16", "llama3-8b-fp32"])
def test_where_the_models_flat_block_meets_littles_law_the_call_is_never_timed(gpu, case, facts):
    # the H100's and the H200's memory: 16 programs of 4 warps keep 32 KiB in flight an SM, more than they ask, and
    # graph replay put that block first or within 1 % of the first; the unsure GPU of the fixture times the same call
    shape = TABLE[case][0]
    sure = dataclasses.replace(GPUS[facts], name=gpu.name + " " + facts)
    assert model.flat_meets_littles_law(sure, shape) and not model.flat_meets_littles_law(gpu, shape)
    bench = FakeBench({model.rope_candidates(sure, shape)[-1]: 0.5})
    assert choice.choose_rope(shape, sure, bench) == model.model_rope(sure, shape) and bench.calls == []
    unsure = FakeBench({model.rope_candidates(gpu, shape)[-1]: 0.5})
    assert choice.choose_rope(shape, gpu, unsure) == model.rope_candidates(gpu, shape)[-1] and unsure.calls


def test_a_bucket_the_clock_never_judges_is_decided_once_a_process(gpu, monkeypatch):
    """A decode step or a backward is never timed, so the model's answer for its bucket is final: later plans of the
    bucket (autograd plans its backward afresh) neither read the disk cache nor run the model again."""
    decode = FusedShape(64, 32, 128, 2, norm=True)
    backward = FusedShape(16384, 32, 128, 2, norm=True, backward=True)
    runs = []
    monkeypatch.setattr(choice, "model_fused",
                        lambda facts, shape, registers=None: runs.append(shape) or model.model_fused(facts, shape))
    for shape in (decode, backward):
        first = choice.choose_fused(shape, gpu)
        reads = []  # every look at the disk cache starts from its path
        path = choice.cache_path
        monkeypatch.setattr(choice, "cache_path", lambda: reads.append(1) or path())
        assert choice.choose_fused(shape, gpu) == first == model.model_fused(gpu, shape)
        assert reads == [] and len(runs) == 1, (reads, runs)
        runs.clear()


def test_a_first_call_tunes_its_bucket_once_and_keeps_the_fastest(gpu):
    candidates = model.rope_candidates(gpu, SMALL_PREFILL)
    fastest = candidates[-1]
    bench = FakeBench({fastest: 0.5})
    assert choice.choose_rope(SMALL_PREFILL, gpu, bench) == fastest
    assert sorted(bench.calls) == sorted(candidates)  # each candidate once
    assert choice.choose_rope(SMALL_PREFILL._replace(n_tokens=SMALL_PREFILL.n_tokens - 100), gpu,
                              bench) == fastest  # the same bucket
    assert len(bench.calls) == len(candidates)


def test_the_choice_is_on_disk_and_a_later_process_starts_warm_without_timing(gpu, tmp_path):
    fastest = model.rope_candidates(gpu, SMALL_PREFILL)[2]
    choice.choose_rope(SMALL_PREFILL, gpu, FakeBench({fastest: 0.5}))
    document = json.loads(choice.cache_path().read_text())
    assert [entry["config"] for entry in document["entries"].values()] == [fastest._asdict()]
    script = (
        "import dataclasses, sys, ropekit\n"
        "from ropekit.triton import choice, model\n"
        "from ropekit.triton.configs import RopeShape\n"
        "ropekit.device.INTERPRET = False\n"
        f"facts = model.DeviceFacts(**{dataclasses_dict(gpu)!r})\n"
        "def bench(config): raise AssertionError('timed although cached')\n"
        f"print(choice.choose_rope(RopeShape(*{tuple(SMALL_PREFILL)!r}), facts, bench))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == repr(fastest)


def dataclasses_dict(facts):
    return dataclasses.asdict(facts)


def test_once_cached_the_choice_is_deterministic(gpu):
    first = choice.choose_rope(SMALL_PREFILL, gpu, FakeBench({model.model_rope(gpu, SMALL_PREFILL): 0.1}))
    for seconds in (0.01, 0.001):
        other = model.rope_candidates(gpu, SMALL_PREFILL)[-1]
        bench = FakeBench({other: seconds})
        assert choice.choose_rope(SMALL_PREFILL, gpu, bench) == first and bench.calls == []


def test_without_a_bench_the_models_choice_is_used_and_not_stored(gpu):
    assert choice.choose_rope(SMALL_PREFILL, gpu) == model.model_rope(gpu, SMALL_PREFILL)
    assert not choice.cache_path().exists()
    fastest = model.rope_candidates(gpu, SMALL_PREFILL)[1]
    assert choice.choose_rope(SMALL_PREFILL, gpu, FakeBench({fastest: 0.5})) == fastest  # tuned later


@pytest.mark.parametrize("where", ["autotune off", "cuda graph capture", "torch.compile trace"])
def test_no_timing_when_tuning_is_off_or_inside_capture_or_compile(gpu, monkeypatch, where):
    if where == "autotune off":
        monkeypatch.setenv("ROPEKIT_AUTOTUNE", "0")
    elif where == "cuda graph capture":
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    else:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not choice.tuning_allowed()
    bench = FakeBench({model.rope_candidates(gpu, SMALL_PREFILL)[1]: 0.5})
    assert choice.choose_rope(SMALL_PREFILL, gpu, bench) == model.model_rope(gpu, SMALL_PREFILL)
    fused = FUSED_SHAPES["decode"]
    assert choice.choose_fused(fused, gpu, bench) == model.model_fused(gpu, fused)
    assert bench.calls == [] and not choice.cache_path().exists()


def test_a_corrupt_cache_file_is_ignored_and_replaced(gpu):
    path = choice.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text("{ not json")
    assert choice.choose_rope(SMALL_PREFILL, gpu) == model.model_rope(gpu, SMALL_PREFILL)
    fastest = model.rope_candidates(gpu, SMALL_PREFILL)[1]
    assert choice.choose_rope(SMALL_PREFILL, gpu, FakeBench({fastest: 0.5})) == fastest
    assert len(json.loads(path.read_text())["entries"]) == 1


def test_a_cached_entry_the_kernels_would_refuse_is_ignored(gpu, tmp_path, monkeypatch):
    shape = SMALL_PREFILL._replace(n_tokens=16384)
    fastest = model.rope_candidates(gpu, shape)[1]
    choice.choose_rope(shape, gpu, FakeBench({fastest: 0.5}))
    document = json.loads(choice.cache_path().read_text())
    for entry in document["entries"].values():
        entry["config"]["num_warps"] = 3
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "autotune.json").write_text(json.dumps(document))
    monkeypatch.setenv("ROPEKIT_CACHE_DIR", str(edited))
    other = dataclasses.replace(gpu, latency_ns=601.0)  # the same GPU's key on disk; nothing of it in memory
    bench = FakeBench()
    assert choice.choose_rope(shape, other, bench) == model.model_rope(other, shape)  # re-tuned: all tie, the model's
    assert len(bench.calls) == len(model.rope_candidates(other, shape))


def test_an_unwritable_cache_keeps_the_choice_in_memory(gpu, tmp_path, monkeypatch):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("ROPEKIT_CACHE_DIR", str(blocker / "cache"))
    fastest = model.rope_candidates(gpu, SMALL_PREFILL)[1]
    bench = FakeBench({fastest: 0.5})
    assert choice.choose_rope(SMALL_PREFILL, gpu, bench) == fastest
    assert choice.choose_rope(SMALL_PREFILL, gpu, bench) == fastest and len(bench.calls) == len(
        model.rope_candidates(gpu, SMALL_PREFILL))


def test_candidates_that_fail_are_skipped_and_if_all_fail_the_model_decides_later(gpu):
    candidates = model.rope_candidates(gpu, SMALL_PREFILL)
    bench = FakeBench({candidates[1]: 0.1, candidates[2]: 0.2}, fails={candidates[1]})
    assert choice.choose_rope(SMALL_PREFILL, gpu, bench) == candidates[2]
    decode = TABLE["decode"][0]
    assert choice.choose_rope(decode, gpu, FakeBench(fails=model.rope_candidates(gpu, decode))) == \
        model.model_rope(gpu, decode)
    assert len(json.loads(choice.cache_path().read_text())["entries"]) == 1  # only the tuned bucket


def test_the_fused_choice_tunes_and_caches_like_the_rope_choice(gpu):
    shape = FUSED_SHAPES["prefill"]
    candidates = model.fused_candidates(gpu, shape)
    bench = FakeBench({candidates[-1]: 0.5})
    assert choice.choose_fused(shape, gpu, bench) == candidates[-1]
    assert choice.choose_fused(shape, gpu, bench) == candidates[-1] and len(bench.calls) == len(candidates)


@pytest.mark.parametrize("case", ["decode", "decode-fp8", "mla-decode", "small-prefill-fused", "backward"])
def test_fused_calls_the_clock_cannot_judge_are_never_timed(gpu, case):
    # a decode step is its launch chain, a prefill the L2 holds lasts a few microseconds, and the backward keeps the
    # model's walk: the model's choice, untimed
    shape = {"small-prefill-fused": FusedShape(512, 32, 128, 2)}.get(case) or FUSED_SHAPES[case]
    bench = FakeBench({model.fused_candidates(gpu, shape)[-1]: 0.5})
    assert choice.choose_fused(shape, gpu, bench) == model.model_fused(gpu, shape) and bench.calls == []


@pytest.mark.parametrize("variable, expected", [
    ({"ROPEKIT_CACHE_DIR": "/somewhere"}, "/somewhere/autotune.json"),
    ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/ropekit/autotune.json"),
    ({"HOME": "/home/user"}, "/home/user/.cache/ropekit/autotune.json"),
])
def test_the_cache_lives_in_the_users_cache_directory(monkeypatch, variable, expected):
    for name in ("ROPEKIT_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variable.items():
        monkeypatch.setenv(name, value)
    assert str(choice.cache_path()) == expected


@pytest.mark.skipif(not ropekit.device.INTERPRET, reason="the interpreter's fixed configurations")
@pytest.mark.parametrize("tokens, heads, expected", [(1, 4, (1, 4)), (64, 32, (16, 8)), (5, 3, (8, 4))])
def test_under_the_interpreter_the_configurations_are_fixed(tokens, heads, expected):
    bench = FakeBench()
    assert choice.choose_rope(rope(1, tokens, heads, heads, 64), "cpu", bench) == TileConfig(*expected, 4)
    fused = FusedShape(tokens, heads, 64, 2)
    assert choice.choose_fused(fused, "cpu", bench) == FusedConfig(*expected, 4)
    assert bench.calls == []


def test_device_facts_read_the_properties_torch_has_and_fall_back_on_the_rest(monkeypatch, tmp_path):
    """torch 2.11-2.13 name some fields differently or lack them: what is missing takes a labelled default."""
    from types import SimpleNamespace

    props = SimpleNamespace(name="Some GPU", major=9, minor=0, multi_processor_count=100, total_memory=2**34,
                            max_threads_per_multi_processor=1536, L2_cache_size=2**25, memory_clock_rate=2_000_000,
                            memory_bus_width=4096, shared_memory_per_block=65536)  # (no opt-in limit: ROCm's)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 10**6)  # an index no real GPU has
    monkeypatch.setenv("ROPEKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ROPEKIT_AUTOTUNE", "0")  # no copy is timed: the bandwidth is estimated
    facts = choice.device_facts()
    assert (facts.n_sms, facts.max_warps_per_sm, facts.l2_bytes, facts.registers_per_sm) == (100, 48, 2**25, 65536)
    assert facts.ceiling_gbps == pytest.approx(2e9 * 2 * 512 / 1e9) and facts.bandwidth_source.startswith("estimated")
    assert facts.latency_source.startswith("assumed") and facts.shared_bytes_per_program == 65536
    assert isinstance(model.model_rope(facts, SMALL_PREFILL), (TileConfig, FlatConfig))


def test_time_launch_takes_the_median_of_its_repetitions():
    calls = []
    seconds = choice.time_launch(lambda: calls.append(1), warmup=2, reps=3)
    assert len(calls) == 5 and seconds >= 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_facts_come_from_the_device_and_its_copy_is_measured_once(monkeypatch, tmp_path):
    monkeypatch.setenv("ROPEKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ROPEKIT_AUTOTUNE", raising=False)
    facts = choice.device_facts(torch.cuda.current_device())
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert facts.n_sms == props.multi_processor_count and facts.name == props.name
    assert facts.shared_bytes_per_program == getattr(props, "shared_memory_per_block_optin",
                                                     props.shared_memory_per_block)
    assert facts.bandwidth_source.startswith("measured") and facts.ceiling_gbps > 100
    assert isinstance(choice.choose_rope(SMALL_PREFILL, torch.cuda.current_device()), (TileConfig, FlatConfig))


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_mlas_prefill_doubles_the_heads_of_its_narrow_q_tile_for_bytes_in_flight(gpu):
    """A prefill's bytes in flight are counted from the q tile a program streams (MLA's heads of 64 channels), not
    from the widest vector a k program holds (its 512-channel latent row): past the L2 the tile takes more heads."""
    facts = GPUS[gpu]
    shape = FusedShape(16384, 128, 512, 2, head_dim=64)
    assert shape.rotated_width == 64 and FusedShape(16384, 32, 128, 2).rotated_width == 128
    config = model.model_fused(facts, shape, lambda c: 64)
    assert (config.block_s, config.num_warps, config.evict_first, config.heads_inner) == (2, 4, True, True)
    assert config.block_h >= 16
    wide = model.model_fused(facts, shape._replace(head_dim=0), lambda c: 64)
    assert (wide.block_h, wide.num_warps, wide.evict_first) == (8, 8, False)  # the wide rule, as before
