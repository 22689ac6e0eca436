"""Tests of dmpo_jax.experiments (the folders of tests/ mirror the package's)."""
