"""Tests of dmpo_jax.tasks (the folders of tests/ mirror the package's)."""
