"""Experiments on top of the training layer: sweeps of presets x settings x seeds
(`sweep`, `python -m dmpo_jax.experiments.sweep`), their report (`report`), seed-paired
statistics with Holm's correction (`stats`) and the matched comparisons of the collapse
experiment (`frontier`; docs/COLLAPSE.md)."""
