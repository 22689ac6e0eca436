"""dmpo_jax: RL on language models that keeps the policy from collapsing onto one answer.

DMPO (group-level distribution matching), the DPH-RL f-divergence
regularisers and the usual RLVR baselines, in JAX/Flax NNX, with the ten
NP-Bench tasks. docs/ARCHITECTURE.md describes the layout and the public API.
"""

__version__ = "0.1.0"
