"""The training CLI end to end on tiny configs: stages, outputs, resume, sharding, bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from dmpo_jax.models import build as model_build
from dmpo_jax.training import checkpoint as ckpt_lib
from dmpo_jax.training import config as config_lib
from dmpo_jax.training import run as run_lib
from dmpo_jax.training import specs, stages
from dmpo_jax.training.memory import micro_batches
from dmpo_jax.training.steps import make_optimizer
from dmpo_jax.models import hf
from tests.helpers import REPO, adam_lr_sum, assert_adam_close, config_module, smoke, xla_flags

nphard = config_module("nphard")


def load_params(workdir):
  """The final policy, from the HF export."""
  model, _ = hf.load(os.path.join(workdir, "hf"))
  from flax import nnx
  return jax.tree.map(np.asarray, nnx.state(model, nnx.Param).to_pure_dict())


def env():
  e = dict(os.environ)
  e["XLA_FLAGS"] = xla_flags(2)
  e["PYTHONPATH"] = REPO
  return e


@pytest.mark.slow
def test_cli_smoke_dmpo(tmp_path):
  wd = tmp_path / "run"
  r = subprocess.run([sys.executable, "-m", "dmpo_jax.train", "--config=configs/nphard.py:smoke",
                      f"--workdir={wd}", "--config.log.tensorboard=False"],
                     cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "overall (category mean)" in r.stdout
  for f in ("config.json", "metrics.jsonl", "eval_before.json", "eval_after.json", "results.json",
            "training.png", "before_after.png", "hf/config.json", "hf/model.safetensors"):
    assert (wd / f).exists(), f
  rows = [json.loads(l) for l in open(wd / "metrics.jsonl")]
  assert [r["stage"] for r in rows].count("sft") == 3 and [r["stage"] for r in rows].count("rl") == 3
  assert all(np.isfinite(r["loss"]) for r in rows)
  assert ckpt_lib.Checkpointer(str(wd / "checkpoints")).latest_step() == 6
  res = json.loads((wd / "results.json").read_text())
  assert len(res["after"]["per_task"]) == 10 and "overall" in res["after"]
  # The exported policy opens in transformers.
  from transformers import AutoModelForCausalLM
  assert AutoModelForCausalLM.from_pretrained(str(wd / "hf")) is not None
  # dmpo_jax.evaluate scores the workdir's checkpoint, and the HF export on an NP-Bench file.
  out = tmp_path / "eval_ckpt"
  r = subprocess.run([sys.executable, "-m", "dmpo_jax.evaluate", f"--workdir={wd}", f"--out={out}",
                      "--tasks=TSP,knapsack", "--num=2", "--samples=3", "--batch_prompts=4"],
                     cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  ev = json.loads((out / "eval.json").read_text())
  assert set(ev["per_task"]) == {"TSP", "knapsack"} and ev["num_problems"] == 4
  assert (out / "eval.png").exists() and "overall" in (out / "table.txt").read_text()
  from dmpo_jax.tasks import data
  data.write_jsonl(data.generate(["subset-sum"], "tiny", 2, style="compact"), str(tmp_path / "f.jsonl"))
  r = subprocess.run([sys.executable, "-m", "dmpo_jax.evaluate", f"--hf={wd / 'hf'}",
                      f"--npbench_file={tmp_path / 'f.jsonl'}", f"--out={tmp_path / 'eval_hf'}",
                      "--style=compact", "--samples=3", "--max_new_tokens=8", "--batch_prompts=2"],
                     cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.loads((tmp_path / "eval_hf" / "eval.json").read_text())["num_problems"] == 2


@pytest.mark.slow
def test_dph_js_stage(tmp_path):
  cfg = smoke("smoke,algo=dph_js")
  res = stages.train(cfg, str(tmp_path))
  store = np.load(tmp_path / "dph_store.npz")
  assert store["pef_tokens"].shape[1] == cfg.model.max_prompt_len + cfg.model.max_new_tokens
  # every prompt is in exactly one of D_exp and D_pef (by index); stored responses are D_pef's
  pef, exp = set(store["pef_index"].tolist()), set(store["exp_index"].tolist())
  assert not pef & exp and len(pef | exp) == cfg.dph.num_prompts
  assert len(store["pef_index"]) == len(store["pef_tokens"])
  assert res["algo"] == "dph_js" and (tmp_path / "results.json").exists()


@pytest.mark.slow
def test_dph_with_stored_responses_adds_divergence(tmp_path):
  # An untrained smoke model rarely solves anything, so plant a store by marking every
  # prompt as D_pef (correct = feasible is replaced by a store we write ourselves).
  cfg = smoke("smoke,algo=dph_f", **{"rl.steps": 2})
  lp, lt = cfg.model.max_prompt_len, cfg.model.max_new_tokens
  n = 8
  rng = np.random.default_rng(0)
  tokens = rng.integers(5, 100, (n, lp + lt)).astype(np.int32)
  np.savez(tmp_path / "dph_store.npz", pef_tokens=tokens, pef_prompt_mask=np.ones((n, lp), np.int32),
           pef_mask=np.ones((n, lt), np.int32), pef_logprobs=np.full((n, lt), -4.0, np.float32),
           pef_index=np.arange(n), exp_index=np.arange(n, n + 4), version=2)
  stages.train(cfg, str(tmp_path))
  rows = [json.loads(l) for l in open(tmp_path / "metrics.jsonl") if '"rl"' in l]
  assert rows and all(r.get("divergence") is not None and np.isfinite(r["divergence"]) for r in rows)


@pytest.fixture(scope="module")
def one_device_run(tmp_path_factory):
  wd = tmp_path_factory.mktemp("d1")
  stages.train(smoke(**TWO_STEPS, **{"mesh.data": 1}), str(wd))
  return wd


TWO_STEPS = {"sft.steps": 1, "rl.steps": 1, "checkpoint.export_hf": True, "log.plots": False}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [(8, 1, 1), (2, 4, 1), (2, 2, 2)])
def test_meshes_match_one_device(mesh, tmp_path, one_device_run):
  assert jax.device_count() == 8
  shape = dict(zip(("mesh.data", "mesh.fsdp", "mesh.tensor"), mesh))
  stages.train(smoke(**TWO_STEPS, **shape), str(tmp_path))
  r8 = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  r1 = [json.loads(l) for l in open(one_device_run / "metrics.jsonl")]
  assert len(r8) == len(r1) == 2
  for x, y in zip(r8, r1):
    # Losses and gradient norms carry no Adam amplification: float32 reordering noise only
    # (~1e-7 relative; 1e-5 is ~100 ulps).
    assert x["loss"] == pytest.approx(y["loss"], rel=1e-5, abs=1e-6)
    assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-5, abs=1e-6)
  p8, p1 = load_params(tmp_path), load_params(one_device_run)
  assert_adam_close(p8, p1, lr_sum=adam_lr_sum(smoke(**TWO_STEPS)),
                    names=[jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(p1)])


def test_parameters_sharded_as_the_rules_say():
  from flax import nnx
  from jax.sharding import PartitionSpec as P
  from dmpo_jax.parallel import sharding
  model, _ = model_build.build(specs.model_spec(smoke()))
  _, state = nnx.split(model)
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  sh = sharding.param_shardings(state, mesh)
  placed = jax.device_put(state, sh)
  # hidden 32 (embed -> fsdp), mlp 64 (-> tensor), vocab 128 (-> tensor), heads x head_dim
  # (-> tensor); a dimension that does not divide by its mesh axes is replicated.
  assert placed["embed"].sharding.spec == P("tensor", "fsdp")
  assert placed["layers"][0]["mlp"]["gate"].sharding.spec == P("fsdp", "tensor")
  assert placed["layers"][0]["mlp"]["down"].sharding.spec == P("tensor", "fsdp")
  assert placed["layers"][0]["attn"]["q"].sharding.spec == P("fsdp", "tensor")
  assert sharding.logical_to_mesh(P("embed", "kv_heads"), (32, 15), mesh) == P("fsdp", None)
  assert sharding.logical_to_mesh(P("vocab", "embed"), (128, 32), sharding.make_mesh({"data": -1})) == P(None, None)
  assert placed["final_norm"]["scale"].sharding.spec == P(None)
  shard_shape = placed["layers"][0]["mlp"]["gate"].sharding.shard_shape((32, 64))
  assert shard_shape == (16, 32)


@pytest.mark.slow
def test_bad_config_fields_name_themselves(tmp_path):
  r = subprocess.run([sys.executable, "-m", "dmpo_jax.train", "--config=configs/nphard.py:smoke",
                      f"--workdir={tmp_path}", "--config.rl.no_such_field=1"],
                     cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
  assert r.returncode != 0 and "no_such_field" in r.stderr
  with pytest.raises(ValueError, match=r"config.rl.algo='ppo_xyz': must be one of .*dmpo"):
    stages.train(smoke("smoke,algo=ppo_xyz"), str(tmp_path / "p"))
  with pytest.raises(ValueError, match="unknown argument.*bogus"):
    nphard.get_config("smoke,bogus=1")
  with pytest.raises(ValueError, match=r"config.rl.group_size=1: grpo advantages need a group"):
    stages.train(smoke(**{"rl.group_size": 1}), str(tmp_path / "g"))
  with pytest.raises(ValueError, match=r"objective.agg='mean' is not one of"):
    stages.train(smoke(**{"rl.objective.agg": "mean"}), str(tmp_path / "o"))


@pytest.mark.slow
def test_a_batch_whose_groups_do_not_hold_stops_the_run_by_name(tmp_path, monkeypatch, capsys):
  """The prefix-shared update (config.rl.prefix_shared="auto", the default) on a batch whose
  [prompts, G] rows are not groups (one row's last prompt token changed after sampling): the
  step is skipped and the run stops naming the broken layout, the checkpoint before it
  intact; the run said which forward each log-prob pass ran."""
  from dmpo_jax.parallel import distributed as dist
  from dmpo_jax.training import rollout
  batch = rollout.Rollouts.batch

  def broken(self, data_sh):
    out = batch(self, data_sh)
    tok = dist.to_host(out["seqs"]["tokens"]).copy()
    p = out["seqs"]["prompt_mask"].shape[-1] - 1  # the last prompt slot: real (left padding)
    tok[0, 1, p] = tok[0, 1, p] - 1 if tok[0, 1, p] > 0 else 1
    out["seqs"] = dict(out["seqs"], tokens=dist.to_global(tok, data_sh))
    return out

  cfg = smoke("smoke,algo=grpo", **{"rl.steps": 2, "checkpoint.every": 1})
  monkeypatch.setattr(rollout.Rollouts, "batch", broken)
  with pytest.raises(run_lib.TrainingError, match=r"step 4: 1 rows of the update's batch have "
                     r"another prompt.*skipped.*checkpoint \(3\) is intact"):
    stages.train(cfg, str(tmp_path))
  out = capsys.readouterr().out
  assert "log-probs, update: prefix_shared (8 prompts x 4)" in out, out[-2000:]
  assert ckpt_lib.Checkpointer(str(tmp_path / "checkpoints")).latest_step() == 3


@pytest.mark.slow
def test_nonfinite_steps_stop_with_good_checkpoint(tmp_path, monkeypatch):
  # NaN rewards make every RL loss non-finite (injected in scoring: the config schema refuses a
  # NaN learning rate): each step is skipped and counted; the second in a row stops the run.
  # SFT ends at step 3; step 4 (skipped) is saved.
  from dmpo_jax.data import pipeline
  score = pipeline.score_groups

  def nan_rewards(*args, **kw):
    rewards, stats = score(*args, **kw)
    return np.full_like(rewards, np.nan), stats
  monkeypatch.setattr(pipeline, "score_groups", nan_rewards)
  cfg = smoke(**{"rl.nonfinite_patience": 2, "rl.steps": 5, "checkpoint.every": 1})
  with pytest.raises(run_lib.TrainingError, match="2 non-finite losses in a row.*checkpoint \\(4\\) is intact"):
    stages.train(cfg, str(tmp_path))
  ck = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"))
  assert ck.latest_step() == 4 and ck.read_meta(4)["counters"]["nonfinite_total"] == 1
  model, _ = model_build.build(specs.model_spec(cfg))
  from flax import nnx
  _, state = nnx.split(model)
  params = {"model": state}
  opt = make_optimizer(1e-3, 5, 1, 1.0)
  p3, _, _ = ck.restore(3, params, opt.init(params), model_build.shape(model))
  p4, _, _ = ck.restore(4, params, opt.init(params), model_build.shape(model))
  for x, y in zip(jax.tree.leaves(p3), jax.tree.leaves(p4)):
    assert np.isfinite(np.asarray(y)).all()
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # the NaN step changed nothing


@pytest.mark.slow
def test_other_model_shape_refused(tmp_path):
  stages.train(smoke(**{"rl.steps": 1, "checkpoint.export_hf": False}), str(tmp_path))
  with pytest.raises(ValueError, match=r"another config .*model.hidden_size: 32 -> 48; rl.steps: 1 -> 2"):
    stages.train(smoke(**{"rl.steps": 2, "model.hidden_size": 48}), str(tmp_path))
  os.remove(tmp_path / "config.json")  # no contract (a folder the sweep seeds): the checkpoint's check
  with pytest.raises(ckpt_lib.CheckpointError, match="another model shape.*hidden_size: checkpoint 32 vs config 48"):
    stages.train(smoke(**{"rl.steps": 2, "model.hidden_size": 48}), str(tmp_path))


@pytest.mark.slow
def test_sigint_saves_and_exits(tmp_path):
  wd = tmp_path / "run"
  p = subprocess.Popen([sys.executable, "-m", "dmpo_jax.train", "--config=configs/nphard.py:smoke",
                        f"--workdir={wd}", "--config.rl.steps=400", "--config.checkpoint.every=1000",
                        "--config.log.tensorboard=False"],
                       cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  metrics = wd / "metrics.jsonl"
  deadline = time.time() + 300
  while time.time() < deadline and not (metrics.exists() and '"rl"' in metrics.read_text()):
    time.sleep(0.5)
  p.send_signal(signal.SIGINT)
  out, err = p.communicate(timeout=300)
  assert p.returncode == 0, err[-2000:]
  assert "SIGINT: saved checkpoint at step" in out
  step = ckpt_lib.Checkpointer(str(wd / "checkpoints")).latest_step()
  assert 3 < step < 403   # past SFT, before the end: saved where it stopped


@pytest.mark.slow
def test_qwen_config_trains_a_local_hf_folder(tmp_path):
  """configs/nphard_qwen.py on a tiny random Qwen2 folder (task tokenizer saved in it):
  HF init, npbench prompts, bf16 compute, no SFT, one RL step, HF export."""
  from tests.helpers import tiny_hf
  from dmpo_jax.models import tokenizer
  nphard_qwen = config_module("nphard_qwen")
  folder = tmp_path / "qwen"
  tok = tokenizer.build(str(folder))
  tiny_hf(str(folder), vocab=-(-len(tok) // 8) * 8)
  cfg = nphard_qwen.get_config(str(folder))
  cfg.tasks, cfg.level, cfg.chat_template = "subset-sum", "tiny", False  # the task tokenizer has no chat template
  cfg.model.update(max_prompt_len=640, max_new_tokens=8)
  cfg.rl.update(steps=1, prompts_per_step=8, group_size=2, micro_batches=2)
  cfg.eval.update(num_per_task=1, samples=3, pass_ks=(1, 3), batch_prompts=8)
  cfg.mesh.update(data=1, fsdp=2)  # params over 2 devices; micro-batch slices of 4 prompts
  cfg.log.update(tensorboard=False, progress=False)
  res = stages.train(cfg, str(tmp_path / "run"))
  assert res["steps"] == {"sft": 0, "rl": 1}
  model, _ = hf.load(str(tmp_path / "run" / "hf"))
  assert model.cfg.hidden_size == 64
  with pytest.raises(ValueError, match="needs a model folder"):
    nphard_qwen.get_config(None)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "gspo", "dmpo", "dapo", "gpg", "rkl"])
def test_micro_batches_match_one_batch_exactly_when_slice_exact(algo):
  """Gradient accumulation over slices of whole groups gives the full batch's update for the
  objectives presets.slice_exact names (what auto micro-batching relies on), not for others."""
  import optax
  from flax import nnx
  from dmpo_jax.training import steps
  from dmpo_jax.objectives import presets
  cfg = smoke()
  model, _ = model_build.build(specs.model_spec(cfg))
  graphdef, state = nnx.split(model)
  P, G, LP, LT = 8, 4, 6, 5
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 100, (P, G, LP + LT)).astype(np.int32)
  tokens[:, :, :LP] = tokens[:, :1, :LP]  # a group's G samples share its prompt (rollouts' layout)
  batch = {"seqs": {"tokens": tokens, "prompt_mask": np.ones((P, G, LP), np.int32)},
           "mask": (rng.random((P, G, LT)) < 0.6).astype(np.int32),
           "old_logprobs": rng.normal(-4, 0.3, (P, G, LT)).astype(np.float32),
           "ref_logprobs": rng.normal(-4, 0.3, (P, G, LT)).astype(np.float32),
           "rewards": rng.random((P, G)).astype(np.float32)}
  obj = presets.objective_config(algo)
  outs = []
  for mb in (1, P):
    opt = optax.sgd(0.1)
    step = steps.make_rl_step(graphdef, obj, opt, LP, 1.0, micro_batches=mb)
    params = {"model": jax.tree.map(jax.numpy.copy, state)}
    p, _, m = step(params, opt.init(params), batch)
    outs.append((p, m))
  (p1, m1), (p8, m8) = outs
  same = np.isclose(float(m1["loss"]), float(m8["loss"]), rtol=1e-5, atol=0) and all(
      np.allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
      for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)))
  assert same == presets.slice_exact(obj), (algo, float(m1["loss"]), float(m8["loss"]))


def test_auto_micro_batches():
  from dmpo_jax.parallel import sharding
  from dmpo_jax.objectives import presets
  cfg = smoke()  # 8 prompts per step
  one = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  eight = sharding.make_mesh({"data": 8}, jax.devices()[:8])
  dmpo, dph = presets.objective_config("dmpo"), presets.objective_config("dph_js")
  assert cfg.rl.micro_batches == 0  # auto by default
  assert micro_batches(cfg, dmpo, one) == 8  # one group per slice on a CPU
  assert micro_batches(cfg, dmpo, eight) == 1  # every slice must span the 8 devices
  assert micro_batches(cfg, dph, one) == 1  # token-mean divergence: slicing would change it
  cfg.rl.micro_batches = 2
  assert micro_batches(cfg, dph, one) == 2  # an explicit value is kept


def test_frozen_vision_optimizer_has_no_tower_state_and_no_tower_update():
  """make_optimizer(freeze_vision=True): params["model"]["visual"] gets a zero update and no
  AdamW moments; the other params are updated as by the plain optimizer."""
  import jax.numpy as jnp
  params = {"model": {"visual": {"w": jnp.ones((4, 3))}, "language": {"w": jnp.ones((5,))}},
            "log_z": {"b": jnp.ones((2,))}}
  grads = {"model": {"visual": {"w": jnp.zeros((4, 3))}, "language": {"w": jnp.full((5,), 0.1)}},
           "log_z": {"b": jnp.full((2,), -0.1)}}  # norm < 1: no clipping either way
  sizes = lambda state: sum(np.size(x) for x in jax.tree.leaves(state))
  updates = {}
  for freeze in (False, True):
    opt = make_optimizer(1e-2, 5, 1, 1.0, freeze_vision=freeze)
    state = opt.init(params)
    updates[freeze] = [sizes(state)]
    for _ in range(2):  # the first step's warmup learning rate is 0
      g = grads if not freeze else {**grads, "model": {**grads["model"],
                                                       "visual": {"w": jnp.full((4, 3), 0.3)}}}
      up, state = opt.update(g, state, params)
    updates[freeze].append(up)
  assert updates[False][0] - updates[True][0] == 2 * 12  # the tower's mu and nu
  plain, frozen = updates[False][1], updates[True][1]
  np.testing.assert_array_equal(frozen["model"]["visual"]["w"], 0.0)  # whatever its gradient
  assert np.abs(np.asarray(plain["model"]["visual"]["w"])).max() == 0  # zero grad, zero update
  for path in (("model", "language", "w"), ("log_z", "b")):
    a, b = plain, frozen
    for k in path:
      a, b = a[k], b[k]
    assert np.abs(np.asarray(a)).min() > 0 and np.allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_optimizer_schedule_warmup_and_decay(warmup):
  """The learning rate of each step (Adam on a constant gradient moves by the rate): warmup 0
  starts at lr (RL: its first step is not wasted), warmup k starts at 0 and peaks at step k;
  all end at lr / 10 after steps_total."""
  import jax.numpy as jnp
  opt = make_optimizer(1.0, 10, warmup, 1e9)
  params = {"w": jnp.zeros(())}
  state, rates = opt.init(params), []
  for _ in range(11):
    update, state = opt.update({"w": jnp.ones(())}, state, params)
    rates.append(-float(update["w"]))
  assert rates[warmup] == pytest.approx(1.0, abs=1e-4)
  assert all(r == pytest.approx(i / warmup, abs=1e-4) for i, r in enumerate(rates[:warmup]))
  assert all(a > b for a, b in zip(rates[warmup:], rates[warmup + 1:]))  # then decays
  assert rates[10] == pytest.approx(0.1, abs=1e-4)  # Adam: rate x (1 - ~1e-5)


def test_task_keys_take_commas_or_plus_signs():
  from ml_collections import config_dict
  keys = lambda s: config_lib.task_keys(config_dict.ConfigDict({"tasks": s}))
  assert keys("TSP,knapsack") == keys("TSP+knapsack") == keys(" TSP , knapsack,") == ["TSP", "knapsack"]
  assert len(keys("all")) == 10


def test_vision_lr_scale_slows_only_the_tower():
  """make_optimizer(vision_lr_scale=s): the tower's update is s times the plain one (same
  gradients, Adam), the other params' are the plain ones; s <= 0 is refused."""
  import jax.numpy as jnp
  params = {"model": {"visual": {"w": jnp.ones((3,))}, "language": {"w": jnp.ones((2,))}}}
  grads = {"model": {"visual": {"w": jnp.full((3,), 0.2)}, "language": {"w": jnp.full((2,), -0.1)}}}
  ups = {}
  for scale in (1.0, 0.1):
    opt = make_optimizer(1e-2, 5, 0, 1.0, vision_lr_scale=scale)
    ups[scale], _ = opt.update(grads, opt.init(params), params)
  np.testing.assert_allclose(ups[0.1]["model"]["visual"]["w"], 0.1 * ups[1.0]["model"]["visual"]["w"],
                             rtol=1e-6)
  np.testing.assert_array_equal(ups[0.1]["model"]["language"]["w"], ups[1.0]["model"]["language"]["w"])
  assert np.abs(np.asarray(ups[1.0]["model"]["visual"]["w"])).min() > 0
  with pytest.raises(ValueError, match="vision_lr_scale=0 must be > 0"):
    make_optimizer(1e-2, 5, 0, 1.0, vision_lr_scale=0)
