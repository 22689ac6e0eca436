"""LoRA adapters (models/lora.py): a zero B leaves every family's logits exactly as they were,
an adapted forward equals the merged weights' forward, adapters shard like their weights, bad
configs and adapters that do not fit are refused by name, and PEFT opens what we write and we
open what PEFT writes, with the same logits (torch, transformers and peft as references)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dmpo_jax.models import hf, lora
from dmpo_jax.models.config import LORA_TARGETS, LoRAConfig
from dmpo_jax.models.transformer import Transformer
from dmpo_jax.models.weights import CheckpointError
from tests.helpers import tiny_config, tiny_hf

VOCAB = 97
# The three text families' layer variants: Qwen2 (QKV bias), Llama (none), Qwen3 (q/k norm).
FAMILIES = {"qwen2": dict(qkv_bias=True), "llama": dict(qkv_bias=False, architecture="llama"),
            "qwen3": dict(qkv_bias=False, qk_norm=True, architecture="qwen3", head_dim=12)}
# Qwen2 in the fast tier; the other two (op-by-op forwards, ~10 s each on the 2-core CPU) slow.
FAMILY_PARAMS = [pytest.param(f, marks=() if f == "qwen2" else pytest.mark.slow) for f in FAMILIES]


@nnx.jit
def logits(model, x):
  return model(x)


@nnx.jit
def decode(model, x):
  """Logits of x's 7th token after a 6-token prefill (the sampler's cached path)."""
  _, cache = model(x[:, :6], cache=model.init_cache(x.shape[0], 10), cache_index=0)
  return model(x[:, 6:7], cache=cache, cache_index=6)[0]


def tokens(b=2, l=9, seed=1):
  return jnp.asarray(np.random.RandomState(seed).randint(0, 61, (b, l)), jnp.int32)


def randomize_b(model, seed=3, scale=0.1):
  """Non-zero B on every adapter (a trained adapter), so that adapters change the output."""
  for n, ad in enumerate(lora.adapters(model).values()):
    key = jax.random.fold_in(jax.random.key(seed), n)
    ad.lora_b[...] = scale * jax.random.normal(key, ad.lora_b.shape, ad.lora_b.value.dtype)


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.slow
def test_zero_b_gives_the_base_logits_exactly(family):
  cfg = tiny_config(**FAMILIES[family])
  base = Transformer(cfg, rngs=nnx.Rngs(0))
  adapted = Transformer(cfg.replace(lora=LoRAConfig(rank=4, alpha=8)), rngs=nnx.Rngs(0))
  assert len(lora.adapters(adapted)) == cfg.num_layers * len(LORA_TARGETS)
  x = tokens()
  np.testing.assert_array_equal(np.asarray(adapted(x)), np.asarray(base(x)))  # op by op: exact
  # Compiled, XLA may fuse the two graphs' elementwise work differently (the adapter's input
  # is read twice): the same up to float rounding. The cached (decode) path too.
  np.testing.assert_allclose(np.asarray(logits(adapted, x)), np.asarray(logits(base, x)),
                             rtol=0, atol=1e-6)
  np.testing.assert_allclose(np.asarray(decode(adapted, x)), np.asarray(decode(base, x)),
                             rtol=0, atol=1e-6)
  # Switched off (B zeroed in the params tree), a trained adapter gives the base exactly too.
  randomize_b(adapted)
  assert np.abs(np.asarray(logits(adapted, x)) - np.asarray(logits(base, x))).max() > 1e-3
  graphdef, state = nnx.split(adapted)
  off = nnx.merge(graphdef, lora.adapters_off(state))
  np.testing.assert_array_equal(np.asarray(off(x)), np.asarray(base(x)))


@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.slow
def test_adapted_forward_equals_the_merged_weights(family):
  cfg = tiny_config(**FAMILIES[family])
  lcfg = LoRAConfig(rank=3, alpha=7.0, targets=("q_proj", "v_proj", "o_proj", "down_proj"))
  adapted = Transformer(cfg.replace(lora=lcfg), rngs=nnx.Rngs(0))
  randomize_b(adapted)
  merged = Transformer(cfg, rngs=nnx.Rngs(0))
  for (_, i, part, weight), w in lora.merged_weights(adapted).items():
    getattr(getattr(merged.layers[i], part), weight)[...] = w
  # The merge is W + (alpha / r) A B, checked here on one weight against numpy.
  ad = adapted.layers[1].attn.o_lora
  want = np.asarray(adapted.layers[1].attn.o[...]) + 7.0 / 3 * (
      np.asarray(ad.lora_a[...], np.float64) @ np.asarray(ad.lora_b[...], np.float64))
  np.testing.assert_allclose(np.asarray(merged.layers[1].attn.o[...]), want, rtol=0, atol=1e-6)
  x = tokens()
  diff = np.abs(np.asarray(logits(adapted, x)) - np.asarray(logits(merged, x))).max()
  assert diff < 1e-5, diff
  assert np.abs(np.asarray(logits(adapted, x)) - np.asarray(logits(Transformer(cfg, rngs=nnx.Rngs(0)), x))).max() > 1e-3


def test_bfloat16_compute_casts_the_adapters_like_the_weights():
  cfg = tiny_config(dtype="bfloat16", lora=LoRAConfig(rank=2))
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  ad = model.layers[0].attn.q_lora
  assert ad.lora_a.value.dtype == jnp.float32  # stored float32, computed in bfloat16
  x = jnp.ones((2, 3, cfg.hidden_size), jnp.bfloat16)
  assert ad(x).dtype == jnp.bfloat16


def test_adapters_carry_their_weights_logical_axes_and_shard_with_them():
  from dmpo_jax.parallel import sharding
  cfg = tiny_config(lora=LoRAConfig(rank=4))
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  for (i, target), ad in lora.adapters(model).items():
    part, weight = lora.TARGETS[target]
    names = getattr(getattr(model.layers[i], part), weight).get_metadata()["out_sharding"]
    assert ad.lora_a.get_metadata()["out_sharding"] == (names[0], None)
    assert ad.lora_b.get_metadata()["out_sharding"] == (None, names[1])
  mesh = sharding.make_mesh({"fsdp": 2, "tensor": 2}, jax.devices()[:4])
  sh = sharding.param_shardings(nnx.state(model), mesh)
  attn = sh["layers"][0]["attn"]
  assert tuple(attn["q"].value.spec) == ("fsdp", "tensor")
  assert attn["q_lora"]["lora_a"].value.spec[0] == "fsdp"  # like q's input axis
  assert attn["q_lora"]["lora_b"].value.spec[1] == "tensor"  # like q's output axis


def test_attach_keeps_a_loaded_base_and_counts_its_adapters():
  base = Transformer(tiny_config(), rngs=nnx.Rngs(0))
  before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(base)))
  lcfg = LoRAConfig(rank=5, targets=("gate_proj", "k_proj"))
  lora.attach(base, lcfg, jax.random.key(1))
  state = nnx.state(base)
  flat, _ = jax.tree_util.tree_flatten_with_path(state)
  kept = [x for p, x in flat if not lora.is_adapter_path(p)]
  for a, b in zip(kept, jax.tree.leaves(before)):
    np.testing.assert_array_equal(np.asarray(a), b)
  d, f, k = 32, 48, 2 * 8
  assert lora.count(state) == base.cfg.num_adapter_params() == 2 * 5 * ((d + f) + (d + k))
  assert base.cfg.lora == lcfg


@pytest.mark.parametrize("kw,message", [
    (dict(rank=0), "LoRAConfig.rank must be a positive int, got 0"),
    (dict(rank=-2), "LoRAConfig.rank must be a positive int, got -2"),
    (dict(rank=4, targets=("q_proj", "qkv")), "unknown target module.*'qkv'"),
    (dict(rank=4, alpha=0), "LoRAConfig.alpha must be a positive number"),
    (dict(rank=4, init="orthogonal"), "LoRAConfig.init must be one of"),
])
def test_bad_lora_configs_are_refused_by_name(kw, message):
  with pytest.raises(ValueError, match=message):
    LoRAConfig(**kw)


def test_training_config_lora_block_is_checked_by_name():
  from dmpo_jax.models import build
  from dmpo_jax.training import config as config_lib
  from tests.helpers import smoke
  cfg = smoke()
  with cfg.unlocked():
    cfg.model.lora = {"rank": 0, "alpha": 8.0}
  with pytest.raises(config_lib.ConfigError, match=r"config.model.lora.rank=0: must be an int >= 1"):
    config_lib.check_fields(cfg)
  cfg.model.lora = {"rank": 4, "targets": ("q_proj", "mlp")}
  with pytest.raises(config_lib.ConfigError, match=r"config.model.lora.targets="):
    config_lib.check_fields(cfg)
  cfg.model.lora = {"alpha": 8.0}
  with pytest.raises(ValueError, match="config.model.lora.rank is missing"):
    build.lora_config(cfg.model.get("lora"))
  cfg.model.lora = {"rank": 4, "alpha": 8.0, "targets": ("q_proj",), "init": "gaussian",
                    "export": "adapter"}
  config_lib.check_fields(cfg)
  assert build.lora_config(cfg.model.get("lora")) == LoRAConfig(rank=4, alpha=8.0, targets=("q_proj",),
                                                                init="gaussian")
  cfg.model.lora = None
  config_lib.check_fields(cfg)
  assert build.lora_config(cfg.model.get("lora")) is None


# ---------------------------------------------------------------------------
# PEFT round trips (torch, transformers, peft: references only).
def torch_logits(model, x):
  import torch
  with torch.no_grad():
    return model(input_ids=torch.tensor(np.asarray(x))).logits.numpy()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_our_adapter_opens_in_peft_with_our_logits(tmp_path, arch):
  import peft
  import transformers
  tiny_hf(str(tmp_path / "base"), arch, vocab=VOCAB)
  model, _ = hf.load(str(tmp_path / "base"))
  lora.attach(model, LoRAConfig(rank=4, alpha=16, targets=("q_proj", "v_proj", "o_proj", "up_proj",
                                                           "down_proj")), jax.random.key(0))
  randomize_b(model)
  hf.save(model, None, str(tmp_path / "adapter"), adapter_only=True, base=str(tmp_path / "base"))
  saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
  assert (saved["r"], saved["lora_alpha"], saved["peft_type"]) == (4, 16, "LORA")
  assert sorted(saved["target_modules"]) == ["down_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
  ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base")).eval()
  ref = peft.PeftModel.from_pretrained(ref, str(tmp_path / "adapter")).eval()
  x = tokens(l=11)
  ours = np.asarray(logits(model, x))
  err = np.abs(torch_logits(ref, x) - ours).max()
  assert err < 1e-4, f"max |logit error| {err:.2e}"
  # The adapter matters: without it PEFT's base gives other logits.
  with ref.disable_adapter():
    assert np.abs(torch_logits(ref, x) - ours).max() > 1e-2
  # And it loads back here onto the base with the same logits.
  again, _ = hf.load(str(tmp_path / "base"), adapter=str(tmp_path / "adapter"))
  np.testing.assert_array_equal(np.asarray(logits(again, x)), ours)


@pytest.mark.slow
@pytest.mark.parametrize("targets", [["k_proj", "o_proj", "gate_proj"], "all-linear"])
def test_a_peft_adapter_loads_here_with_peft_logits(tmp_path, targets):
  import peft
  import torch
  ref = tiny_hf(str(tmp_path / "base"), "qwen2", vocab=VOCAB)
  # "all-linear": PEFT writes every module's path (model.layers.0.self_attn.q_proj, ...).
  pm = peft.get_peft_model(ref, peft.LoraConfig(r=3, lora_alpha=5, target_modules=targets,
                                                lora_dropout=0.0))
  torch.manual_seed(1)
  with torch.no_grad():
    for name, p in pm.named_parameters():
      if "lora_B" in name:
        p.normal_(0, 0.1)
  pm.eval().save_pretrained(str(tmp_path / "adapter"))
  model, _ = hf.load(str(tmp_path / "base"), adapter=str(tmp_path / "adapter"))
  want = LORA_TARGETS if targets == "all-linear" else tuple(targets)
  assert model.cfg.lora == LoRAConfig(rank=3, alpha=5.0, targets=want)
  x = tokens(l=11)
  err = np.abs(torch_logits(pm, x) - np.asarray(logits(model, x))).max()
  assert err < 1e-4, f"max |logit error| {err:.2e}"
  with pm.disable_adapter():
    assert np.abs(torch_logits(pm, x) - np.asarray(logits(model, x))).max() > 1e-2


def write_adapter(path, config: dict, tensors: dict):
  from safetensors.numpy import save_file
  path.mkdir(parents=True, exist_ok=True)
  (path / "adapter_config.json").write_text(json.dumps(config))
  save_file(tensors, str(path / "adapter_model.safetensors"))


def test_adapters_that_do_not_fit_the_base_are_refused_by_name(tmp_path):
  base = tmp_path / "base"
  tiny_hf(str(base), "llama", vocab=VOCAB)  # hidden 64, 2 layers
  model, _ = hf.load(str(base))
  lora.attach(model, LoRAConfig(rank=2, targets=("q_proj",)), jax.random.key(0))
  hf.save(model, None, str(tmp_path / "good"), adapter_only=True)
  good = {k: np.asarray(v) for k, v in hf.adapter_tensors(model).items()}
  config = json.loads((tmp_path / "good" / "adapter_config.json").read_text())
  a0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
  cases = {
      "shape": (config, dict(good, **{a0: np.zeros((2, 48), np.float32)}),
                rf"tensor {a0} has shape \(2, 48\).*needs \(2, 64\).*does not fit"),
      "missing": (config, {k: v for k, v in good.items() if k != a0}, rf"tensor {a0} is missing"),
      "extra layer": (config, dict(good, **{a0.replace("layers.0", "layers.5"): good[a0]}),
                      r"unexpected tensor\(s\).*layers\.5\.self_attn\.q_proj\.lora_A"),
      "unknown module": (dict(config, target_modules=["q_proj", "qkv_proj"]), good,
                         r"unknown target module.*'qkv_proj'"),
      "rank 0": (dict(config, r=0), good, r"LoRAConfig.rank must be a positive int, got 0"),
      "dora": (dict(config, use_dora=True), good, r"use_dora=True not supported"),
      "pattern": (dict(config, target_modules=".*proj"), good, r"target_modules='.\*proj'"),
  }
  for name, (cfg, tensors, message) in cases.items():
    write_adapter(tmp_path / name, cfg, tensors)
    with pytest.raises(CheckpointError, match=message):
      hf.load(str(base), adapter=str(tmp_path / name))
  again, _ = hf.load(str(base), adapter=str(tmp_path / "good"))
  assert again.cfg.lora == model.cfg.lora
  with pytest.raises(CheckpointError, match="no adapters"):
    hf.save(hf.load(str(base))[0], None, str(tmp_path / "none"), adapter_only=True)
  assert not (tmp_path / "none").exists()


@pytest.mark.slow
def test_merged_save_writes_what_the_adapted_model_computes(tmp_path):
  """hf.save of an adapted model writes its merged weights: the folder, loaded as a plain
  model, gives the adapted logits."""
  tiny_hf(str(tmp_path / "base"), "qwen2", vocab=VOCAB)
  model, _ = hf.load(str(tmp_path / "base"))
  lora.attach(model, LoRAConfig(rank=4, alpha=8), jax.random.key(0))
  randomize_b(model)
  hf.save(model, None, str(tmp_path / "merged"))
  merged, _ = hf.load(str(tmp_path / "merged"))
  assert merged.cfg.lora is None
  x = tokens(l=7)
  assert np.abs(np.asarray(logits(merged, x)) - np.asarray(logits(model, x))).max() < 1e-5


@pytest.mark.slow
def test_qwen2_5_vl_language_model_takes_adapters_and_the_tower_stays_frozen():
  from dmpo_jax.models import qwen2_5_vl, vision
  from dmpo_jax.training import steps
  vc = vision.VisionConfig(depth=1, hidden_size=16, intermediate_size=24, num_heads=2,
                           window_size=56, out_hidden_size=32, fullatt_block_indexes=())
  text = tiny_config(mrope_section=(1, 1, 2))
  build = lambda t: qwen2_5_vl.Qwen2_5_VL(qwen2_5_vl.VLConfig(t, vc, image_token_id=60),
                                          rngs=nnx.Rngs(0))
  base, adapted = build(text), build(text.replace(lora=LoRAConfig(rank=2)))
  state = nnx.state(adapted)
  assert lora.count(state) == lora.count(state["language"]) == text.replace(
      lora=LoRAConfig(rank=2)).num_adapter_params() > 0
  x = tokens()
  np.testing.assert_array_equal(np.asarray(adapted.language(x)), np.asarray(base.language(x)))
  opt = steps.make_optimizer(1e-3, 10, 0, 1.0, freeze_vision=False, lora=True)
  moments = [m for m in jax.tree.leaves(opt.init({"model": state})) if m.ndim]
  assert sum(m.size for m in moments) == 2 * lora.count(state)  # none for the tower or base
