"""The memory planner: exact parameter and optimizer bytes, and refusal of plans that do not fit."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from dmpo_jax import plan
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
