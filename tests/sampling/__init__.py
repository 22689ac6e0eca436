"""Tests of dmpo_jax.sampling (the folders of tests/ mirror the package's)."""
