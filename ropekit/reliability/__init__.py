"""Reliability checks beyond the unit tests: the fuzzer of hostile-but-plausible inputs (``fuzz``)."""
