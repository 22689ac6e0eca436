"""Training configs: each file's `get_config(arg)` returns an ml_collections ConfigDict.

They are loaded by path (`--config=configs/nphard.py:smoke`), from any working directory:
a config that builds on another loads it with `config_lib.sibling(__file__, name)`, and
arguments after the colon are parsed by `config_lib.parse_config_args` against the file's
KNOWN names (dmpo_jax/training/config.py). Every field is declared, with its type and range,
in that module's SCHEMA.
"""
