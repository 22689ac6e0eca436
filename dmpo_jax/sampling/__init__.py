"""Jitted sampling: prefill + lax.while_loop decode over a static KV cache.

`generate(model, prompts, ...)`: token-id lists in, `Samples` out (notebooks, evaluation).
`generate_padded(graphdef, params, tokens, mask, rng, cfg)`: the pure core on left-padded
arrays (jit it yourself, or use `sample`, its jitted form). `make_sampler`: the core jitted
with a mesh's shardings (the training stages). `pad_prompts`: the one left-padding helper.
"""

from dmpo_jax.sampling.sampler import (Samples, SamplingConfig, generate, generate_padded,
                                       make_sampler, pad_prompts, sample)

__all__ = ["Samples", "SamplingConfig", "generate", "generate_padded", "make_sampler",
           "pad_prompts", "sample"]
