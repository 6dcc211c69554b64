#!/usr/bin/env bash
# device call 6: one GPU's column of the side-by-side pages, on abf9ba8 (the device copy's git metadata read 9a97e3e)
git log --oneline -1 > $OUT/head.txt; MAIN_SECONDS=150 FUSED_SECONDS=200 EAGER_SECONDS=50 bash tools/gpu_run.sh publish
