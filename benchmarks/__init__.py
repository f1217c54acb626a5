"""Micro-benchmarks for aiotimer's pure cores; run ``python -m benchmarks.bench_<name>``.

Every figure is printed next to a reference measured in the same run (the machines are
shared and noisy), and as a ratio to it.
"""
