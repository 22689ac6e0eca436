"""Tiny models and HF folders built inside the tests (no hub)."""

import numpy as np


def tiny_hf(path, arch="qwen2", *, tie=False, vocab=97, seed=0, **overrides):
  """A random tiny transformers model of `arch`, saved to `path`; returns the torch model."""
  import torch
  import transformers

  torch.manual_seed(seed)
  kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rope_theta=5000.0,
            tie_word_embeddings=tie, rms_norm_eps=1e-6)
  kw.update(overrides)
  if arch == "qwen2":
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
  else:
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
  return perturb_and_save(model, path)


def perturb_and_save(model, path):
  """Weights larger than init, so that differences show; then save the folder."""
  import torch

  model.eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  model.save_pretrained(path)
  return model


def tiny_config(**kw):
  from dmpo_jax.models.config import ModelConfig

  base = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
              num_kv_heads=2, qkv_bias=True, rope_theta=10000.0)
  base.update(kw)
  return ModelConfig(**base)


def tiny_model(seed=0, scale=None, **kw):
  """Our Transformer with random weights; `scale` multiplies the embeddings so that
  next-token distributions are far from uniform."""
  import jax
  from flax import nnx

  from dmpo_jax.models.transformer import Transformer

  model = Transformer(tiny_config(**kw), rngs=nnx.Rngs(seed))
  if scale is not None:
    model.embed[...] = model.embed[...] * scale
    if not model.cfg.tie_embeddings:
      model.lm_head[...] = model.lm_head[...] * scale
  return model


def random_prompts(n, lo, hi, vocab, seed=0):
  rs = np.random.RandomState(seed)
  return [list(rs.randint(3, vocab, rs.randint(lo, hi + 1))) for _ in range(n)]
