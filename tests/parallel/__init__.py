"""Tests of dmpo_jax.parallel (the folders of tests/ mirror the package's)."""
