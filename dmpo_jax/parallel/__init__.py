"""Parallelism: device meshes and sharding rules (sharding.py), multi-process runs
(distributed.py), the per-device memory plan of a config (plan.py, `python -m dmpo_jax.parallel.plan`)."""
