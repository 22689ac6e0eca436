"""Sampling and updating a Qwen2.5-VL with image prompts: greedy tokens equal transformers'
`generate`, log-probs equal a full forward with the same images, one compilation for
same-shape calls, the update recomputes the sampler's log-probs, and freezing the tower."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dmpo_jax import sampling
from dmpo_jax.training import steps
from dmpo_jax.models import hf, qwen2_5_vl, vision
from dmpo_jax.objectives import presets
from dmpo_jax.sampling import sampler as sampler_lib
from tests.helpers import END, IMAGE, START, tiny_config

C = 3 * 2 * 14 * 14  # pixel values per patch of the tiny config


@pytest.fixture(scope="module")
def vl(tiny_vl):
  """(torch model, our model) of the session's tiny Qwen2.5-VL folder (conftest.py)."""
  torch_model, path = tiny_vl
  model, _ = hf.load(path)
  return torch_model, model


def _prompts(grids, seed):
  """Text-image-text prompts (one image each, of `grids`; None: text only) and their
  images as the image processor gives them."""
  rng = np.random.RandomState(seed)
  prompts, images = [], []
  for i, g in enumerate(grids):
    if g is None:
      prompts.append([2, 3, 10 + seed, 11 + i])
      images.append(None)
      continue
    g = np.asarray([g], np.int64)
    prompts.append([2, 3 + i, START] + [IMAGE] * (vision.num_patches(g) // 4) + [END, 4, 10 + seed])
    images.append({"pixel_values": rng.randn(vision.num_patches(g), C).astype(np.float32),
                   "image_grid_thw": g})
  return prompts, images


def _full_forward(model, rows, row_images):
  """Logits [B, L, V] of one forward (no cache) of left-padded rows (prompt + completion)
  with each row's image, through the model's own path (all images packed in one budget)."""
  ids, mask = sampler_lib.pad_prompts(rows)
  with_image = [x for x in row_images if x is not None]
  grids = np.concatenate([x["image_grid_thw"] for x in with_image])
  inp = model.prepare(ids, grids, attention_mask=mask)
  pixels = np.concatenate([x["pixel_values"] for x in with_image])
  logits = jax.jit(model.__call__)(jnp.asarray(ids), pixels, inp["layout"], inp["positions"],
                                   offsets=inp["offsets"])
  return np.asarray(logits), mask


@pytest.mark.slow  # transformers' generate and one compile: ~10 s on the 2-core CPU
def test_greedy_equals_transformers_generate(vl):
  import torch

  torch_model, model = vl
  prompts, images = _prompts([(1, 4, 6), (1, 8, 8)], seed=0)  # 6 and 16 image tokens
  new = 8
  out = sampling.generate(model, prompts, rng=jax.random.key(0), max_new_tokens=new, greedy=True,
                          images=images)
  ids, mask = sampler_lib.pad_prompts(prompts)
  p = ids.shape[1]
  with torch.no_grad():  # mm_token_type_ids: without it transformers uses 1-D positions
    ref = torch_model.generate(
        input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
        pixel_values=torch.tensor(np.concatenate([x["pixel_values"] for x in images])),
        image_grid_thw=torch.tensor(np.concatenate([x["image_grid_thw"] for x in images])),
        mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)),
        max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
  np.testing.assert_array_equal(np.asarray(out.tokens), ref[:, p:].numpy())
  # The images matter: other pixel values give other tokens.
  other = [dict(x, pixel_values=-x["pixel_values"]) for x in images]
  flipped = sampling.generate(model, prompts, rng=jax.random.key(0), max_new_tokens=new,
                              greedy=True, images=other)
  assert (np.asarray(flipped.tokens) != np.asarray(out.tokens)).any()


@pytest.mark.slow  # two compiles: ~10 s on the 2-core CPU
def test_logprobs_equal_full_forward_with_images(vl):
  """The cached decode (prefix per prompt, samples sharing it, multimodal decode positions)
  against a forward of the whole sequence without a cache: the reported log-probs are
  log_softmax(logits / temperature) at the sampled tokens."""
  _, model = vl
  prompts, images = _prompts([(1, 8, 8), None, (1, 4, 6)], seed=1)
  temperature, r, new = 0.8, 2, 6
  out = sampling.generate(model, prompts, rng=jax.random.key(3), max_new_tokens=new,
                          num_samples=r, temperature=temperature, images=images)
  tokens, logp = np.asarray(out.tokens), np.asarray(out.logprobs)
  assert np.asarray(out.mask).min() == 1
  assert (tokens != IMAGE).all()  # (a generated image-pad token would be an image here)
  rows = [prompts[b // r] + tokens[b].tolist() for b in range(len(tokens))]
  logits, mask = _full_forward(model, rows, [images[b // r] for b in range(len(tokens))])
  lengths = mask.sum(1)
  worst = 0.0
  for b in range(len(tokens)):
    end = mask.shape[1]  # rows are left-padded: the completion is the last `new` slots
    row = logits[b, end - new - 1:end - 1] / temperature
    want = np.asarray(jax.nn.log_softmax(row, axis=-1))[np.arange(new), tokens[b]]
    worst = max(worst, float(np.abs(logp[b] - want).max()))
  assert lengths.min() < lengths.max()  # the rows were padded differently
  print(f"VL sampler log-probs vs full forward: max abs diff {worst:.2e}")
  assert worst < 1e-5


@pytest.mark.slow  # one compile: ~8 s on the 2-core CPU
def test_one_trace_for_same_shape_calls(vl):
  _, model = vl
  kw = dict(rng=jax.random.key(0), max_new_tokens=4, greedy=True, prompt_length=24,
            patch_budget=64)
  before = sampler_lib.sample._cache_size()
  prompts, images = _prompts([(1, 4, 6), (1, 8, 8)], seed=2)
  first = sampling.generate(model, prompts, images=images, **kw)
  other = _prompts([(1, 4, 4), None], seed=3)  # other sizes, a text-only prompt
  second = sampling.generate(model, other[0], images=other[1], **kw)
  assert sampler_lib.sample._cache_size() == before + 1
  assert first.tokens.shape == second.tokens.shape == (2, 4)


def test_bad_images_are_refused():
  # Refused on the host before anything runs: an abstract model of the tiny shapes suffices.
  vc = vision.VisionConfig(depth=1, hidden_size=32, intermediate_size=48, num_heads=2,
                           window_size=56, out_hidden_size=40, fullatt_block_indexes=())
  cfg = qwen2_5_vl.VLConfig(tiny_config(hidden_size=40, vocab_size=101, mrope_section=(2, 1, 2)),
                            vc, image_token_id=IMAGE)
  model = nnx.eval_shape(lambda: qwen2_5_vl.Qwen2_5_VL(cfg, rngs=nnx.Rngs(0)))
  kw = dict(rng=jax.random.key(0), max_new_tokens=4, greedy=True, patch_budget=64)
  prompts, images = _prompts([(1, 4, 6), (1, 8, 8)], seed=2)
  with pytest.raises(ValueError, match=r"prompt 1's images need 64 patches.*patch_budget=48"):
    sampling.generate(model, prompts, images=images, **dict(kw, patch_budget=48))
  with pytest.raises(ValueError, match=r"patch_budget=62 must be a positive multiple"):
    sampling.generate(model, prompts, images=images, **dict(kw, patch_budget=62))
  bad = [prompts[0], prompts[1][:-4] + prompts[1][-3:]]  # one image-pad token short
  with pytest.raises(ValueError, match="prompt 1 holds 15 image-pad tokens.*gives 16"):
    sampling.generate(model, bad, images=images, **kw)
  with pytest.raises(ValueError, match=r"images\[0\].pixel_values has shape"):
    sampling.generate(model, prompts, images=[dict(images[0], pixel_values=np.zeros((3, C))),
                                              images[1]], **kw)
  with pytest.raises(ValueError, match="images has 1 entries for 2 prompts"):
    sampling.generate(model, prompts, images=images[:1], **kw)


def _rl_batch(model, seed, r=2, new=6, temperature=0.8):
  """A freshly sampled RL batch of two image prompts and a text-only one, as the update sees
  it: seqs with "images", the sampler's log-probs, random rewards. (The shapes and settings
  of test_logprobs_equal_full_forward_with_images: the same compiled sampler.)"""
  prompts, images = _prompts([(1, 4, 6), None, (1, 8, 8)], seed=seed)
  out = sampling.generate(model, prompts, rng=jax.random.key(seed), max_new_tokens=new,
                          num_samples=r, temperature=temperature, images=images, patch_budget=64)
  tokens, mask = sampler_lib.pad_prompts(prompts)
  inputs = qwen2_5_vl.prompt_images(model.cfg, tokens, mask, images, patch_budget=64)
  bp, p = tokens.shape
  rows = lambda x: np.repeat(x, r, 0).reshape(bp, r, -1)
  seqs = {"tokens": jnp.concatenate([rows(tokens), np.asarray(out.tokens).reshape(bp, r, new)], -1),
          "prompt_mask": rows(mask), "images": inputs}
  rewards = np.random.RandomState(seed).rand(bp, r).astype(np.float32)
  return {"seqs": seqs, "mask": np.asarray(out.mask).reshape(bp, r, new),
          "old_logprobs": np.asarray(out.logprobs).reshape(bp, r, new), "rewards": rewards}, p


@pytest.mark.slow  # two update compiles: ~90 s on the contended 2-core CPU
def test_update_recomputes_sampler_logprobs_and_freezes_tower(vl):
  _, model = vl
  batch, p = _rl_batch(model, seed=4)
  graphdef, state = nnx.split(model)
  params = {"model": state}
  logprobs = jax.jit(steps.make_logprob_fn(graphdef, p, temperature=0.8))
  lp = logprobs(params, batch["seqs"])["logprobs"]
  err = float(np.abs(np.asarray(lp) - batch["old_logprobs"]).max())
  print(f"update log-probs with images vs the sampler's: max abs diff {err:.2e}")
  assert err < 1e-5  # the PPO ratio is 1 on a fresh batch
  # Without the image features the recomputed log-probs would differ.
  blind = dict(batch["seqs"], images=dict(batch["seqs"]["images"],
                                          pixel_values=0 * batch["seqs"]["images"]["pixel_values"]))
  assert np.abs(np.asarray(logprobs(params, blind)["logprobs"])
                - batch["old_logprobs"]).max() > 1e-3

  opt = optax.adam(1e-2)
  obj = presets.ObjectiveConfig()
  flat = lambda tree: {jax.tree_util.keystr(k): np.asarray(v)
                       for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
  before = flat(params)
  for freeze in (True, False):
    step = steps.make_rl_step(graphdef, obj, opt, p, 0.8, freeze_vision=freeze)
    start = jax.tree.map(jnp.array, params)  # the step donates its inputs
    new, _, metrics = step(start, opt.init(start), batch)
    assert int(metrics["skipped"]) == 0
    after = flat(new)
    moved = {k for k in before if not np.array_equal(before[k], after[k])}
    tower = {k for k in before if k.startswith("['model']['visual']")}
    assert len(tower) == 3 * 16 + 6 and moved - tower  # the language model learns
    if freeze:  # bit-identical tower
      assert not moved & tower
    else:  # every tower parameter gets a gradient through the features
      assert tower <= moved
