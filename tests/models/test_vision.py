"""Qwen2.5-VL foundations: the vision tower, its checkpoint loader, multimodal positions and
rotary tables, and the processor wrapper, against transformers (PyTorch, CPU)."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dmpo_jax.models import mrope, vision
from dmpo_jax.models.hf import CheckpointError
from dmpo_jax.models.config import ModelConfig
from dmpo_jax.models.transformer import rope, rope_tables
from dmpo_jax.models.vl_processor import VLProcessor
from tests.helpers import checkpoint_tensors, save_tiny_vl_processor, tiny_vl_hf_config, write_checkpoint

IMAGE, START, END = 99, 97, 98  # image-pad, vision-start, vision-end token ids of the tiny model
GRIDS = np.array([[1, 4, 6], [1, 8, 8]])  # patches: 24 and 64; merged tokens: 6 and 16


def _tiny_hf_config():
  return tiny_vl_hf_config(start=START, image=IMAGE, end=END)


@pytest.fixture(scope="module")
def hf_vl(tmp_path_factory):
  """A random tiny transformers Qwen2.5-VL (weights perturbed so that every tensor matters),
  saved by save_pretrained; returns (torch model, folder)."""
  import torch
  from transformers import Qwen2_5_VLForConditionalGeneration

  torch.manual_seed(0)
  model = Qwen2_5_VLForConditionalGeneration(_tiny_hf_config()).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  path = str(tmp_path_factory.mktemp("tiny_vl"))
  model.save_pretrained(path)
  return model, path


def _pixels(n, dim, seed=0):
  return np.random.RandomState(seed).randn(n, dim).astype(np.float32)


def _reference(model, pixels, grids):
  import torch

  with torch.no_grad():
    out = model.model.visual(torch.tensor(pixels), grid_thw=torch.tensor(grids))
  return out.pooler_output.numpy()


BUDGET = 100  # patches: GRIDS take 88


def _jitted(tower):
  """tower(pixels, layout) jitted; counts traces."""
  graphdef, state = nnx.split(tower)
  traces = []

  @jax.jit
  def run(state, pixels, layout):
    traces.append(1)
    return nnx.merge(graphdef, state)(pixels, layout)

  return lambda pixels, layout: run(state, jnp.asarray(pixels), layout), traces


def _padded(pixels, budget):
  out = np.zeros((budget, pixels.shape[1]), pixels.dtype)
  out[:len(pixels)] = pixels
  return out


@pytest.fixture(scope="module")
def f32_tower(hf_vl):
  """(tower loaded from the saved folder, its jitted call, the trace counter)."""
  tower = vision.load_vision(hf_vl[1])
  return (tower, *_jitted(tower))


def test_vision_tower_matches_transformers_on_two_images(hf_vl, f32_tower):
  model, path = hf_vl
  tower, run, traces = f32_tower
  cfg = tower.cfg
  assert cfg.fullatt_block_indexes == (1,) and cfg.depth == 3
  n = vision.num_patches(GRIDS)
  pixels = _pixels(n, cfg.patch_dim)
  ref = _reference(model, pixels, GRIDS)  # [22, 40]
  budget = BUDGET  # 3 merged tokens of padding
  layout = vision.vision_layout(GRIDS, cfg, budget)
  # Windows really split the images: 2 + 4 windows, against 2 frames for full attention.
  assert len(set(layout["window_seg"][:n])) == 6 and len(set(layout["full_seg"][:n])) == 2
  ours = np.asarray(run(_padded(pixels, budget), layout))
  err = np.abs(ours[:len(ref)] - ref).max()
  print(f"vision tower f32 max abs diff vs transformers: {err:.2e}")
  assert err < 1e-4
  assert not ours[len(ref):].any()  # padding rows are zero
  # Another pair of images with the same budget: same compiled function, still exact.
  grids2 = np.array([[1, 6, 4], [1, 4, 4], [1, 4, 8], [1, 2, 2]])  # 24 + 16 + 32 + 4 patches
  pixels2 = _pixels(vision.num_patches(grids2), cfg.patch_dim, seed=1)
  ours2 = np.asarray(run(_padded(pixels2, budget), vision.vision_layout(grids2, cfg, budget)))
  ref2 = _reference(model, pixels2, grids2)
  err2 = np.abs(ours2[:len(ref2)] - ref2).max()
  print(f"four other images, same budget: {err2:.2e}")
  assert err2 < 1e-4
  # Window attention matters here: attending over whole frames in every block instead
  # (window segments = frame segments) gives other features.
  no_windows = dict(layout, window_seg=layout["full_seg"])
  assert np.abs(np.asarray(run(_padded(pixels, budget), no_windows))[:len(ref)] - ref).max() > 1e-3
  assert len(traces) == 1


@pytest.mark.slow  # its own compile: ~8 s on the shared 2-core machine
def test_vision_tower_bfloat16(hf_vl):
  model, path = hf_vl
  tower = vision.load_vision(path, dtype="bfloat16")
  assert tower.blocks[0].attn.q[...].dtype == jnp.bfloat16
  n = vision.num_patches(GRIDS)
  pixels = _pixels(n, tower.cfg.patch_dim)
  out = _jitted(tower)[0](pixels, vision.vision_layout(GRIDS, tower.cfg))
  assert out.dtype == jnp.bfloat16
  ref = _reference(model, pixels, GRIDS)
  # bf16 keeps 8 bits of mantissa: a few 2^-8 relative per op over 3 blocks.
  err = np.abs(np.asarray(out, np.float32) - ref).max()
  print(f"vision tower bf16 max abs diff vs transformers f32: {err:.2e} (range {np.abs(ref).max():.2f})")
  assert err < 0.05 * np.abs(ref).max()


def test_every_vision_parameter_has_logical_axes():
  cfg = vision.VisionConfig(depth=2, hidden_size=16, intermediate_size=24, num_heads=2,
                            out_hidden_size=8, fullatt_block_indexes=(1,))
  tower = nnx.eval_shape(lambda: vision.VisionTower(cfg, rngs=nnx.Rngs(0)))
  leaves = jax.tree.leaves(nnx.state(tower, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))
  assert leaves
  for leaf in leaves:
    names = leaf.get_metadata().get("out_sharding")
    assert names is not None and len(names) == len(leaf.get_value().shape)


def _flat_config(nested):
  """The released checkpoints' config.json layout: text fields at the top level, mrope in
  rope_scaling, and the older vision field names."""
  flat = {k: v for k, v in nested.items() if k != "text_config"}
  text = dict(nested["text_config"])
  rope_params = text.pop("rope_parameters")
  flat.update(text, model_type="qwen2_5_vl", rope_theta=rope_params["rope_theta"],
              rope_scaling={"type": "mrope", "mrope_section": rope_params["mrope_section"]})
  vc = dict(flat["vision_config"], model_type="qwen2_5_vl", in_chans=3,
            spatial_patch_size=flat["vision_config"]["patch_size"])
  vc.pop("in_channels")
  vc.pop("rope_parameters")
  flat["vision_config"] = vc
  return flat


def test_load_both_checkpoint_layouts(hf_vl, tmp_path):
  from transformers import Qwen2_5_VLForConditionalGeneration

  model, path = hf_vl
  with open(os.path.join(path, "config.json")) as f:
    nested = json.load(f)
  tensors = checkpoint_tensors(path)
  assert any(k.startswith("visual.") for k in tensors)  # what transformers 5 writes today
  first = vision.load_vision(path)
  # The transformers-5 module layout (model.visual.*, model.language_model.*), which
  # transformers itself reads back to the same weights.
  renamed = {("model." + k if k.startswith("visual.") else
              k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
             for k, v in tensors.items()}
  write_checkpoint(str(tmp_path / "nested"), nested, renamed)
  again = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(tmp_path / "nested"))
  for name, value in again.state_dict().items():
    np.testing.assert_array_equal(value.numpy(), model.state_dict()[name].numpy(), err_msg=name)
  second = vision.load_vision(str(tmp_path / "nested"))
  # The released layout: flat config (rope_scaling type mrope, in_chans) and visual.*.
  write_checkpoint(str(tmp_path / "flat"), _flat_config(nested), tensors)
  third = vision.load_vision(str(tmp_path / "flat"))
  assert first.cfg == second.cfg == third.cfg
  a, b, c = (jax.tree.leaves(nnx.state(t, nnx.Param)) for t in (first, second, third))
  assert len(a) == 3 * 16 + 5 + 1
  for x, y, z in zip(a, b, c):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    np.testing.assert_array_equal(np.asarray(x), np.asarray(z))
  # Loading from a name -> array dict: only the vision tensors are read.
  direct = vision.load_vision_params(renamed, first.cfg)
  for x, y in zip(a, jax.tree.leaves(nnx.state(direct, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_bad_checkpoints_name_the_tensor_or_field(hf_vl):
  _, path = hf_vl
  with open(os.path.join(path, "config.json")) as f:
    hf_cfg = json.load(f)
  cfg = vision.vision_config_from_hf(hf_cfg)
  tensors = checkpoint_tensors(path)
  missing = {k: v for k, v in tensors.items() if k != "visual.blocks.2.norm2.weight"}
  with pytest.raises(CheckpointError, match=r"visual\.blocks\.2\.norm2\.weight is missing"):
    vision.load_vision_params(missing, cfg)
  extra = dict(tensors, **{"visual.blocks.3.norm1.weight": np.ones(32, np.float32)})
  with pytest.raises(CheckpointError, match=r"unexpected vision tensor.*visual\.blocks\.3\.norm1"):
    vision.load_vision_params(extra, cfg)
  wrong = dict(tensors, **{"visual.merger.mlp.2.weight": np.ones((41, 128), np.float32)})
  with pytest.raises(CheckpointError, match=r"visual\.merger\.mlp\.2\.weight has shape \(41, 128\)"):
    vision.load_vision_params(wrong, cfg)
  with pytest.raises(CheckpointError, match="no vision tensors"):
    vision.load_vision_params({k: v for k, v in tensors.items() if "visual" not in k}, cfg)
  for field, value in (("hidden_act", "gelu_pytorch_tanh"), ("model_type", "qwen2_vl"),
                       ("embed_dim", 1280), ("patch_size", [14, 14]),
                       ("out_hidden_size", 64), ("fullatt_block_indexes", [3]),
                       ("in_chans", 4)):  # disagrees with in_channels = 3
    bad = dict(hf_cfg, vision_config=dict(hf_cfg["vision_config"], **{field: value}))
    with pytest.raises(CheckpointError, match=rf"vision_config.*{field}"):
      vision.vision_config_from_hf(bad)
  with pytest.raises(CheckpointError, match="vision_config"):
    vision.vision_config_from_hf({"model_type": "qwen2"})


def test_layout_refuses_bad_grids_and_budgets():
  cfg = vision.VisionConfig(depth=1, hidden_size=16, intermediate_size=16, num_heads=2,
                            out_hidden_size=8, fullatt_block_indexes=())
  with pytest.raises(ValueError, match="patch budget of 80"):
    vision.vision_layout(GRIDS, cfg, budget=80)
  with pytest.raises(ValueError, match="multiple of spatial_merge_size"):
    vision.vision_layout(GRIDS, cfg, budget=90)
  with pytest.raises(ValueError, match=r"image_grid_thw\[1\]"):
    vision.vision_layout([[1, 4, 4], [1, 5, 4]], cfg)


@pytest.mark.parametrize("grids", [[[1, 4, 6], [1, 8, 8]], [[2, 6, 10], [1, 2, 2], [3, 8, 4]]])
def test_layout_matches_transformers_indices(grids):
  """Window order, window and frame boundaries and rotary positions equal transformers' own
  (incl. frames t > 1 and grids that windows divide exactly or not)."""
  import torch
  from transformers import vision_utils as vu

  cfg = vision.VisionConfig(depth=1, hidden_size=16, intermediate_size=16, num_heads=2,
                            window_size=56, out_hidden_size=8, fullatt_block_indexes=())
  g = torch.tensor(grids)
  n = vision.num_patches(grids)
  layout = vision.vision_layout(grids, cfg, n + 8)
  window_index, cu_windows = vu.get_vision_window_index(g, 2, 56, 14)
  np.testing.assert_array_equal(layout["restore"][:n // 4], np.argsort(window_index.numpy()))
  np.testing.assert_array_equal(layout["order"][:n].reshape(-1, 4)[:, 0] // 4, window_index.numpy())
  starts = lambda seg: np.flatnonzero(np.diff(np.concatenate([[-2], seg[:n]])))
  np.testing.assert_array_equal(starts(layout["window_seg"]), cu_windows.numpy()[:-1])
  np.testing.assert_array_equal(starts(layout["full_seg"]),
                                vu.get_vision_cu_seqlens(g).numpy()[:-1])
  positions = vu.get_vision_position_ids(g, 2).numpy()
  np.testing.assert_array_equal(layout["positions"][:n], positions[layout["order"][:n]])
  assert (layout["window_seg"][n:] == -1).all() and not layout["valid"][n // 4:].any()


def _mm_batch():
  """Two left-padded text-image-text prompts of different lengths (the second with two
  images) and a text-only prompt; the images of GRIDS plus a 2 x 2-merged one."""
  merged = [int(g.prod()) // 4 for g in GRIDS] + [4]  # 6, 16, 4 image-pad tokens
  rows = [[5, 6, START] + [IMAGE] * merged[0] + [END, 7, 8, 9],
          [5, START] + [IMAGE] * merged[1] + [END, 10, START] + [IMAGE] * merged[2] + [END, 11],
          [5, 6, 7, 8]]
  length = max(map(len, rows))
  ids = np.zeros((len(rows), length), np.int64)
  mask = np.zeros_like(ids)
  for i, r in enumerate(rows):
    ids[i, length - len(r):] = r
    mask[i, length - len(r):] = 1
  return ids, mask, np.concatenate([GRIDS, [[1, 4, 4]]])


def test_rope_index_matches_transformers(hf_vl):
  import torch

  model, _ = hf_vl
  ids, mask, grids = _mm_batch()
  ours, deltas = mrope.rope_index(ids, grids, image_token_id=IMAGE, spatial_merge_size=2,
                                  attention_mask=mask)
  ref, ref_deltas = model.model.get_rope_index(
      torch.tensor(ids), mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)),
      image_grid_thw=torch.tensor(grids), attention_mask=torch.tensor(mask))
  np.testing.assert_array_equal(ours, ref.numpy())
  np.testing.assert_array_equal(deltas, ref_deltas.numpy().reshape(-1))
  # Hand check on row 0 (6 merged tokens as 2 x 3): text 0..2, image t=3, h=3..4, w=3..5,
  # then text from 3 + max(2, 3) = 6.
  row = ours[:, 0, mask[0].astype(bool)]
  assert row[:, 3:9].tolist() == [[3] * 6, [3, 3, 3, 4, 4, 4], [3, 4, 5, 3, 4, 5]]
  assert row[:, 9].tolist() == [6, 6, 6]
  with pytest.raises(ValueError, match="more than the prompts"):
    mrope.rope_index(ids, np.concatenate([grids, grids]), image_token_id=IMAGE,
                     spatial_merge_size=2, attention_mask=mask)


def test_mrope_tables_match_transformers(hf_vl):
  import torch
  from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as ref_mod

  model, _ = hf_vl
  text_cfg = model.config.text_config
  h = text_cfg.hidden_size // text_cfg.num_attention_heads  # 10: mrope_section [2, 1, 2]
  ids, mask, grids = _mm_batch()
  positions, _ = mrope.rope_index(ids, grids, image_token_id=IMAGE, spatial_merge_size=2,
                                  attention_mask=mask)
  q = np.random.RandomState(0).randn(ids.shape[0], ids.shape[1], 4, h).astype(np.float32)
  # One jitted function for all our tables (eager, each op compiles on its own: ~5 s).
  rotate = jax.jit(lambda pos, x: rope(x, mrope.mrope_tables(pos, h, 10000.0, (2, 1, 2))))
  ours = np.asarray(rotate(positions, q))  # [B, L, N, H]
  rotary = ref_mod.Qwen2_5_VLRotaryEmbedding(text_cfg)
  qt = torch.tensor(q).transpose(1, 2)  # [B, N, L, H]
  cos, sin = rotary(qt, torch.tensor(positions, dtype=torch.long))
  apply = getattr(ref_mod, "apply_multimodal_rotary_pos_emb", ref_mod.apply_rotary_pos_emb)
  ref, _ = apply(qt, qt, cos, sin)
  np.testing.assert_allclose(ours, ref.transpose(1, 2).numpy(), atol=1e-5, rtol=0)
  # Equal streams are plain RoPE: text-only prompts are unchanged.
  plain = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  same = rotate(np.stack([plain] * 3), q)
  np.testing.assert_allclose(np.asarray(same), np.asarray(rope(jnp.asarray(q), rope_tables(
      jnp.asarray(plain), ModelConfig(vocab_size=1, hidden_size=h, intermediate_size=1, num_layers=1,
                                      num_heads=1, num_kv_heads=1, rope_theta=10000.0)))), atol=1e-6)
  with pytest.raises(ValueError, match="mrope_section"):
    mrope.mrope_tables(positions, h, 10000.0, [2, 2, 2])


def test_processor_feeds_the_tower(f32_tower, tmp_path):
  tower, run, _ = f32_tower
  folder = str(tmp_path / "proc")
  save_tiny_vl_processor(folder, tower.cfg)
  proc = VLProcessor.from_folder(folder, patch_budget=128)
  proc.check_vision_config(tower.cfg)
  rng = np.random.RandomState(0)
  images = [rng.randint(0, 256, (60, 90, 3), np.uint8), rng.randint(0, 256, (112, 112, 3), np.uint8)]
  slot = "<|vision_start|><|image_pad|><|vision_end|>"
  out = proc(f"describe {slot} the graph {slot} answer :", images)
  direct = proc.image_processor(images=images, return_tensors="np")
  np.testing.assert_array_equal(out["pixel_values"], direct["pixel_values"])
  np.testing.assert_array_equal(out["image_grid_thw"], direct["image_grid_thw"])
  grids = out["image_grid_thw"]
  counts = [int(g.prod()) // 4 for g in grids]
  tok = proc.tokenizer.convert_tokens_to_ids
  pad, start = tok("<|image_pad|>"), tok("<|vision_start|>")
  ids = out["input_ids"]
  assert (ids == pad).sum() == sum(counts)
  begins = np.flatnonzero(ids == start) + 1
  for b, n in zip(begins, counts):  # each span is exactly its image's merged patches
    assert (ids[b:b + n] == pad).all() and ids[b + n] != pad
  assert ids[0] == tok("describe") and ids[-1] == tok(":")
  layout = vision.vision_layout(grids, tower.cfg, BUDGET)
  features = np.asarray(run(_padded(out["pixel_values"], BUDGET), layout))
  k = sum(counts)  # one feature per image-pad token, then zero padding
  assert layout["valid"].sum() == k and np.abs(features[:k]).sum(1).all() and not features[k:].any()
  # Bad input: over the patch budget, wrong number of images, missing files.
  small = VLProcessor.from_folder(folder, patch_budget=40)
  with pytest.raises(ValueError, match="patch budget of 40"):
    small(f"describe {slot}", images[1:])
  with pytest.raises(ValueError, match="2 image token"):
    proc(f"{slot} {slot}", images[:1])
  no_proc = str(tmp_path / "no_proc")
  shutil.copytree(folder, no_proc)
  os.remove(os.path.join(no_proc, "preprocessor_config.json"))
  with pytest.raises(CheckpointError, match="preprocessor_config.json is missing"):
    VLProcessor.from_folder(no_proc)
  no_tok = str(tmp_path / "no_tok")
  shutil.copytree(folder, no_tok)
  for f in ("tokenizer.json", "tokenizer_config.json"):
    os.remove(os.path.join(no_tok, f))
  with pytest.raises(CheckpointError, match="no tokenizer file"):
    VLProcessor.from_folder(no_tok)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump({"image_token_id": pad + 1}, f)
  with pytest.raises(CheckpointError, match=f"image_token_id={pad + 1}"):
    VLProcessor.from_folder(folder)
