"""Tests of the training layer (dmpo_jax.training) and the training CLI (dmpo_jax.train)."""
