"""The reliability run (``python -m ropekit stress``, rendered into docs/reliability.md) and the fuzzer of
hostile-but-plausible inputs (``python -m ropekit.reliability.fuzz``, docs/fuzzing.md).

Modules, one job each:

- ``cli``         the command: runs the sections, writes the JSON, renders the page, runs the sanitizer's driver
- ``configs``     the property section's configuration space (families, configurations, size ranges)
- ``build``       one configuration as tensors, and its float64 reference
- ``generate``    configurations with the number of kernel compiles bounded (a dry run counts variants)
- ``properties``  section 1: each configuration run and checked
- ``te_matrix``   section 2: Transformer Engine's rope test matrix
- ``sanitize``    section 3: the driver compute-sanitizer runs (tools/sanitize.sh)
- ``sanitize_fused``  its checks of the fused ops (cache address maps, quantising stores, the norm after)
- ``checks``      sections 4, 5, 7: large tensors, determinism, long context
- ``safety``      section 6: invalid inputs and NaN/Inf containment
- ``report``      the Markdown page from the JSON
- ``run``         outcome tallies and jobs spread over worker processes
- ``kernels``     the one door to the Triton launcher (forced launch configurations, dry runs)
- ``common``      dtype names, layout permutations, backends
- ``fuzz``, ``fuzz_rope``, ``fuzz_fused``, ``fuzz_cache``, ``fuzz_fp8``, ``rope_args``, ``arena``: the fuzzer, its
  targets (``fuzz_fp8``: FlashInfer's float8 calls) and its guarded tensors; ``cache_args`` (caches, slot mappings
  and page tables drawn as engines lay them out) and ``cache_readback`` (what a written cache must hold) serve the
  cache targets

Nothing here is imported by ``import ropekit``.
"""
