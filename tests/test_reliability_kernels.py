"""ropekit.reliability.kernels: a launch with a forced configuration, and a dry run that records kernel variants
without running anything."""

import torch

from ropekit import reference as ref
from ropekit.api import apply_rope
from ropekit.device import DEVICE
from ropekit.frequencies import cos_sin_table
from ropekit.positions import resolve_positions
from ropekit.reliability.kernels import TileConfig, record_launches, rope_v4


def test_a_forced_launch_config_runs_that_launch():
    q = torch.randn(2, 5, 3, 32, device=DEVICE)
    cos, sin = cos_sin_table(8, 32, device=DEVICE)
    out = torch.empty_like(q)
    spec = resolve_positions(batch=2, seqlen=5, positions=None)
    rope_v4(q, None, cos, sin, out_q=out, out_k=None, positions=spec, rotary_dim=32,
            config=TileConfig(2, 1, 16, fused_qk=True))
    torch.testing.assert_close(out.double().cpu(), ref.rope(q, ref.token_positions(2, 5)), rtol=1e-5, atol=1e-5)


def test_a_dry_run_records_and_runs_nothing():
    q = torch.randn(2, 5, 3, 32, device=DEVICE)
    cos, sin = cos_sin_table(8, 32, device=DEVICE)
    with record_launches() as recorder:
        out, _ = apply_rope(q, None, cos, sin, positions=1)
        apply_rope(q.double(), None, cos, sin, positions=1)
    assert len(recorder.keys) == 2 and recorder.keys[0] != recorder.keys[1]
    after, _ = apply_rope(q, None, cos, sin, positions=1)  # the real launch is back
    torch.testing.assert_close(after.double().cpu(), ref.rope(q, ref.token_positions(2, 5, offsets=1)), rtol=1e-5,
                               atol=1e-5)
