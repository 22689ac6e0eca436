"""Tests of dmpo_jax.objectives (the folders of tests/ mirror the package's)."""
