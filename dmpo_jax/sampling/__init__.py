"""Jitted sampling: prefill + lax.while_loop decode over a static KV cache."""

from dmpo_jax.sampling.sampler import Rollout, SamplingConfig, generate, pad_prompts, sample

__all__ = ["Rollout", "SamplingConfig", "generate", "pad_prompts", "sample"]
