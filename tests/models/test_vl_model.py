"""Qwen2.5-VL (vision tower + text model with multimodal RoPE): full-logit parity against
transformers (PyTorch, CPU), `hf.load` of both checkpoint layouts, and bad input."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dmpo_jax.models import hf, qwen2_5_vl, vision
from dmpo_jax.models.hf import CheckpointError
from dmpo_jax.models.vl_processor import VLProcessor
from tests.helpers import END, IMAGE, START, checkpoint_tensors, write_checkpoint

GRIDS = np.array([[1, 4, 6], [1, 8, 8]])  # 24 + 64 patches; 6 + 16 merged tokens
BUDGET = 100  # patches per call (the images of a batch take at most 88)
LENGTH = 24  # slots per row


@pytest.fixture(scope="module")
def hf_vl(tiny_vl):
  """The session's tiny transformers Qwen2.5-VL folder (conftest.py): (torch model, folder)."""
  return tiny_vl


def _batch(grids, seed):
  """Two left-padded rows of LENGTH slots: text-image-text for each image of `grids` (row 0
  first), text only for a row without one."""
  rng = np.random.RandomState(seed)
  grids = np.array(grids, np.int64).reshape(-1, 3)
  merged = [int(g.prod()) // 4 for g in grids] + [0, 0]
  rows = [[2, 3, START] + [IMAGE] * merged[0] + [END, 4, 5, 6] if merged[0] else [2, 3, 4],
          [2, START] + [IMAGE] * merged[1] + [END, 10 + seed, 11] if merged[1] else
          [5, 6, 10 + seed, 11, 12]]
  ids = np.zeros((2, LENGTH), np.int32)
  mask = np.zeros_like(ids)
  for i, r in enumerate(rows):
    ids[i, LENGTH - len(r):] = r
    mask[i, LENGTH - len(r):] = 1
  pixels = rng.randn(vision.num_patches(grids), 3 * 2 * 14 * 14).astype(np.float32)
  return ids, mask, grids, pixels


def _reference(model, ids, mask, grids, pixels):
  import torch

  images = {"pixel_values": torch.tensor(pixels), "image_grid_thw": torch.tensor(grids)}
  with torch.no_grad():  # mm_token_type_ids: without it transformers uses 1-D positions
    out = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)),
                **(images if len(grids) else {}))
  return out.logits.numpy()


def _jitted(model):
  graphdef, state = nnx.split(model)
  traces = []

  @jax.jit
  def run(state, ids, pixels, layout, positions, offsets):
    traces.append(1)
    return nnx.merge(graphdef, state)(ids, pixels, layout, positions, offsets=offsets)

  def call(ids, mask, grids, pixels):
    inp = model.prepare(ids, grids, attention_mask=mask, patch_budget=BUDGET)
    padded = np.zeros((BUDGET, pixels.shape[1]), np.float32)
    padded[:len(pixels)] = pixels
    return np.asarray(run(state, jnp.asarray(ids), padded, inp["layout"], inp["positions"],
                          inp["offsets"]))

  return call, traces


@pytest.mark.slow
def test_logits_match_transformers(hf_vl):
  torch_model, path = hf_vl
  model, processor = hf.load(path)
  assert isinstance(model, qwen2_5_vl.Qwen2_5_VL) and isinstance(processor, VLProcessor)
  assert processor.image_token_id == model.cfg.image_token_id == IMAGE
  assert model.cfg.text.mrope_section == (2, 1, 2) and model.cfg.vision.fullatt_block_indexes == (1,)
  run, traces = _jitted(model)
  worst = 0.0
  # Batches of different image sizes (the second swaps which row has the large image), one
  # image and a text-only row, text only: one compilation serves all.
  for seed, grids in ((0, GRIDS), (1, GRIDS[::-1]), (2, GRIDS[:1]), (3, GRIDS[:0])):
    ids, mask, grids, pixels = _batch(grids, seed)
    ref = _reference(torch_model, ids, mask, grids, pixels)
    ours = run(ids, mask, grids, pixels)
    real = mask.astype(bool)  # pad slots' logits are undefined in both
    err = float(np.abs(ours[real] - ref[real]).max())
    worst = max(worst, err)
    assert err < 1e-4, err
  print(f"Qwen2.5-VL full logits f32 max abs diff vs transformers: {worst:.2e}")
  assert len(traces) == 1
  # The image features matter: with 1-D positions (what transformers silently does without
  # mm_token_type_ids) or with the images zeroed, the logits move well past the tolerance.
  ids, mask, grids, pixels = _batch(GRIDS, 0)
  ref = _reference(torch_model, ids, mask, grids, pixels)
  assert np.abs(run(ids, mask, grids, np.zeros_like(pixels))[mask > 0] - ref[mask > 0]).max() > 1e-3
  inp = model.prepare(ids, grids, attention_mask=mask, patch_budget=BUDGET)
  flat = np.broadcast_to(np.maximum(np.cumsum(mask, 1) - 1, 0), (3,) + ids.shape)
  assert (flat != inp["positions"]).any()  # text after an image continues past its extent


def _flat_config(nested):
  """The released checkpoints' layout: text fields at the top level, mrope in rope_scaling."""
  flat = {k: v for k, v in nested.items() if k != "text_config"}
  text = dict(nested["text_config"])
  rope = text.pop("rope_parameters")
  flat.update(text, model_type="qwen2_5_vl", rope_theta=rope["rope_theta"],
              rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]})
  return flat


def _params(model):
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_load_both_layouts_and_refuse_bad_checkpoints(hf_vl, tmp_path):
  _, path = hf_vl
  with open(os.path.join(path, "config.json")) as f:
    nested = json.load(f)
  tensors = checkpoint_tensors(path)
  assert any(k.startswith("model.layers.") for k in tensors)  # what save_pretrained writes
  first, _ = hf.load(path)
  # transformers-5 module names with the nested config; released names with the flat config.
  renamed = {("model." + k if k.startswith("visual.") else
              k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
             for k, v in tensors.items()}
  write_checkpoint(str(tmp_path / "nested"), nested, renamed)
  write_checkpoint(str(tmp_path / "flat"), _flat_config(nested), tensors)
  second, proc2 = hf.load(str(tmp_path / "nested"))
  third, _ = hf.load(str(tmp_path / "flat"))
  assert proc2 is None  # no tokenizer or image processor in that folder
  assert first.cfg == second.cfg == third.cfg
  a, b, c = _params(first), _params(second), _params(third)
  assert len(a) == 3 * 16 + 6 + 2 * 12 + 3  # tower; text: 2 layers, embed, norm, lm_head
  for x, y, z in zip(a, b, c):
    np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(x, z)
  # Bad checkpoints: the error names the tensor or the config field.
  cases = [
      (dict(nested, text_config=dict(nested["text_config"], use_sliding_window=True)),
       tensors, "use_sliding_window"),
      (dict(nested, text_config=dict(nested["text_config"], hidden_act="gelu")), tensors,
       "hidden_act"),
      (dict(nested, text_config=dict(nested["text_config"], rope_parameters={
          "rope_type": "yarn", "rope_theta": 1e4, "mrope_section": [2, 1, 2]})), tensors,
       r"text_config\.rope_parameters\.rope_type"),
      (dict(nested, text_config=dict(nested["text_config"], rope_parameters={
          "rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 2, 2]})), tensors,
       "mrope_section"),
      (_flat_config(nested) | {"rope_scaling": {"type": "mrope"}}, tensors,
       r"config\.rope_scaling\.mrope_section"),
      (dict(nested, vision_config=dict(nested["vision_config"], hidden_act="gelu")), tensors,
       r"vision_config\.hidden_act"),
      (nested, {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"},
       r"model\.layers\.1\.mlp\.up_proj\.weight is missing"),
      (nested, dict(tensors, **{"model.layers.2.mlp.up_proj.weight": np.ones(3, np.float32)}),
       r"unexpected tensor.*model\.layers\.2\.mlp\.up_proj"),
  ]
  for i, (config, tens, message) in enumerate(cases):
    write_checkpoint(str(tmp_path / f"bad{i}"), config, tens)
    with pytest.raises(CheckpointError, match=message):
      hf.load(str(tmp_path / f"bad{i}"))
  # A folder with a tokenizer but no image processor.
  os.remove(os.path.join(str(tmp_path / "bad0"), "model.safetensors"))
  broken = str(tmp_path / "no_image_processor")
  write_checkpoint(broken, nested, tensors)
  with open(os.path.join(path, "tokenizer.json")) as f, \
       open(os.path.join(broken, "tokenizer.json"), "w") as g:
    g.write(f.read())
  with pytest.raises(CheckpointError, match="preprocessor_config.json is missing"):
    hf.load(broken)
  # An image processor without a tokenizer; one whose merge size the tower does not use.
  os.remove(os.path.join(broken, "tokenizer.json"))
  with open(os.path.join(path, "preprocessor_config.json")) as f:
    processor_cfg = json.load(f)
  with open(os.path.join(broken, "preprocessor_config.json"), "w") as f:
    json.dump(processor_cfg, f)
  with pytest.raises(CheckpointError, match="no tokenizer file"):
    hf.load(broken)
  for name in os.listdir(path):
    if name.startswith(("tokenizer", "special_tokens")):
      with open(os.path.join(path, name)) as f, open(os.path.join(broken, name), "w") as g:
        g.write(f.read())
  with open(os.path.join(broken, "preprocessor_config.json"), "w") as f:
    json.dump(dict(processor_cfg, merge_size=4), f)
  with pytest.raises(ValueError, match=r"vision_config\.spatial_merge_size=2 differs.*merge_size=4"):
    hf.load(broken)
  # A Qwen2-VL checkpoint: its vision tower (LayerNorm, no windows) is another architecture.
  qwen2_vl = dict(nested, vision_config=dict(nested["vision_config"], model_type="qwen2_vl",
                                             embed_dim=32, mlp_ratio=4))
  write_checkpoint(str(tmp_path / "qwen2_vl"), qwen2_vl, tensors)
  with pytest.raises(CheckpointError, match=r"vision_config\.model_type='qwen2_vl'"):
    hf.load(str(tmp_path / "qwen2_vl"))


def test_prepare_refuses_mismatched_images(hf_vl):
  model, _ = hf.load(hf_vl[1])
  ids, mask, grids, _ = _batch(GRIDS, 0)
  with pytest.raises(ValueError, match="22 image-pad tokens.*gives 16"):
    model.prepare(ids, grids[1:], attention_mask=mask, patch_budget=BUDGET)
  with pytest.raises(ValueError, match="patch budget of 80"):
    model.prepare(ids, grids, attention_mask=mask, patch_budget=80)


@pytest.mark.slow
def test_save_opens_in_transformers(hf_vl, tmp_path):
  from transformers import Qwen2_5_VLForConditionalGeneration

  torch_model, path = hf_vl
  model, processor = hf.load(path)
  out = str(tmp_path / "saved")
  hf.save(model, processor, out)
  again = Qwen2_5_VLForConditionalGeneration.from_pretrained(out).eval()
  assert again.config.text_config.rope_parameters["mrope_section"] == [2, 1, 2]
  assert again.config.vision_config.fullatt_block_indexes == [1]
  ref = torch_model.state_dict()
  assert set(again.state_dict()) == set(ref)
  for name, value in again.state_dict().items():  # every weight round-trips exactly
    np.testing.assert_array_equal(value.numpy(), ref[name].numpy(), err_msg=name)
  ids, mask, grids, pixels = _batch(GRIDS, 0)
  run, _ = _jitted(model)
  ours = run(ids, mask, grids, pixels)
  theirs = _reference(again, ids, mask, grids, pixels)
  err = float(np.abs(ours[mask > 0] - theirs[mask > 0]).max())
  print(f"save -> transformers load: logits max abs diff {err:.2e}")
  assert err < 1e-4
  reloaded, proc = hf.load(out)  # and back: the same model and processor
  assert reloaded.cfg == model.cfg and proc.image_token_id == IMAGE
  for x, y in zip(_params(model), _params(reloaded)):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow  # its own compile
def test_bfloat16_logits_and_logical_axes(hf_vl):
  torch_model, path = hf_vl
  model, _ = hf.load(path, dtype="bfloat16")
  assert model.language.layers[0].attn.q[...].dtype == jnp.bfloat16
  assert model.visual.blocks[0].attn.q[...].dtype == jnp.bfloat16
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))
  assert len(leaves) == 3 * 16 + 6 + 2 * 12 + 3
  for leaf in leaves:  # every loaded parameter keeps its logical axis names for sharding
    names = leaf.get_metadata().get("out_sharding")
    assert names is not None and len(names) == len(leaf.get_value().shape)
  ids, mask, grids, pixels = _batch(GRIDS, 0)
  ours = _jitted(model)[0](ids, mask, grids, pixels)
  ref = _reference(torch_model, ids, mask, grids, pixels)
  # bf16 keeps 8 bits of mantissa: a few 2^-8 relative per op over 3 + 2 blocks.
  err = float(np.abs(ours[mask > 0] - ref[mask > 0]).max())
  print(f"Qwen2.5-VL bf16 logits max abs diff vs transformers f32: {err:.2e} "
        f"(range {np.abs(ref[mask > 0]).max():.2f})")
  assert err < 0.05 * np.abs(ref[mask > 0]).max()
