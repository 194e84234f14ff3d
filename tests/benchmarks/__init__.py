"""Developer benchmarks (not tests): `python -m tests.benchmarks.bench --help` from the repository root."""
