"""kiln benchmark harness (see benchmarks/README.md). Run from the repository root."""
