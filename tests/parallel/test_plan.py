"""The memory planner: exact parameter and optimizer bytes, and refusal of plans that do not fit."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from dmpo_jax.parallel import plan
from dmpo_jax.parallel import sharding
from dmpo_jax.models.config import ModelConfig
from dmpo_jax.models.transformer import Transformer


def test_planner_matches_measured_bytes():
  cfg = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                    num_kv_heads=1, head_dim=16, architecture="llama")
  _, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  mesh_shape = {"data": 2, "fsdp": 2, "tensor": 2}
  mesh = sharding.make_mesh(mesh_shape)
  placed = jax.device_put(state, sharding.param_shardings(state, mesh))
  dev0 = jax.devices()[0]
  measured = sum(s.data.nbytes for x in jax.tree.leaves(placed) for s in x.addressable_shards
                 if s.device == dev0)
  opt_state, _ = sharding.init_opt_state(optax.adamw(1e-3), placed,
                                         sharding.param_shardings(state, mesh), mesh)
  measured_opt = sum(s.data.nbytes for x in jax.tree.leaves(opt_state) if np.ndim(x) > 0
                     for s in x.addressable_shards if s.device == dev0)
  p = plan.plan(cfg, mesh_shape, plan.Workload(prompts=8, group=2, prompt_len=16, new_tokens=8))
  assert p["param_bytes"] == measured
  assert p["optimizer_bytes"] == measured_opt
  assert p["params"] == sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))


def test_planner_refuses_what_does_not_fit(capsys):
  with pytest.raises(SystemExit) as e:
    plan.main(["--model=qwen2.5-7b", "--mesh=data=1,fsdp=1,tensor=1", "--device_gib=80"])
  assert e.value.code == 1
  assert "DOES NOT FIT" in capsys.readouterr().out
  with pytest.raises(ValueError, match="unknown axis 'pipe'"):
    plan.main(["--model=qwen2.5-0.5b", "--mesh=pipe=2"])


def test_real_model_parameter_counts():
  # Published sizes: 0.49 B, 1.54 B and 7.62 B parameters.
  for name, billions in (("qwen2.5-0.5b", 0.494), ("qwen2.5-1.5b", 1.544), ("qwen2.5-7b", 7.616)):
    cfg = ModelConfig(**plan.MODELS[name], dtype="bfloat16")
    p = plan.plan(cfg, {"data": 1, "fsdp": 8, "tensor": 1}, plan.Workload())
    assert p["params"] / 1e9 == pytest.approx(billions, abs=0.001)


def test_llama3_and_qwen3_parameter_counts():
  # Published sizes: Llama 3.1 8B 8,030,261,248; Llama 3.2 1B 1,235,814,400; Qwen3-8B 8,190,735,360.
  for name, count in (("llama3.1-8b", 8030261248), ("llama3.2-1b", 1235814400),
                      ("qwen3-8b", 8190735360)):
    assert ModelConfig(**plan.MODELS[name]).num_params() == count, name


def test_activation_estimate_follows_the_attention_core():
  """The reference core saves [heads, seq] float32 probabilities per token and layer, a fused
  core does not; on an accelerator the update's logits are chunked."""
  cfg = ModelConfig(**plan.MODELS["qwen2.5-0.5b"], dtype="bfloat16")
  work = dict(prompts=8, group=8, prompt_len=512, new_tokens=512)
  mesh = {"data": 1, "fsdp": 8, "tensor": 1}
  gpu = plan.plan(cfg, mesh, plan.Workload(**work, backend="gpu"))
  ref = plan.plan(cfg.replace(attention="reference"), mesh, plan.Workload(**work, backend="gpu"))
  cpu = plan.plan(cfg, mesh, plan.Workload(**work, backend="cpu"))
  assert (gpu["attention"], ref["attention"], cpu["attention"]) == ("cudnn", "reference", "reference")
  rows, seq = gpu["micro_rows"], 1024
  probs = rows * seq * cfg.num_heads * seq * 4 * cfg.num_layers
  assert ref["activation_bytes"] - gpu["activation_bytes"] == pytest.approx(
      probs - rows * seq * cfg.num_heads * 4 * cfg.num_layers)
  assert cpu["logit_bytes"] == rows * 512 * cfg.vocab_size * 4
  assert gpu["logit_bytes"] == rows * 2 * 128 * cfg.vocab_size * 4


@pytest.mark.parametrize("backend,remat,mesh,micro", [
    ("cpu", False, {"data": 1}, 1),  # the reference core: probabilities kept
    ("gpu", True, {"data": 1}, 1),   # float32 on a GPU: the fused 'xla' core; remat
    ("cpu", False, {"data": 2}, 2),  # rows over two devices, two micro-batches
])
def test_prefix_shared_update_counts_each_prompt_once(backend, remat, mesh, micro):
  """The prefix-shared update's activations, by hand. Float32 (4 bytes), D 32, F 64, N 4 query
  and K 2 key-value heads of H 8, L 3 layers; 4 prompts x G 4, P 16 + T 8 = S 24 tokens. Per
  layer a token keeps c = (6D + 3F) x 4 bytes, and under the reference core its float32
  probabilities over the keys it sees, a(keys) = N x keys x 4; a fused core one log-sum-exp per
  head, N x 4. Per device and slice, R rows of Bp = R / G prompts.
    per row:         R S (c + a(S))
    prefix-shared:   Bp P (c + a(P)) + R T (c + a(S))     (completions see P + T = S keys)
  so sharing saves R P (c + a(S)) - Bp P (c + a(P)) per layer. With the 'xla' core a(.) is
  N x 4 throughout, and the completions' inputs hold the prompt's K and V repeated per row:
  R P 2KH x 4 bytes more. Remat keeps one layer plus every layer's input, D x 4 per token."""
  d, f, n, k, h, layers, p, t, g, prompts = 32, 64, 4, 2, 8, 3, 16, 8, 4, 4
  cfg = ModelConfig(vocab_size=128, hidden_size=d, intermediate_size=f, num_layers=layers,
                    num_heads=n, num_kv_heads=k, head_dim=h, architecture="llama", dtype="float32")
  work = dict(prompts=prompts, group=g, prompt_len=p, new_tokens=t, backend=backend, remat=remat,
              micro_batches=micro)
  per_row = plan.plan(cfg, mesh, plan.Workload(**work))
  shared = plan.plan(cfg, mesh, plan.Workload(**work, prefix_shared=True))
  rows = prompts * g // mesh["data"] // micro
  bp, s, c = rows // g, p + t, (6 * d + 3 * f) * 4
  xla = backend == "gpu"
  assert shared["attention"] == ("xla" if xla else "reference")
  a = (lambda keys: n * 4) if xla else (lambda keys: n * keys * 4)
  saved = rows * p * (c + a(s)) - bp * p * (c + a(p)) - (rows * p * 2 * k * h * 4 if xla else 0)
  if remat:
    saved += layers * d * 4 * (rows * p - bp * p)
  else:
    saved *= layers
  assert per_row["activation_bytes"] - shared["activation_bytes"] == saved > 0
  assert shared["logit_bytes"] == per_row["logit_bytes"]  # logits: the completions' alone
  assert shared["update_peak_bytes"] == per_row["update_peak_bytes"] - saved


def test_the_planner_clis_prefix_shared_rule_is_the_trainers():
  """`plan.with_update_forward` (the CLI's) decides as the trainer's `steps.forward_path` on
  the update's batch [prompts, G, P+T], on every setting, group size, completion length and
  prompt kind; "on" is refused alike."""
  import jax
  import jax.numpy as jnp
  from dmpo_jax.training import steps
  for setting in ("auto", "on", "off"):
    for group in (1, 2, 8):
      for new_tokens in (1, 2, 16):
        for images in (False, True):
          work = plan.Workload(prompts=4, group=group, prompt_len=8, new_tokens=new_tokens)
          try:
            seqs = {"tokens": jax.ShapeDtypeStruct((4, group, 8 + new_tokens), jnp.int32),
                    "images": {} if images else None}
            path = steps.forward_path(steps.PREFIX_SHARED[setting], seqs, 8)
          except ValueError:
            with pytest.raises(ValueError, match=f"--prefix_shared='{setting}'"):
              plan.with_update_forward(work, setting, images, "--prefix_shared")
            continue
          got = plan.with_update_forward(work, setting, images).prefix_shared
          assert got == (path[0] == "prefix_shared"), (setting, group, new_tokens, images, path)
  with pytest.raises(ValueError, match="choose one of"):
    plan.with_update_forward(plan.Workload(), "yes", False)


def test_prefix_shared_flag_of_the_planner_cli(capsys):
  plan.main(["--model=qwen2.5-0.5b", "--device_gib=1000"])
  assert "each group's prompt once" in capsys.readouterr().out
  plan.main(["--model=qwen2.5-0.5b", "--device_gib=1000", "--prefix_shared=off"])
  assert "prompt + completion per row" in capsys.readouterr().out
  plan.main(["--model=qwen2.5-0.5b", "--device_gib=1000", "--group=1"])  # nothing to share
  assert "prompt + completion per row" in capsys.readouterr().out
  with pytest.raises(SystemExit) as e:
    plan.main(["--model=qwen2.5-vl-7b", "--prefix_shared=on"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "--prefix_shared='on'" in err and "image prompts" in err, err
  with pytest.raises(ValueError, match="vision-language policy's update runs per row"):
    plan.plan(_tiny_vl(), {"data": 1}, plan.Workload(prompt_len=32, new_tokens=8, patch_budget=16,
                                                      prefix_shared=True))


# --- Qwen2.5-VL: the vision tower -----------------------------------------------------------------

def _tiny_vl(**vision):
  from dmpo_jax.models.qwen2_5_vl import VLConfig
  from dmpo_jax.models.vision import VisionConfig
  text = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                     num_kv_heads=1, head_dim=16, qkv_bias=True, mrope_section=(2, 3, 3))
  kw = dict(depth=3, hidden_size=24, intermediate_size=40, num_heads=2, patch_size=2,
            temporal_patch_size=2, spatial_merge_size=2, window_size=8, out_hidden_size=32,
            fullatt_block_indexes=(1,))
  return VLConfig(text, VisionConfig(**{**kw, **vision}), image_token_id=90)


def _count(module):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


@pytest.mark.slow
def test_vision_tower_parameter_count_matches_a_built_model():
  from dmpo_jax.models.qwen2_5_vl import Qwen2_5_VL
  from dmpo_jax.models.vision import VisionTower
  for vision in ({}, dict(depth=1, intermediate_size=56, spatial_merge_size=1, in_channels=1,
                                fullatt_block_indexes=(0,))):
    cfg = _tiny_vl(**vision)
    model = Qwen2_5_VL(cfg, rngs=nnx.Rngs(0))
    p = plan.plan(cfg, {"data": 1, "fsdp": 2, "tensor": 1},
                  plan.Workload(prompts=2, group=2, prompt_len=32, new_tokens=8, patch_budget=16))
    assert cfg.vision.num_params() == _count(model.visual) == p["vision_params"]
    assert p["params"] == _count(model) == _count(model.visual) + _count(model.language)
  # The released Qwen2.5-VL-7B (8.29 B): the tower's closed form against an abstract build.
  cfg = plan.vl_config("qwen2.5-vl-7b")
  tower = nnx.eval_shape(lambda: VisionTower(cfg.vision, rngs=nnx.Rngs(0)))
  assert cfg.vision.num_params() == _count(tower) == 676_550_144
  assert cfg.text.num_params() == ModelConfig(**plan.MODELS["qwen2.5-7b"]).num_params()
  assert cfg.text.num_params() + cfg.vision.num_params() == 8_292_166_656


def test_vl_planner_matches_measured_bytes():
  """Params and AdamW state of a VL model placed on 8 devices, as the trainer's optimizer
  allocates it: moments for a trained tower, none for a frozen one."""
  from dmpo_jax.training.steps import make_optimizer
  from dmpo_jax.models.qwen2_5_vl import Qwen2_5_VL
  cfg = _tiny_vl()
  _, state = nnx.split(Qwen2_5_VL(cfg, rngs=nnx.Rngs(0)))
  mesh_shape = {"data": 2, "fsdp": 2, "tensor": 2}
  mesh = sharding.make_mesh(mesh_shape)
  shardings = sharding.param_shardings(state, mesh)
  placed = jax.device_put(state, shardings)
  dev0 = jax.devices()[0]
  on_dev0 = lambda tree: sum(s.data.nbytes for x in jax.tree.leaves(tree) if np.ndim(x) > 0
                             for s in x.addressable_shards if s.device == dev0)
  for train_vision in (False, True):
    opt = make_optimizer(1e-3, 10, 1, 1.0, freeze_vision=not train_vision)
    opt_state, _ = sharding.init_opt_state(opt, {"model": placed}, {"model": shardings}, mesh)
    p = plan.plan(cfg, mesh_shape, plan.Workload(prompts=8, group=2, prompt_len=32, new_tokens=8,
                                                  patch_budget=16, train_vision=train_vision))
    assert p["param_bytes"] == on_dev0(placed)
    assert p["vision_param_bytes"] == on_dev0(placed["visual"]) > 0
    assert p["optimizer_bytes"] == on_dev0(opt_state)
    assert p["vision_optimizer_bytes"] == (2 * p["vision_param_bytes"] if train_vision else 0)


def test_frozen_tower_has_no_gradients_and_training_it_does():
  cfg = plan.vl_config("qwen2.5-vl-7b")
  mesh = {"data": 1, "fsdp": 8, "tensor": 1}
  work = dict(prompts=32, group=8, prompt_len=768, new_tokens=1024, remat=True, micro_batches=4)
  text = plan.plan(cfg.text, mesh, plan.Workload(**work))
  frozen = plan.plan(cfg, mesh, plan.Workload(**work))
  trained = plan.plan(cfg, mesh, plan.Workload(**work, train_vision=True))
  tower = frozen["vision_param_bytes"]
  assert tower > 0 and frozen["vision_grad_bytes"] == 0
  assert frozen["grad_bytes"] == text["grad_bytes"]
  assert trained["grad_bytes"] == text["grad_bytes"] + tower == trained["vision_grad_bytes"] + \
      text["grad_bytes"]
  # AdamW moments only for a trained tower.
  assert frozen["optimizer_bytes"] == text["optimizer_bytes"]
  assert trained["optimizer_bytes"] == text["optimizer_bytes"] + 2 * tower
  # Training keeps every block's activations for the backward; frozen, one block's at a time.
  assert trained["vision_activation_bytes"] > 10 * frozen["vision_activation_bytes"] > 0
  assert trained["update_peak_bytes"] > frozen["update_peak_bytes"] > text["update_peak_bytes"]
  # The sampler holds the optimizer state too: the trained tower's moments are the difference.
  assert trained["sampling_peak_bytes"] == frozen["sampling_peak_bytes"] + 2 * tower


def test_patch_budget_raises_activation_memory():
  cfg = plan.vl_config("qwen2.5-vl-7b")
  mesh = {"data": 1, "fsdp": 8, "tensor": 1}
  for train in (False, True):
    acts = [plan.plan(cfg, mesh, plan.Workload(patch_budget=b, train_vision=train))
            for b in (256, 1024, 4096)]
    tower = [p["vision_activation_bytes"] for p in acts]
    assert tower[0] < tower[1] < tower[2]
    assert [p["activation_bytes"] - t for p, t in zip(acts, tower)] == \
        [acts[0]["activation_bytes"] - tower[0]] * 3  # the text model's part does not change
    # attention over the whole budget: quadratic in the patches
    assert tower[2] / tower[1] > 4
  # One trained block's probabilities at 1,024 patches: 16 heads x 1024^2 float32 per prompt.
  one = plan.plan(cfg, mesh, plan.Workload(prompts=8, patch_budget=1024, train_vision=True))
  assert one["vision_activation_bytes"] > 32 * 16 * 1024 ** 2 * 4


def test_cli_plans_the_vl_model(capsys, tmp_path):
  plan.main(["--model=qwen2.5-vl-7b", "--remat", "--micro_batches=4"])
  out = capsys.readouterr().out
  assert out.startswith("qwen2.5-vl-7b: 8.292 B params")
  assert "vision tower  676.6 M params (frozen" in out and "1024 patches per prompt" in out
  plan.main(["--model=qwen2.5-vl-7b", "--remat", "--micro_batches=4", "--train_vision",
             "--patch_budget=2048"])
  out = capsys.readouterr().out
  assert "(trained)" in out and "2048 patches per prompt" in out
  # A config whose checkpoint folder is a Qwen2.5-VL: its image.patch_budget and freeze_vision.
  import json
  from dmpo_jax.models import qwen2_5_vl
  (tmp_path / "config.json").write_text(json.dumps(qwen2_5_vl.config_to_hf(plan.vl_config("qwen2.5-vl-7b"))))
  plan.main([f"--config=configs/mm_nphard_qwen.py:{tmp_path}", "--device_gib=1000"])
  out = capsys.readouterr().out
  assert "8.292 B params" in out and "(frozen" in out and "1024 patches per prompt" in out


def test_vl_flags_refuse_bad_input(capsys):
  for flag in ("--train_vision", "--patch_budget=1024"):
    with pytest.raises(SystemExit):
      plan.main(["--model=qwen2.5-7b", flag])
    err = capsys.readouterr().err
    assert flag.split("=")[0] + " applies to vision-language models only" in err
  for argv, message in (
      (["--patch_budget=-4"], "patch_budget=-4 must be a positive multiple of spatial_merge_size"),
      (["--patch_budget=1022"], "patch_budget=1022 must be a positive multiple of"),
      (["--patch_budget=4096", "--prompt_len=512"],
       "patch_budget=4096 gives 1024 image tokens per prompt, more than prompt_len=512")):
    with pytest.raises(SystemExit) as e:  # the CLI: a usage error naming the field, no traceback
      plan.main(["--model=qwen2.5-vl-7b", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(ValueError, match=message):  # the API
      plan.plan(plan.vl_config("qwen2.5-vl-7b"), {"fsdp": 8},
                plan.Workload(**{k.lstrip("-"): int(v) for k, v in (a.split("=") for a in argv)}))
  with pytest.raises(TypeError, match="ModelConfig or a VLConfig"):
    plan.plan(plan.vl_config("qwen2.5-vl-7b").vision, {"fsdp": 8}, plan.Workload())


# --- A training config's memory check (training/memory.py) ---------------------------------------

def _phases(cfg):
  """{stage name: its plan} of a training config on its mesh."""
  from dmpo_jax.training import config as config_lib, memory
  from dmpo_jax.training.run import objective_from_config
  mesh = sharding.make_mesh(dict(cfg.mesh))
  samples = max(cfg.eval.samples, config_lib.points_samples_max(cfg))
  return {ph.name: (ph, p) for ph, p in memory.estimate(cfg, objective_from_config(cfg), mesh,
                                                         samples)}, mesh


def test_config_estimate_counts_each_samplers_rows_and_tokens():
  """The evaluation sampler's KV cache and logits are those of eval.batch_prompts x eval.samples
  rows of max_prompt_len + max_new_tokens tokens; the RL sampler's of a rollout chunk's rows."""
  from dmpo_jax.training import memory
  from tests.helpers import smoke
  for samples, new in ((4, 16), (8, 16), (8, 48)):
    cfg = smoke(**{"eval.samples": samples, "model.max_new_tokens": new})
    phases, mesh = _phases(cfg)
    rows_div = sharding.batch_rows(mesh)
    m = cfg.model
    kv_per_row = (m.max_prompt_len + new) * m.num_layers * 2 * m.num_kv_heads * m.head_dim * 4
    _, ev = phases["the evaluation sampler"]
    rows = -(-cfg.eval.batch_prompts * samples // rows_div)
    assert ev["kv_cache_bytes"] == rows * kv_per_row
    assert ev["sampling_logit_bytes"] == rows * memory.model_config(cfg).vocab_size * 4  # float32
    _, rl = phases["the RL sampler"]
    rl_rows = -(-cfg.rl.prompts_per_step // cfg.rl.rollout_chunks * cfg.rl.group_size // rows_div)
    assert rl["kv_cache_bytes"] == rl_rows * kv_per_row


def test_config_estimate_adds_dph_rows_and_the_reference_policy():
  from tests.helpers import smoke
  plain, _ = _phases(smoke("smoke,algo=grpo", **{"rl.micro_batches": 1}))
  dph, _ = _phases(smoke("smoke,algo=dph_f", **{"rl.micro_batches": 1}))
  kl, _ = _phases(smoke("smoke,algo=rkl", **{"rl.micro_batches": 1}))
  per_row, _ = _phases(smoke("smoke,algo=grpo", **{"rl.micro_batches": 1, "rl.prefix_shared": "off"}))
  cfg = smoke("smoke,algo=dph_f")
  assert "the DPH pre-sampler" in dph and "the DPH pre-sampler" not in plain
  a, b = plain["the RL update"][1], dph["the RL update"][1]
  assert a["prefix_shared"] and b["prefix_shared"]
  rows = cfg.rl.prompts_per_step * cfg.rl.group_size
  # DPH's stored rows run per row beside the prefix-shared groups: each adds a per-row row
  assert (b["activation_bytes"] - a["activation_bytes"]) * rows == (
      per_row["the RL update"][1]["activation_bytes"] * cfg.dph.batch)
  assert kl["the RL update"][1]["reference_bytes"] == kl["the RL update"][1]["param_bytes"] > 0
  assert a["reference_bytes"] == 0
  assert (kl["the RL sampler"][1]["sampling_peak_bytes"] - plain["the RL sampler"][1]["sampling_peak_bytes"]
          == kl["the RL sampler"][1]["param_bytes"])


def test_config_estimate_runs_the_update_forward_the_trainer_runs():
  """The RL update's workload is prefix-shared exactly where the trainer's update is
  (`steps.forward_path` of its [prompts, G, P+T] batch under config.rl.prefix_shared): a
  default text config; not with "off", groups of one or image prompts. SFT runs per row."""
  from dmpo_jax.models.config import ModelConfig as MC
  from dmpo_jax.training import memory
  from dmpo_jax.training.run import objective_from_config
  from tests.helpers import config_module, smoke
  cases = [(smoke(), True), (smoke(**{"rl.prefix_shared": "on"}), True),
           (smoke(**{"rl.prefix_shared": "off"}), False), (smoke(**{"rl.group_size": 1}), False),
           (config_module("mm_nphard").get_config("smoke"), False)]
  for cfg, shared in cases:
    phases, _ = _phases(cfg)
    ph, p = phases["the RL update"]
    assert ph.work.prefix_shared is p["prefix_shared"] is shared, (cfg.rl.prefix_shared, ph.fields)
    assert ("prefix_shared: " if shared else "per_row: ") in ph.fields
    assert not phases["the SFT update"][0].work.prefix_shared
    assert isinstance(memory.model_config(cfg), MC) == ("vision" not in cfg.model)
  cfg = config_module("mm_nphard").get_config("smoke")
  cfg.rl.prefix_shared = "on"
  with pytest.raises(ValueError, match="config.rl.prefix_shared='on': .*image prompts"):
    memory.phases(cfg, objective_from_config(cfg), 1, "cpu", cfg.eval.samples, vl=True)


@pytest.mark.parametrize("name,arg", [("nphard", None), ("nphard", "smoke"), ("collapse", None),
                                      ("collapse", "smoke,pass256")])
def test_shipped_text_configs_fit_a_24_gib_host(name, arg):
  """Every CPU config's largest stage, times the CPU devices sharing the host, is well under
  the 24 GiB of the machine the configs were sized on."""
  from tests.helpers import config_module
  phases, mesh = _phases(config_module(name).get_config(arg))
  worst = max(p[ph.peak] for ph, p in phases.values()) * mesh.devices.size
  assert 0 < worst < 16 * plan.GIB, worst / plan.GIB


@pytest.mark.slow
def test_shipped_model_configs_fit_a_24_gib_host():
  """The image policy (mm_nphard) and SmolLM2 (its GGUF header read, no weights): under 16 GiB."""
  from tests.helpers import config_module
  configs = [config_module("mm_nphard").get_config(a) for a in (None, "smoke")]
  smollm2 = config_module("smollm2_nphard")
  if smollm2.package_file():
    configs += [smollm2.get_config(a) for a in (None, "demo")]
  for cfg in configs:
    phases, mesh = _phases(cfg)
    worst = max(p[ph.peak] for ph, p in phases.values()) * mesh.devices.size
    assert 0 < worst < 16 * plan.GIB, (cfg.model.init, worst / plan.GIB)
