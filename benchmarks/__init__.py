"""The benchmark harness (outside the package: no user imports it). ``scripts/benchmark.py`` is its command line;
:mod:`benchmarks.profiles` (what each architecture trains on) is what ``scripts/gpu_check.sh`` reads."""
