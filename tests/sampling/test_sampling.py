"""The sampler: agrees with full forwards, reports the right log-probs, samples the right law."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dmpo_jax import sampling
from dmpo_jax.sampling import sampler as sampler_lib
from tests.helpers import jitted, random_prompts, tiny_model


def _forward(model, tokens):
  """Logits [L, V] of one full forward of `tokens` (jitted: compiled once per length)."""
  return np.asarray(jitted(model)(jnp.asarray([tokens], jnp.int32)))[0]


def _teacher_forced_logits(model, prompt, completion):
  """Logits [T, V] predicting each completion token from a full forward of prompt + completion."""
  p = len(prompt)
  return _forward(model, list(prompt) + list(completion))[p - 1:p - 1 + len(completion)]


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_greedy_equals_stepwise_argmax_of_full_forwards():
  model = tiny_model(scale=4.0)
  prompts = random_prompts(3, 2, 7, 61, seed=1)  # ragged: exercises left padding
  out = sampling.generate(model, prompts, rng=jax.random.key(0), max_new_tokens=6, greedy=True)
  for i, prompt in enumerate(prompts):
    seq = list(prompt)
    for _ in range(6):  # right-padded to one length: causal, so the pads change nothing before them
      logits = _forward(model, seq + [0] * (len(prompt) + 6 - len(seq)))[len(seq) - 1]
      seq.append(int(np.argmax(logits)))
    assert list(np.asarray(out.tokens[i])) == seq[len(prompt):]
  assert np.asarray(out.mask).min() == 1  # no EOS given: every token is valid


@pytest.mark.slow  # > 6 s on the 2-core CPU: full suite only
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8)])
def test_logprobs_equal_teacher_forced_log_softmax(temperature, top_k, top_p):
  model = tiny_model(scale=3.0)
  prompts = random_prompts(2, 3, 6, 61, seed=2)
  out = sampling.generate(model, prompts, rng=jax.random.key(1), max_new_tokens=8,
                          num_samples=3, temperature=temperature, top_k=top_k, top_p=top_p)
  assert out.tokens.shape == (6, 8) and out.logprobs.dtype == jnp.float32
  for row in range(6):
    prompt = prompts[row // 3]  # the samples of one prompt are adjacent
    toks = list(np.asarray(out.tokens[row]))
    logits = _teacher_forced_logits(model, prompt, toks) / temperature
    want = jax.nn.log_softmax(logits, axis=-1)[np.arange(8), toks]
    np.testing.assert_allclose(np.asarray(out.logprobs[row]), want, atol=1e-5)


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_eos_ends_rows_and_masks_the_rest():
  model = tiny_model(scale=1.0)
  prompts = random_prompts(4, 2, 5, 61, seed=3)
  # With a near-uniform model, EOS = the most common early token ends some rows early.
  first = sampling.generate(model, prompts, rng=jax.random.key(2), max_new_tokens=12,
                            num_samples=4)
  eos = int(np.bincount(np.asarray(first.tokens[:, :3]).ravel()).argmax())
  out = sampling.generate(model, prompts, rng=jax.random.key(2), max_new_tokens=12,
                          num_samples=4, eos_id=eos, pad_id=0)
  tokens, mask, logp = map(np.asarray, (out.tokens, out.mask, out.logprobs))
  ended = 0
  for r in range(tokens.shape[0]):
    hits = np.flatnonzero(tokens[r] == eos)
    n_valid = hits[0] + 1 if len(hits) else 12
    ended += bool(len(hits))
    assert mask[r].tolist() == [1] * n_valid + [0] * (12 - n_valid)
    assert (tokens[r, n_valid:] == 0).all() and (logp[r, n_valid:] == 0).all()
  assert ended >= 2  # the test exercised early stops
  # Same key, same result: sampling is a pure function of the key.
  again = sampling.generate(model, prompts, rng=jax.random.key(2), max_new_tokens=12,
                            num_samples=4, eos_id=eos, pad_id=0)
  np.testing.assert_array_equal(np.asarray(again.tokens), tokens)


def test_stop_tokens_end_rows():
  model = tiny_model(scale=1.0)
  out = sampling.generate(model, [[5, 6, 7]], rng=jax.random.key(3), max_new_tokens=30,
                          num_samples=16, stop_ids=list(range(3, 30)))
  mask = np.asarray(out.mask)
  assert mask.sum(1).max() < 30  # every row hit a stop token well before the end


def _empirical(model, prompt, n, **kw):
  out = sampling.generate(model, [prompt], rng=jax.random.key(7), max_new_tokens=1,
                          num_samples=n, **kw)
  return np.bincount(np.asarray(out.tokens[:, 0]), minlength=model.cfg.vocab_size) / n


@pytest.mark.slow  # > 6 s on the 2-core CPU: full suite only
@pytest.mark.parametrize("top_k,top_p", [(4, 1.0), (0, 0.6), (6, 0.7)])
def test_top_k_top_p_frequencies_match_truncated_distribution(top_k, top_p):
  model = tiny_model(scale=6.0, vocab_size=16)
  prompt = [3, 9, 4]
  logits = np.asarray(model(jnp.asarray([prompt], jnp.int32)))[0, -1].astype(np.float64)
  probs = np.exp(logits - logits.max())
  probs /= probs.sum()
  order = np.argsort(-probs)
  keep = np.zeros_like(probs, bool)
  if top_k:
    keep[order[:top_k]] = True
  else:
    keep[:] = True
  if top_p < 1:
    # As HF's warpers: top-p acts on the top-k distribution, renormalised.
    pk = np.where(keep, probs, 0) / probs[keep].sum()
    mass_before = np.cumsum(pk[order]) - pk[order]
    nucleus = np.zeros_like(keep)
    nucleus[order[mass_before < top_p]] = True
    keep &= nucleus
  target = np.where(keep, probs, 0)
  target /= target.sum()
  assert 2 <= keep.sum() < 16  # truncation really cuts
  n = 20000
  freq = _empirical(model, prompt, n, top_k=top_k, top_p=top_p)
  assert (freq[~keep] == 0).all()
  sigma = np.sqrt(target * (1 - target) / n)
  assert (np.abs(freq - target) <= 5 * sigma + 1e-12).all(), (freq, target)


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_no_retrace_for_new_prompts_of_the_same_shape():
  model = tiny_model()
  graphdef, params = nnx.split(model)
  traced = jax.jit(chex.assert_max_traces(sampler_lib.generate_padded, n=1), static_argnums=(0, 5))
  cfg = sampling.SamplingConfig(max_new_tokens=4, num_samples=2)
  for seed in range(3):
    tokens, mask = sampling.pad_prompts(random_prompts(2, 2, 5, 61, seed=seed), prompt_length=5)
    traced(graphdef, params, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(seed), cfg)
  # The public entry point caches too.
  before = sampler_lib.sample._cache_size()
  for seed in range(3):
    sampling.generate(model, random_prompts(2, 2, 5, 61, seed=seed), rng=jax.random.key(0),
                      max_new_tokens=4, prompt_length=5)
  assert sampler_lib.sample._cache_size() - before <= 1


def test_prompt_buckets():
  # Powers of two from 16 to 256, then multiples of 256; a limit caps the bucket, never
  # below the prompt itself.
  got = [sampler_lib.prompt_bucket(n) for n in (1, 16, 17, 200, 256, 257, 600)]
  assert got == [16, 16, 32, 256, 256, 512, 768]
  assert sampler_lib.prompt_bucket(20, limit=24) == 24
  assert sampler_lib.prompt_bucket(30, limit=24) == 30  # too long: generate's check says so
  with pytest.raises(ValueError, match="prompt length must be >= 1"):
    sampler_lib.prompt_bucket(0)


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_prompt_lengths_in_one_bucket_compile_once_and_sample_as_unpadded():
  """Two calls whose longest prompts (9 and 13 tokens) share the 16-slot bucket compile one
  sampler, and each samples exactly what it samples padded only to its longest prompt."""
  model = tiny_model(scale=3.0)
  short = random_prompts(3, 2, 9, 61, seed=14)
  long = random_prompts(3, 2, 13, 61, seed=14)
  assert (max(map(len, short)), max(map(len, long))) == (9, 13)
  kw = dict(max_new_tokens=6, num_samples=2, temperature=0.9)
  before = sampler_lib.sample._cache_size()
  bucketed = [sampling.generate(model, p, rng=jax.random.key(6), **kw) for p in (short, long)]
  assert sampler_lib.sample._cache_size() - before == 1
  for prompts, out in zip((short, long), bucketed):
    exact = sampling.generate(model, prompts, rng=jax.random.key(6),
                              prompt_length=max(map(len, prompts)), **kw)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(exact.tokens))
    np.testing.assert_array_equal(np.asarray(out.mask), np.asarray(exact.mask))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(exact.logprobs), atol=1e-6)


def test_bad_sampling_input_is_refused_before_compiling():
  model = tiny_model()
  before = sampler_lib.sample._cache_size()
  with pytest.raises(ValueError, match="temperature must be > 0"):
    sampling.generate(model, [[1, 2]], rng=jax.random.key(0), max_new_tokens=2, temperature=0.0)
  for p in (0.0, 1.5):
    with pytest.raises(ValueError, match="top_p must be in"):
      sampling.generate(model, [[1, 2]], rng=jax.random.key(0), max_new_tokens=2, top_p=p)
  with pytest.raises(ValueError, match="exceeds the cache length 6"):
    sampling.generate(model, [[1, 2, 3, 4, 5]], rng=jax.random.key(0), max_new_tokens=2,
                      max_length=6)
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    sampling.generate(model, [[1], []], rng=jax.random.key(0), max_new_tokens=2)
  assert sampler_lib.sample._cache_size() == before
  # greedy needs no temperature
  out = sampling.generate(model, [[1, 2]], rng=jax.random.key(0), max_new_tokens=2,
                          temperature=0.0, greedy=True)
  assert out.tokens.shape == (1, 2)


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_decode_phases_change_nothing_but_speed():
  """4 decode phases over a growing cache sample exactly what one loop over all slots samples,
  also when some rows end (EOS) in an early phase."""
  model = tiny_model(scale=3.0)
  graphdef, params = nnx.split(model)
  tokens, mask = sampling.pad_prompts(random_prompts(2, 2, 5, 61, seed=4), prompt_length=5)
  outs = {}
  for phases in (1, 4):
    cfg = sampling.SamplingConfig(max_new_tokens=128, num_samples=3, eos_id=7,
                                  decode_phases=phases)
    outs[phases] = sampler_lib.sample(graphdef, params, jnp.asarray(tokens), jnp.asarray(mask),
                                      jax.random.key(5), cfg)
  lengths = np.asarray(outs[1].mask).sum(1)
  assert lengths.min() < 32 < lengths.max()  # rows end in the first phase and after it
  np.testing.assert_array_equal(np.asarray(outs[4].tokens), np.asarray(outs[1].tokens))
  np.testing.assert_array_equal(np.asarray(outs[4].mask), np.asarray(outs[1].mask))
  np.testing.assert_allclose(np.asarray(outs[4].logprobs), np.asarray(outs[1].logprobs), atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["reference", "xla"])
def test_update_recomputes_the_samplers_logprobs_on_left_padded_batch(attention):
  """PPO ratio 1 at the first step: the update's log-probs (steps.make_logprob_fn) of a
  freshly sampled batch with mixed prompt lengths equal the sampler's, through the one
  definition of padding and positions (models.positions)."""
  from dmpo_jax.training import steps

  model = tiny_model(scale=3.0, attention=attention)
  prompts = random_prompts(4, 1, 9, 61, seed=7)  # lengths differ: 1..9 tokens
  assert len({len(p) for p in prompts}) > 2
  r, t, temp = 3, 10, 0.8
  tokens, pmask = sampling.pad_prompts(prompts, prompt_length=11)  # extra padding for all
  graphdef, params = nnx.split(model)
  cfg = sampling.SamplingConfig(max_new_tokens=t, num_samples=r, temperature=temp)
  out = sampling.sample(graphdef, params, jnp.asarray(tokens), jnp.asarray(pmask),
                        jax.random.key(3), cfg)
  seqs = {"tokens": jnp.concatenate([jnp.repeat(tokens, r, 0), out.tokens], axis=1),
          "prompt_mask": jnp.repeat(jnp.asarray(pmask), r, 0)}
  fn = jax.jit(steps.make_logprob_fn(graphdef, 11, temperature=temp, entropy=False))
  new = fn({"model": params}, seqs)["logprobs"]
  mask = np.asarray(out.mask, bool)
  ratio = np.exp(np.asarray(new) - np.asarray(out.logprobs))[mask]
  assert mask.sum() > 20
  np.testing.assert_allclose(ratio, 1.0, atol=1e-5)
  # The offsets matter: the same tokens without the left padding's offsets differ.
  wrong = {"tokens": seqs["tokens"], "prompt_mask": jnp.ones_like(seqs["prompt_mask"])}
  assert np.abs(np.asarray(fn({"model": params}, wrong)["logprobs"]) - new)[mask].max() > 1e-3
