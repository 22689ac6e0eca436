"""Tests of dmpo_jax.models (the folders of tests/ mirror the package's)."""
