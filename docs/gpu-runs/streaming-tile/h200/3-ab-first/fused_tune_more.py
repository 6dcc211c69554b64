"""fused_tune with the prefill sweep led by one-token tiles (the rope tile's finding), on the prefill cases."""
import sys
import ropekit.bench.fused_tune as T
_I, _E = (True, True), (True, False)
T.SWEEP["prefill"] = [(1, 8, 4, *_I), (1, 8, 4, *_E), (1, 8, 4), (1, 4, 4, *_I), (1, 16, 4, *_I), (2, 8, 4, *_I),
                      (2, 16, 4, *_I), (1, 8, 2, *_I), (4, 8, 4, *_I), (4, 16, 4, *_I), (2, 32, 4, *_I)]
sys.exit(T.main(sys.argv[1:]))
