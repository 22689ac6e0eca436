"""MM-NP-Bench: image prompts, the render cache, the from-scratch VLM and its export."""

import json
import os
import re
import sys

import numpy as np
import pytest

from dmpo_jax.models import build as model_build
from dmpo_jax.data import images as mm
from dmpo_jax.data import pipeline
from dmpo_jax.training import specs
from dmpo_jax import tasks
from dmpo_jax import sampling
from tests.helpers import config_module, smoke

mm_nphard = config_module("mm_nphard")


@pytest.fixture(scope="module")
def smoke_vlm():
  """(config, VLConfig, processor) of the smoke config's from-scratch VLM (no weights)."""
  cfg = mm_nphard.get_config("smoke")
  vl_cfg, processor = model_build.vlm_config(specs.model_spec(cfg))
  return cfg, vl_cfg, processor


def _numbers(text: str) -> set[str]:
  return set(re.findall(r"\d+", text))


@pytest.mark.parametrize("style", tasks.IMAGE_STYLES)
def test_image_prompts_hold_no_instance_numbers(style):
  for key in tasks.names():
    task = tasks.get(key)
    a, b = task.generate(0, "tiny"), task.generate(1, "tiny")
    ta, tb = task.prompt(a, style), task.prompt(b, style)
    assert ta.count(tasks.IMAGE) == 1, key
    assert ta == tb, f"{key}: the {style} instruction depends on the instance"
    listed = _numbers(task.prompt(a, "compact")) | _numbers(task.prompt(b, "compact"))
    leaked = {n for n in _numbers(ta) & listed if len(n) > 1}
    assert not leaked, f"{key}: {style} prompt repeats instance numbers {leaked}"
    if style == "image":
      assert not _numbers(ta), f"{key}: {ta!r}"


def test_image_pad_count_matches_the_grid_and_cache_hits(smoke_vlm):
  from dmpo_jax.models import qwen2_5_vl
  cfg, vl_cfg, processor = smoke_vlm
  enc = mm.make_encoder(specs.encoder_spec(cfg), processor)
  items = pipeline.TaskSet(tasks.names(), "tiny", 0).held_out(1)
  pad = processor.image_token_id
  for key, q in items:
    ids = enc.encode(key, q)
    grid = enc.images(key, q)["image_grid_thw"]
    merge = cfg.model.vision["spatial_merge_size"]
    assert ids.count(pad) == int(np.prod(grid)) // merge ** 2, key
    assert len(ids) <= cfg.model.max_prompt_len
    # the ids are what the sampler's and the update's image inputs accept
    ids = np.asarray([ids])
    qwen2_5_vl.prompt_images(vl_cfg, ids, np.ones_like(ids), [enc.images(key, q)],
                             cfg.image.patch_budget)
  assert enc.cache.misses == len(items) and enc.cache.hits >= len(items)
  key, q = items[0]
  again = tasks.get(key).generate(pipeline.EVAL_SEED0, "tiny")  # held_out's first seed
  assert again == q and again is not q
  before = enc.cache.hits
  enc.images(key, again)  # an equal instance in another dict: a hit
  assert enc.cache.hits == before + 1 and enc.cache.misses == len(items)
  assert enc.cache.ms_per_instance > 0


def test_prefetch_renders_the_next_step_on_a_worker_thread(smoke_vlm):
  cfg, _, processor = smoke_vlm
  enc = mm.make_encoder(specs.encoder_spec(cfg), processor)
  ts = pipeline.TaskSet(["TSP", "knapsack"], "tiny", 0)
  pre = mm.Prefetch(enc)
  pre.warm(lambda: ts.train("sft", 1, 4))
  pre.wait()
  assert enc.cache.misses == 4 and enc.cache.hits == 0
  for key, q in ts.train("sft", 1, 4):  # the step's own draw: fresh dicts, cached renders
    enc.encode(key, q)
  assert enc.cache.misses == 4 and enc.cache.hits == 4
  pre.warm(lambda: [("TSP", "not an instance")])
  with pytest.raises(TypeError, match="TSP: instance must be a question dict"):
    pre.wait()  # a render error reaches the training thread
  pre.close()
  with pytest.raises(KeyError, match="in the block"):  # the block's own error, not the render's
    with mm.Prefetch(enc) as pre:
      pre.warm(lambda: [("TSP", "not an instance")])
      raise KeyError("in the block")
  assert pre._pool is None and pre._pending is None
  misses = enc.cache.misses
  with mm.Prefetch(enc) as pre:
    pre.warm(lambda: ts.train("sft", 2, 2))
  assert pre._pool is None and enc.cache.misses == misses + 2  # leaving the block waited for them
  text = mm.Prefetch(pipeline.PromptEncoder(processor.tokenizer, "compact", 64))
  text.warm(lambda: 1 / 0)  # text prompts: nothing to render, nothing runs
  text.wait()


def test_chat_template_keeps_the_image_span(smoke_vlm):
  """In a chat template (instruction models) the image markers stay single tokens."""
  import copy
  cfg, _, processor = smoke_vlm
  chat = copy.copy(processor)
  chat.tokenizer = copy.deepcopy(processor.tokenizer)
  chat.tokenizer.chat_template = ("{% for m in messages %}user: {{ m['content'] }}\n{% endfor %}"
                                  "{% if add_generation_prompt %}assistant: {% endif %}")
  cache = mm.ImageCache(chat, cfg.image.size)
  enc = mm.ImagePromptEncoder(chat, "npbench_image", 10**9, True, cache=cache)
  key, q = "knapsack", tasks.get("knapsack").generate(0, "tiny")
  ids = enc.encode(key, q)
  n = processor.num_image_tokens(enc.images(key, q)["image_grid_thw"])[0]
  assert ids.count(processor.image_token_id) == n
  start = ids.index(chat.tokenizer.convert_tokens_to_ids(mm.MARKERS[0]))
  assert ids[start + 1:start + 1 + n] == [processor.image_token_id] * n
  assert ids[start + 1 + n] == chat.tokenizer.convert_tokens_to_ids(mm.MARKERS[1])
  assert chat.tokenizer.decode(ids, skip_special_tokens=True).endswith("assistant: ")


def test_blank_control_keeps_ids_and_grid_and_drops_the_instance(smoke_vlm):
  cfg, _, processor = smoke_vlm
  enc = mm.make_encoder(specs.encoder_spec(cfg), processor)
  blank = enc.blank_control()
  key, q = "TSP", tasks.get("TSP").generate(3, "tiny")
  assert blank.encode(key, q) == enc.encode(key, q)
  real, white = enc.images(key, q), blank.images(key, q)
  np.testing.assert_array_equal(real["image_grid_thw"], white["image_grid_thw"])
  assert real["pixel_values"].shape == white["pixel_values"].shape
  assert np.abs(real["pixel_values"] - white["pixel_values"]).max() > 0.1
  other = tasks.get("knapsack").generate(3, "tiny")  # every blank image is the same
  np.testing.assert_array_equal(blank.images("knapsack", other)["pixel_values"], white["pixel_values"])


def test_shuffled_control_shows_another_instance_of_the_same_task(smoke_vlm):
  """Each instance gets the image of another instance of its task (never its own), with the
  same prompt ids; a task with one instance is refused by name."""
  cfg, _, processor = smoke_vlm
  enc = mm.make_encoder(specs.encoder_spec(cfg), processor)
  items = [(k, tasks.get(k).generate(s, "tiny")) for k in ("TSP", "knapsack") for s in (3, 4, 5)]
  shuffled = mm.modality_encoder(enc, "shuffled", items)
  own = {mm.instance_key(k, q): enc.images(k, q)["pixel_values"] for k, q in items}
  for k, q in items:
    assert shuffled.encode(k, q) == enc.encode(k, q)
    got = shuffled.images(k, q)["pixel_values"]
    assert not np.array_equal(got, own[mm.instance_key(k, q)])
    assert any(np.array_equal(got, own[mm.instance_key(k2, q2)]) for k2, q2 in items if k2 == k)
  with pytest.raises(ValueError, match="two different TSP instances"):
    enc.shuffled_control([items[0], ("knapsack", items[3][1]), ("knapsack", items[4][1])])
  with pytest.raises(ValueError, match="no other instance for this TSP"):
    shuffled.images("TSP", tasks.get("TSP").generate(99, "tiny"))


def test_white_is_zero_and_ink_is_not(smoke_vlm):
  """config.image.mean/std: the drawing's white background enters the tower as 0 (only ink
  moves a from-scratch tower); the CLIP statistics give white +1.9 on every input."""
  cfg, _, processor = smoke_vlm
  assert tuple(cfg.image.mean) == (1.0, 1.0, 1.0)
  enc = mm.make_encoder(specs.encoder_spec(cfg), processor)
  white = enc.blank_control().images("TSP", {})["pixel_values"]
  np.testing.assert_allclose(white, 0.0, atol=1e-6)
  q = tasks.get("TSP").generate(3, "tiny")
  drawn = mm.make_encoder(specs.encoder_spec(cfg), processor).images("TSP", q)["pixel_values"]
  assert drawn.min() < -1.5  # black ink: (0 - 1) / 0.5 = -2
  clip = mm_nphard.get_config("smoke")
  del clip.image["mean"], clip.image["std"]  # the processor's own (CLIP) statistics
  _, clip_proc = model_build.vlm_config(specs.model_spec(clip))
  clip_enc = mm.make_encoder(specs.encoder_spec(clip), clip_proc)
  clip_white = clip_enc.blank_control().images("TSP", {})["pixel_values"]
  assert clip_white.min() > 1.7


@pytest.mark.parametrize("field, value, match", [
    ("std", (0.5, 0.0, 0.5), "config.image.std=(0.5, 0.0, 0.5): must be three floats > 0"),
    ("mean", (1.0, 1.0), "config.image.mean=(1.0, 1.0): must be three floats"),
    ("mean", (1.0, float("nan"), 1.0), "config.image.mean"),
])
def test_bad_pixel_statistics_are_refused_by_name(field, value, match):
  from dmpo_jax.training import config as config_lib
  c = mm_nphard.get_config("smoke")
  c.image[field] = value
  with pytest.raises(config_lib.ConfigError, match=re.escape(match)):
    config_lib.check_fields(c)


def test_image_encoder_refuses_text_styles_and_bad_configs(smoke_vlm):
  cfg, _, processor = smoke_vlm
  cache = mm.ImageCache(processor, 128)
  with pytest.raises(ValueError, match="prompt_style='compact'"):
    mm.ImagePromptEncoder(processor, "compact", 64, cache=cache)
  with pytest.raises(ValueError, match="config.image.size"):
    mm.ImageCache(processor, 64)
  bad = mm_nphard.get_config("smoke")
  bad.model.mrope_section = (2, 2, 2)
  with pytest.raises(ValueError, match="config.model.mrope_section"):
    model_build.vlm_config(specs.model_spec(bad))
  bad = mm_nphard.get_config("smoke")
  bad.model.vision = dict(bad.model.vision, num_heads=3)
  with pytest.raises(ValueError, match="config.model.vision"):
    model_build.vlm_config(specs.model_spec(bad))
  text = mm_nphard.get_config("smoke")
  text.model.vision = {}  # a text model cannot take image prompts
  with pytest.raises(ValueError, match="needs a vision-language model"):
    mm.make_run_encoder(specs.encoder_spec(text), processor.tokenizer, None)


@pytest.mark.parametrize("pool", [0, 6])
def test_dph_prompt_items_rebuild_the_stored_prompts_and_refuse_others(smoke_vlm, pool):
  """DPH with image prompts: the store holds no pixels; each stored response's instance is
  rebuilt from its pef_index (stream or pool index), checked against the stored prompt."""
  from dmpo_jax.training import dph
  cfg, _, processor = smoke_vlm
  enc = mm.make_encoder(specs.encoder_spec(cfg), processor)
  ts = pipeline.TaskSet(["TSP", "knapsack"], "tiny", 0, pool=pool)
  index = np.asarray([3, 0, 3, 5])  # a prompt's several responses; any order
  items = (ts.pool_items() if pool else dph.stream_items(ts, list(range(6)), 4))
  pt, pm = sampling.pad_prompts([enc.encode(*items[i]) for i in index], cfg.model.max_prompt_len, enc.pad)
  t = cfg.model.max_new_tokens
  store = {"pef_tokens": np.concatenate([pt, np.zeros((len(index), t), pt.dtype)], 1),
           "pef_prompt_mask": pm, "pef_index": index}
  got = dph.prompt_items(store, ts, enc, 4)
  assert got == [items[i] for i in index]
  other = pipeline.TaskSet(["knapsack", "TSP"], "tiny", 0, pool=pool)  # another config.tasks
  with pytest.raises(ValueError, match="pef_index 3"):
    dph.prompt_items(store, other, enc, 4)
  if pool:
    with pytest.raises(ValueError, match="config.collapse.pool=1"):
      dph.prompt_items(store, pipeline.TaskSet(["TSP", "knapsack"], "tiny", 0, pool=1), enc, 4)


@pytest.mark.slow
def test_scratch_vlm_saves_a_folder_transformers_opens(tmp_path):
  from dmpo_jax.models import hf
  cfg = mm_nphard.get_config("smoke")
  model, processor = model_build.build_vlm(specs.model_spec(cfg))
  hf.save(model, processor, str(tmp_path / "hf"))
  loaded, proc2 = hf.load(str(tmp_path / "hf"))
  assert proc2.image_token_id == processor.image_token_id
  assert proc2.image_processor.size == processor.image_processor.size  # the pixel range
  import transformers
  tm = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(tmp_path / "hf"))
  assert tm.config.image_token_id == processor.image_token_id
  enc = mm.make_encoder(specs.encoder_spec(cfg), proc2)
  key, q = "knapsack", tasks.get("knapsack").generate(0, "tiny")
  ids = np.asarray([enc.encode(key, q)])
  im = enc.images(key, q)
  inputs = loaded.prepare(ids, im["image_grid_thw"])
  ours = np.asarray(loaded(ids, im["pixel_values"], inputs["layout"], inputs["positions"],
                           offsets=inputs["offsets"]))
  import torch
  with torch.no_grad():
    theirs = tm(input_ids=torch.tensor(ids, dtype=torch.long),
                pixel_values=torch.tensor(im["pixel_values"]),
                image_grid_thw=torch.tensor(im["image_grid_thw"]),
                mm_token_type_ids=torch.tensor((ids == processor.image_token_id).astype(np.int64)),
                ).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4)


@pytest.mark.slow
def test_mm_smoke_run_end_to_end_with_resume(tmp_path):
  """SFT (tower trained), a stop after the first RL step (tower frozen: its optimizer has no
  tower state, so the checkpoint's structure is RL's) and the resume, RL with dmpo,
  evaluation in every modality (the blank-image control included), the HF export, on image
  prompts of two tasks."""
  from dmpo_jax.training import stages
  from dmpo_jax.models import hf

  def cfg(**over):
    c = mm_nphard.get_config("smoke,algo=dmpo,tasks=TSP+knapsack")
    c.log.tensorboard = c.log.plots = False
    c.mesh.data = 2
    for k, v in over.items():
      c[k] = v
    return c

  wd = tmp_path / "run"
  assert stages.train(cfg(stop_at_step=4), str(wd)) == {"stopped": True, "step": 4}
  assert (wd / "eval_before.json").exists()
  res = stages.train(cfg(), str(wd))  # resumes at step 4, inside RL
  rows = [json.loads(l) for l in open(wd / "metrics.jsonl")]
  assert [r["stage"] for r in rows] == ["sft"] * 3 + ["rl"] * 3
  assert [r["step"] for r in rows] == list(range(1, 7))
  mods = res["modalities"]["after"]
  assert list(mods) == ["image", "blank", "text"]
  for name, r in mods.items():
    assert set(r["per_task"]) == {"TSP", "knapsack"}, name
    assert 0.0 <= r["overall"]["SR_mean"] <= 1.0
  assert res["after"]["overall"] == mods["image"]["overall"]
  model, processor = hf.load(str(wd / "hf"))
  assert model_build.is_vlm(model) and processor.image_token_id == model.cfg.image_token_id


@pytest.mark.slow
def test_qwen_vl_config_trains_a_local_folder(tmp_path):
  """configs/mm_nphard_qwen.py on a tiny Qwen2.5-VL folder (the from-scratch VLM, saved):
  HF init, NP-Bench's wording with the image, bf16 compute, no SFT, one RL step with the
  tower frozen (bit-identical after it), params over 2 devices, evaluation in three
  modalities, HF export."""
  mm_nphard_qwen = config_module("mm_nphard_qwen")
  from dmpo_jax.training import stages
  from dmpo_jax.models import hf
  folder = str(tmp_path / "qwen_vl")
  model, processor = model_build.build_vlm(specs.model_spec(mm_nphard.get_config("smoke")))
  hf.save(model, processor, folder)
  cfg = mm_nphard_qwen.get_config(folder)
  assert cfg.prompt_style == "npbench_image" and cfg.rl.freeze_vision and cfg.sft.steps == 0
  cfg.tasks, cfg.level, cfg.chat_template = "knapsack", "tiny", False  # no chat template here
  cfg.model.update(max_prompt_len=384, max_new_tokens=8)
  cfg.image.update(size=128, patch_budget=64)  # the folder's processor: 112 px, 8 x 8 patches
  cfg.rl.update(steps=1, prompts_per_step=4, group_size=2, micro_batches=2)
  cfg.eval.update(num_per_task=2, samples=3, pass_ks=(1, 3), batch_prompts=4)
  cfg.mesh.update(data=1, fsdp=2)
  cfg.log.update(tensorboard=False, progress=False, plots=False)
  res = stages.train(cfg, str(tmp_path / "run"))
  assert res["steps"] == {"sft": 0, "rl": 1}
  assert list(res["modalities"]["after"]) == ["image", "blank", "text"]
  import jax
  from flax import nnx
  after, _ = hf.load(str(tmp_path / "run" / "hf"))
  tower = lambda m: {jax.tree_util.keystr(k): np.asarray(v)
                     for k, v in jax.tree_util.tree_flatten_with_path(nnx.state(m.visual))[0]}
  before_t, after_t = tower(model), tower(after)
  assert before_t.keys() == after_t.keys() and before_t
  for k in before_t:
    np.testing.assert_array_equal(before_t[k], after_t[k])  # the frozen tower
