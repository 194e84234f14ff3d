"""Nothing here is a test: the developer benchmarks are scripts (python -m tests.benchmarks.bench)."""

collect_ignore = ["bench.py", "bench_official.py"]
