"""The v4 kernel through its launcher, under every launch configuration the table can pick: tile shapes, the fused
q+k tile and the flat path, against the float64 reference."""

import pytest
import torch

import ropekit
from ropekit import reference as ref
from ropekit.positions import resolve_positions
from ropekit.testing import assert_close_to_reference
from ropekit.triton.launch import FlatConfig, TileConfig, forced_config, plan_rope, rope_v4
from conftest import DEVICE, gpu_only
from rope_cases import CASES, expected, make, positions_for, table

# Every configuration must give the same answer: tiles of the kinds the launch choice picks (including one program per
# token block holding all q and k heads) and the flat kernel (where the tensors allow it; the usual choice elsewhere)
# are forced here onto every case, so the interpreter checks them on CPU.
V4_CONFIGS = [
    TileConfig(1, 4, 4, fused_qk=True),
    TileConfig(2, 1, 2, fused_qk=True, evict_first=True),
    TileConfig(4, 2, 4),
    TileConfig(1, 1, 1, evict_first=True),
    TileConfig(2, 1, 32, fused_qk=True, evict_first=True),
    TileConfig(1, 2, 4, evict_first=True, heads_inner=True),  # the streaming tile's launch order
    TileConfig(2, 4, 2, heads_inner=True),
    FlatConfig(64, 4),
    FlatConfig(32, 1, paired=True),  # q and k in one program where shapes match
]


def _config_id(c):
    if type(c) is FlatConfig:
        return f"flat{c.block}w{c.num_warps}" + ("-paired" if c.paired else "")
    return f"s{c.block_s}h{c.block_h}w{c.num_warps}" + ("-fused" if c.fused_qk else "") + (
        "-evict" if c.evict_first else "") + ("-heads-inner" if c.heads_inner else "")


@pytest.mark.parametrize("config", V4_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("case", CASES[:6], ids=[c[0] for c in CASES[:6]])
def test_every_v4_tile_shape_matches_reference(case, config):
    with forced_config(config):
        _check_case_and_varlen(case)


def _check_case_and_varlen(case):
    _, layout, batch, seqlen, hq, hk, head_dim, rotary_dim, interleaved, kind, dtype = case
    q = make(layout, batch, seqlen, hq, head_dim, dtype)
    k = make(layout, batch, seqlen, hk, head_dim, dtype)
    cos, sin = table(64, rotary_dim)
    arg, pos = positions_for(kind, batch, seqlen)
    out_q, out_k = ropekit.apply_rope(q, k, cos, sin, positions=arg, layout=layout, interleaved=interleaved,
                                      rotary_dim=rotary_dim)
    kw = dict(rotary_dim=rotary_dim, interleaved=interleaved)
    assert_close_to_reference(out_q, expected(q, layout, pos, **kw))
    assert_close_to_reference(out_k, expected(k, layout, pos, **kw))
    # q alone, and varlen, through the same tile shape
    out_q, _ = ropekit.apply_rope(q, None, cos, sin, positions=arg, layout=layout, interleaved=interleaved,
                                  rotary_dim=rotary_dim)
    assert_close_to_reference(out_q, expected(q, layout, pos, **kw))
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32, device=DEVICE)
    q_thd = torch.randn(9, hq, head_dim, device=DEVICE).to(dtype)
    k_thd = torch.randn(9, hk, head_dim, device=DEVICE).to(dtype)
    out_q, out_k = ropekit.apply_rope(q_thd, k_thd, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=5,
                                      interleaved=interleaved, rotary_dim=rotary_dim)
    assert_close_to_reference(out_q, ref.rope(q_thd, ref.varlen_positions(cu), **kw))
    assert_close_to_reference(out_k, ref.rope(k_thd, ref.varlen_positions(cu), **kw))


FLAT = FlatConfig(64, 4)
FLAT_PAIRED = FLAT._replace(paired=True)


@pytest.mark.parametrize("head_dim", [16, 24, 48, 96])
@pytest.mark.parametrize("paired", [False, True], ids=["q-then-k", "paired"])
@pytest.mark.parametrize("kind", ["none", "int", "offsets", "ids", "ids1d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_v4_flat_path_matches_reference(kind, dtype, paired, head_dim):
    # The flat path (runs of whole head vectors over contiguous q then k, or of both at once, each NeoX pair
    # loaded once): every position form, the conjugate, k absent / MQA / MHA, and head-vector counts that do not
    # fill the last block (2 x 5 tokens x 3 heads = 30 vectors). A block of 64 elements holds 4 vectors of 16
    # channels; of 24, each half of 12 pads to 16 lanes (2 vectors a block, the pad masked); of 48, the halves pad
    # to 32 (one vector a block, 16 lanes masked); of 96, to 64, a vector wider than the block, which then takes
    # one. Paired blocks need k of q's shape; MQA then takes blocks of q, then of k.
    interleaved = False
    batch, seqlen, heads = 2, 5, 3
    cos, sin = table(64, head_dim)
    arg, pos = positions_for(kind, batch, seqlen)
    spec = resolve_positions(batch=batch, seqlen=seqlen, positions=arg)
    for heads_k, conjugate in ((0, False), (1, True), (3, False)):
        q = torch.randn(batch, seqlen, heads, head_dim, device=DEVICE).to(dtype)
        k = torch.randn(batch, seqlen, heads_k, head_dim, device=DEVICE).to(dtype) if heads_k else None
        out_q = torch.full_like(q, float("nan"))
        out_k = torch.full_like(k, float("nan")) if k is not None else None
        kw = dict(out_q=out_q, out_k=out_k, positions=spec, rotary_dim=head_dim, interleaved=interleaved,
                  conjugate=conjugate, config=FLAT_PAIRED if paired else FLAT)
        assert plan_rope(q, k, cos, sin, **kw).config == kw["config"]
        rope_v4(q, k, cos, sin, **kw)
        for x, out in ((q, out_q), (k, out_k)):
            if x is not None:
                assert_close_to_reference(out, ref.rope(x, pos.to(x.device), interleaved=interleaved,
                                                        conjugate=conjugate))


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("config", [FLAT, FLAT_PAIRED, FlatConfig(128, 4)], ids=["q-then-k", "paired", "block128"])
def test_v4_flat_path_writes_only_its_outputs_and_gives_nan_outside_the_table(config, index_dtype, monkeypatch):
    # Outputs are views at the start of sentinel-filled buffers: nothing past them changes. Position ids inside and
    # outside an 8-row table (-1, 8, 40): those tokens come out NaN in every head of q and k, the others match the
    # reference. int64: the launcher's 64-bit addressing (taken for views of 2**31 elements or more) forced on.
    from ropekit.triton import launch

    if index_dtype == "int64":
        monkeypatch.setattr(launch, "_fits_int32", lambda *parts: False)
    launch.plans.clear()
    batch, seqlen, heads, head_dim = 2, 4, 3, 80
    cos, sin = table(8, head_dim)
    ids = torch.tensor([[0, -1, 7, 3], [8, 5, 40, 1]])
    spec = resolve_positions(batch=batch, seqlen=seqlen, positions=ids.to(DEVICE))
    q = torch.randn(batch, seqlen, heads, head_dim, device=DEVICE)
    k = torch.randn(batch, seqlen, heads, head_dim, device=DEVICE)
    n = q.numel()
    buffers = [torch.full((n + 512,), 123.0, device=DEVICE) for _ in range(2)]
    out_q, out_k = (b[:n].view(q.shape) for b in buffers)
    rope_v4(q, k, cos, sin, out_q=out_q, out_k=out_k, positions=spec, rotary_dim=head_dim, config=config)
    assert all(bool((b[n:] == 123.0).all()) for b in buffers)
    outside = (ids < 0) | (ids >= 8)
    for x, out in ((q, out_q), (k, out_k)):
        assert torch.isnan(out[outside]).all() and not torch.isnan(out[~outside]).any()
        want = ref.rope(x, ids.clamp(0, 7), interleaved=False)
        assert_close_to_reference(out[~outside], want[~outside])
    launch.plans.clear()


def test_v4_flat_path_only_where_it_applies():
    # in place (measured level with the streaming tile, which keeps it), partial rotary, varlen, per-token rows and
    # non-contiguous tensors take the tile kernel: a FlatConfig given for them is refused by the launcher, and a
    # forced one leaves them to the usual choice; positions outside the table still give NaN on the flat kernel
    q = torch.randn(2, 4, 2, 16, device=DEVICE)
    cos, sin = table(8, 16)
    spec = resolve_positions(batch=2, seqlen=4, positions=None)

    def flat_runs(x, out, **kw):
        kw = {"positions": spec, "rotary_dim": 16, **kw}
        with forced_config(FLAT):
            forced = type(plan_rope(x, None, cos, sin, out_q=out, out_k=None, **kw).config) is FlatConfig
        try:
            plan_rope(x, None, cos, sin, out_q=out, out_k=None, config=FLAT, **kw)
        except ValueError as error:
            assert "flat kernel cannot run" in str(error) and not forced
            return False
        assert forced
        return True
    assert flat_runs(q, torch.empty_like(q))
    assert not flat_runs(q, q)  # in place
    assert not flat_runs(q, torch.empty_like(q), interleaved=True)  # GPT-J pairs keep the tile
    assert not flat_runs(q, torch.empty_like(q), rotary_dim=8)  # partial rotary
    assert not flat_runs(q, torch.empty_like(q), eager_rounding=True)
    assert not flat_runs(q.double(), torch.empty_like(q.double()))  # fp64 math stays on the tiles
    wide = torch.randn(2, 4, 3, 16, device=DEVICE)[:, :, :2]
    assert not flat_runs(wide, torch.empty_like(q))  # not contiguous
    far = resolve_positions(batch=2, seqlen=4, positions=6)  # tokens at positions 6..9 of an 8-row table
    out = torch.empty_like(q)
    rope_v4(q, None, cos, sin, out_q=out, out_k=None, positions=far, rotary_dim=16, config=FLAT)
    assert torch.isfinite(out[:, :2]).all() and torch.isnan(out[:, 2:]).all()


@gpu_only
@pytest.mark.parametrize("config", [FlatConfig(256, 4), TileConfig(1, 2, 4)], ids=["flat", "tile"])
def test_a_column_major_table_past_int32_offsets_reads_its_own_rows(config):
    # A column-major (rows, 64) table of 2**25 + 2**20 rows: column 63 starts past 2**31 elements, so the launcher
    # takes 64-bit addressing, and the column offset must be computed in it (in int32 it wraps and reads outside the
    # table). 8.9 GB on the GPU, one tensor serving as cos and as sin.
    rows, head_dim, p = 2**25 + 2**20, 128, 5
    big = torch.empty(head_dim // 2, rows, device=DEVICE)
    cos_row, sin_row = ropekit.cos_sin_table(8, head_dim, device=DEVICE)
    big[:, p] = cos_row[p]
    table = big.t()
    assert table.stride(1) * (head_dim // 2 - 1) >= 2**31
    q = torch.randn(1, 1, 2, head_dim, device=DEVICE)
    out = torch.full_like(q, float("nan"))
    spec = resolve_positions(batch=1, seqlen=1, positions=torch.tensor([[p]], device=DEVICE))
    rope_v4(q, None, table, table, out_q=out, out_k=None, positions=spec, rotary_dim=head_dim, config=config)
    c = cos_row[p].double()
    x1, x2 = q.double()[..., :head_dim // 2], q.double()[..., head_dim // 2:]
    want = torch.cat((x1 * c - x2 * c, x2 * c + x1 * c), -1)
    assert_close_to_reference(out, want)
    del big, table
    torch.cuda.empty_cache()
