"""Benchmarks: checkpoint family generator and the benchmark suite."""
