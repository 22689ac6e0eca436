"""Parallelism: device meshes and sharding rules (sharding.py), multi-process runs (distributed.py)."""
