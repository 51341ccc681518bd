"""Benchmark harness (not shipped with the package)."""
