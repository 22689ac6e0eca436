"""Tests of benchmarks/ (the A/B runner, the device benchmark)."""
