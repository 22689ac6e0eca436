"""LoRA training (models/lora.py, training/steps.py, checkpoint.py): an update trains the adapters
alone (the base bit-identical, no base gradient, no base optimizer state, clipping over the
adapters), the reference policy is the base with the adapters off and equals a separately
loaded base, a LoRA run saves its base once and resumes bit-identically, and the memory plan
counts exactly the built model's adapters."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dmpo_jax.models import hf, lora
from dmpo_jax.models.config import LoRAConfig
from dmpo_jax.models.transformer import Transformer
from dmpo_jax.objectives import presets
from dmpo_jax.training import steps
from tests.helpers import metric_rows, saved_state, smoke, tiny_config, tiny_hf

P, G, LP, LT = 2, 4, 6, 5
LCFG = LoRAConfig(rank=4, alpha=8)


def rl_batch(seed=0, vocab=61):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, vocab, (P, G, LP + LT)).astype(np.int32)
  tokens[:, :, :LP] = tokens[:, :1, :LP]  # a group's G samples share its prompt (rollouts' layout)
  return {"seqs": {"tokens": tokens, "prompt_mask": np.ones((P, G, LP), np.int32)},
          "mask": (rng.random((P, G, LT)) < 0.7).astype(np.int32),
          "old_logprobs": rng.normal(-4, 0.3, (P, G, LT)).astype(np.float32),
          "ref_logprobs": rng.normal(-4, 0.3, (P, G, LT)).astype(np.float32),
          "rewards": rng.random((P, G)).astype(np.float32)}


def split(tree):
  """(base leaves, adapter leaves) of a params tree, as numpy, in tree order."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  base = [np.asarray(x) for p, x in flat if not lora.is_adapter_path(p)]
  return base, [np.asarray(x) for p, x in flat if lora.is_adapter_path(p)]


def lora_params(seed=0, b_scale=0.0):
  model = Transformer(tiny_config(lora=LCFG), rngs=nnx.Rngs(seed))
  for n, ad in enumerate(lora.adapters(model).values()):
    if b_scale:
      ad.lora_b[...] = b_scale * jax.random.normal(jax.random.key(n), ad.lora_b.shape)
  graphdef, state = nnx.split(model)
  return graphdef, {"model": state}


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "rl"])
def test_one_update_trains_the_adapters_alone(stage):
  graphdef, params = lora_params(b_scale=0.05)
  base0, ad0 = split(params)
  opt = steps.make_optimizer(1e-2, 10, 0, 0.5, lora=True)
  opt_state = opt.init(params)
  # AdamW moments for the adapters only (plus step counts): none for the frozen base.
  n_adapters = lora.count(params)
  moments = [x for x in jax.tree.leaves(opt_state) if x.ndim]  # the rest: step counts
  assert sum(x.size for x in moments) == 2 * n_adapters
  batch = rl_batch()
  if stage == "rl":
    step = steps.make_rl_step(graphdef, presets.objective_config("grpo"), opt, LP, 1.0)
  else:
    step = steps.make_sft_step(graphdef, opt, LP)
    batch = {"seqs": {k: v.reshape(P * G, -1) for k, v in batch["seqs"].items()},
             "mask": batch["mask"].reshape(P * G, -1)}
  # The gradient the step clips: the adapters' alone (the base's is not computed).
  fn = steps.make_logprob_fn(graphdef, LP)
  grads = jax.jit(jax.grad(lambda p: fn(p, jax.tree.map(jnp.asarray, batch["seqs"]))["logprobs"].sum()))(params)
  gbase, gad = split(grads)
  assert all(not g.any() for g in gbase) and any(g.any() for g in gad)
  new, new_state, m = step(params, opt_state, batch)
  assert int(m["skipped"]) == 0 and float(m["grad_norm"]) > 0
  base1, ad1 = split(new)
  for a, b in zip(base0, base1):
    np.testing.assert_array_equal(a, b)  # bit-identical
  assert sum(not np.array_equal(a, b) for a, b in zip(ad0, ad1)) == len(ad0)  # A and B move
  assert jax.tree.structure(new_state) == jax.tree.structure(opt_state)


@pytest.mark.parametrize("prefix_shared", [False, None])
def test_the_base_gets_no_gradient_matmul(prefix_shared):
  """The frozen base's weight gradients are never computed: no dot of the backward pass that
  contracts over rows (a weight's gradient: neither operand contracts its last, feature axis)
  has a base weight's shape (the adapters' A and B gradients are there), on the per-row and the
  prefix-shared forward (whose row counts can equal a weight's dims, so shapes alone do not
  tell a forward dot from a gradient)."""
  graphdef, params = lora_params(b_scale=0.05)
  fn = steps.make_logprob_fn(graphdef, LP, prefix_shared=prefix_shared)
  seqs = jax.tree.map(jnp.asarray, rl_batch()["seqs"])
  jaxpr = jax.make_jaxpr(jax.grad(lambda p: fn(p, seqs)["logprobs"].sum()))(params)
  shapes = set()

  def walk(jx):
    for eqn in jx.eqns:
      if eqn.primitive.name == "dot_general":
        (lc, rc), _ = eqn.params["dimension_numbers"]
        lhs, rhs = (v.aval.ndim for v in eqn.invars)
        if lhs - 1 not in lc and rhs - 1 not in rc:  # contracts rows: a weight gradient
          shapes.add(tuple(eqn.outvars[0].aval.shape))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)
  walk(jaxpr.jaxpr)
  d, f, q, kv, r = 32, 48, 32, 16, LCFG.rank
  assert not shapes & {(d, q), (d, kv), (q, d), (d, f), (f, d)}, shapes
  assert {(d, r), (r, q), (f, r), (r, d)} <= shapes  # A and B gradients


def scan_carry_shapes(fn, *args) -> set:
  """The shapes of every lax.scan carry in fn's jaxpr."""
  shapes = set()

  def walk(jx):
    for eqn in jx.eqns:
      if eqn.primitive.name == "scan":
        n = eqn.params["num_consts"]
        shapes.update(tuple(v.aval.shape) for v in eqn.invars[n:n + eqn.params["num_carry"]])
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)
  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return shapes


@pytest.mark.slow
@pytest.mark.parametrize("term_grads", [False, True])
def test_micro_batches_carry_no_gradient_buffer_for_the_frozen_base(term_grads):
  """Summed over micro-batches, the frozen base's gradients ride as scalar zeros (no base-sized
  carry in the scan), and the result is bit-identical to carrying them in full."""
  graphdef, params = lora_params(b_scale=0.05)
  obj = presets.objective_config("grpo")
  loss = presets.build_loss(obj, steps.make_logprob_fn(graphdef, LP, temperature=1.0),
                            reg_loss=term_grads)
  vg = steps.term_gradients(loss) if term_grads else jax.value_and_grad(loss, has_aux=True)
  batch = jax.tree.map(jnp.asarray, rl_batch())
  frozen = steps.frozen_filter(params, False)
  slim = lambda p, b: steps.accumulate(vg, p, b, 2, frozen)
  full = lambda p, b: steps.accumulate(vg, p, b, 2)
  d, f, q, kv = 32, 48, 32, 16
  base_shapes = {(d, q), (d, kv), (q, d), (d, f), (f, d)}
  assert base_shapes & scan_carry_shapes(full, params, batch)  # the check can fail
  assert not base_shapes & scan_carry_shapes(slim, params, batch)
  a, b = jax.jit(slim)(params, batch), jax.jit(full)(params, batch)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_clipping_norm_is_over_the_adapters():
  graphdef, params = lora_params(b_scale=0.05)
  opt = steps.make_optimizer(1.0, 10, 0, 1e-3, lora=True)  # a tiny clip: every update clipped
  batch = rl_batch()
  obj = presets.objective_config("grpo")
  loss = presets.build_loss(obj, steps.make_logprob_fn(graphdef, LP, temperature=1.0))
  grads = jax.jit(jax.grad(lambda p: loss(p, jax.tree.map(jnp.asarray, batch))[0]))(params)
  want = optax.global_norm(split(grads)[1])
  step = steps.make_rl_step(graphdef, obj, opt, LP, 1.0)
  _, _, m = step(jax.tree.map(jnp.copy, params), opt.init(params), batch)
  np.testing.assert_allclose(float(m["grad_norm"]), float(want), rtol=1e-5)
  with pytest.raises(ValueError, match="hold no adapters"):
    opt.init({"model": nnx.state(Transformer(tiny_config(), rngs=nnx.Rngs(0)))})


@pytest.mark.slow
def test_reference_is_the_base_with_the_adapters_off(tmp_path):
  """The reference policy of a LoRA run, read from the trained params, equals the base model
  loaded on its own within 1e-6, and no copy is saved."""
  from dmpo_jax.training import checkpoint as ckpt_lib
  from dmpo_jax.training import stages
  from dmpo_jax.training.state import TrainState
  tiny_hf(str(tmp_path / "base"), "qwen2", vocab=61)
  model, _ = hf.load(str(tmp_path / "base"))
  lora.attach(model, LCFG, jax.random.key(0))
  for n, ad in enumerate(lora.adapters(model).values()):  # a trained adapter
    ad.lora_b[...] = 0.1 * jax.random.normal(jax.random.key(n), ad.lora_b.shape)
  graphdef, state = nnx.split(model)
  params = {"model": state}
  ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"))
  ts = TrainState(params=params, opt_state=None, step=0, key=jax.random.key(0))
  ref = stages.reference_policy(ck, ts, 0)
  assert ref == lora.ADAPTERS_OFF and not ck.has_reference()
  ck.close()
  seqs = jax.tree.map(jnp.asarray, rl_batch(vocab=61)["seqs"])
  ours = steps.make_logprob_eval(graphdef, LP, 1.0)(lora.reference_params(ref, params), seqs)
  base, _ = hf.load(str(tmp_path / "base"))
  bg, bs = nnx.split(base)
  want = steps.make_logprob_eval(bg, LP, 1.0)({"model": bs}, seqs)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(want), rtol=0, atol=1e-6)
  adapted = steps.make_logprob_eval(graphdef, LP, 1.0)(params, seqs)
  assert np.abs(np.asarray(adapted) - np.asarray(want)).max() > 1e-3  # the adapters matter


def test_plan_counts_the_built_models_adapters():
  from dmpo_jax.parallel import plan
  for targets in (("q_proj", "v_proj"), ("o_proj", "gate_proj", "up_proj", "down_proj")):
    cfg = tiny_config(lora=LoRAConfig(rank=6, targets=targets), param_dtype="bfloat16")
    p = plan.plan(cfg, {"data": 1}, plan.Workload(prompts=2, group=2, prompt_len=8, new_tokens=8,
                                                  reference=True))
    built = nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)))
    assert p["trainable_params"] == lora.count(built) == cfg.num_adapter_params()
    assert p["params"] == sum(x.size for x in jax.tree.leaves(built))
    assert p["optimizer_bytes"] == 2 * 4 * lora.count(built)  # float32 mu and nu of the adapters
    assert p["grad_bytes"] == 4 * lora.count(built) and p["reference_bytes"] == 0
  full = plan.plan(tiny_config(), {"data": 1}, plan.Workload(prompts=2, group=2, prompt_len=8,
                                                             new_tokens=8))
  assert full["trainable_params"] == full["params"]


@pytest.mark.slow
def test_plan_cli_puts_7b_and_8b_lora_grpo_on_one_80gb_device(capsys):
  from dmpo_jax.parallel import plan
  args = ["--mesh=data=1,fsdp=1,tensor=1", "--device_gib=80", "--prompts=8", "--group=8",
          "--prompt_len=1024", "--new_tokens=1024", "--remat", "--reference"]
  for model in ("qwen2.5-7b", "llama3.1-8b"):
    plan.main([f"--model={model}", "--lora_rank=64", *args])
    out = capsys.readouterr().out
    assert "-> fits" in out and "LoRA rank 64" in out and "no copy" in out
  with pytest.raises(SystemExit):  # full fine-tuning does not fit
    plan.main(["--model=qwen2.5-7b", *args])
  assert "DOES NOT FIT" in capsys.readouterr().out
  with pytest.raises(SystemExit):
    plan.main(["--model=qwen2.5-7b", "--lora_rank=0", *args])
  assert "LoRAConfig.rank must be a positive int, got 0" in capsys.readouterr().err


# ---------------------------------------------------------------------------
DRILL = {"sft.steps": 1, "rl.steps": 3, "checkpoint.every": 1, "checkpoint.keep": 1, "mesh.data": 2,
         "checkpoint.export_hf": False, "log.plots": False, "tasks": "subset-sum,knapsack",
         "eval.num_per_task": 4}


def lora_smoke(export="merged", **over):
  cfg = smoke("smoke,algo=rkl", **{**DRILL, **over})  # rkl: a KL term, so a reference is read
  with cfg.unlocked():
    cfg.model.lora = {"rank": 4, "alpha": 8.0, "targets": ("q_proj", "v_proj", "down_proj"),
                      "export": export}
  return cfg


@pytest.mark.slow
def test_lora_run_saves_its_base_once_and_resumes_bit_identically(tmp_path):
  from dmpo_jax.training import checkpoint as ckpt_lib
  from dmpo_jax.training import stages
  a, b = tmp_path / "a", tmp_path / "b"
  stages.train(lora_smoke("adapter", **{"checkpoint.export_hf": True}), str(a))
  # The export is a PEFT adapter folder holding the final adapters (checked below).
  assert (a / "hf" / "adapter_config.json").exists() and not (a / "hf" / "model.safetensors").exists()
  assert stages.train(lora_smoke(stop_at_step=2), str(b)) == {"stopped": True, "step": 2}
  stages.train(lora_smoke(), str(b))  # resumes 2 -> 4
  for w in (a, b):
    ck = ckpt_lib.Checkpointer(str(w / "checkpoints"), keep=1)
    assert ck.mngr.all_steps() == [4] and ck.has_base() and not ck.has_reference()
    ck.close()
  sa, sb = saved_state(a, 4), saved_state(b, 4)
  # A step holds the adapters and their AdamW state alone; the base is its own item.
  assert all(lora.is_adapter_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(sa["params"])[0])
  assert jax.tree.structure(sa) == jax.tree.structure(sb)
  for x, y in zip(jax.tree.leaves(sa), jax.tree.leaves(sb)):
    np.testing.assert_array_equal(x, y)
  import orbax.checkpoint as ocp
  base = [ocp.PyTreeCheckpointer().restore(str(w / "checkpoints" / "base")) for w in (a, b)]
  for x, y in zip(jax.tree.leaves(base[0]), jax.tree.leaves(base[1])):
    np.testing.assert_array_equal(x, y)
  assert metric_rows(a) == metric_rows(b)
  # The base saved is the model's initial base: restoring step 4 into a fresh model gives
  # the trained adapters on the untouched base.
  from dmpo_jax.training import run as run_lib
  run, state = run_lib.setup(lora_smoke(), str(tmp_path / "fresh"))
  run.close()
  fresh_base, _ = split(state.params)
  restored = ckpt_lib.Checkpointer(str(a / "checkpoints"), keep=1)
  params, _ = restored.restore_params(4, state.params, run.model_shape)
  restored.close()
  for x, y in zip(fresh_base, split(params)[0]):
    np.testing.assert_array_equal(x, y)
  for x, y in zip(split(params)[1], jax.tree.leaves(sa["params"])):
    np.testing.assert_array_equal(x, y)
  # The exported adapter is the final one, in PEFT's layout (lora_A [r, in] = our A^T).
  model = nnx.merge(run.graphdef, params["model"])
  want = {k: np.asarray(v) for k, v in hf.adapter_tensors(model).items()}
  from safetensors.numpy import load_file
  got = load_file(str(a / "hf" / "adapter_model.safetensors"))
  assert sorted(got) == sorted(want) and len(got) == 2 * 3
  for k in want:
    np.testing.assert_array_equal(got[k], want[k])
