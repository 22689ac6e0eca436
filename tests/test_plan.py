"""The memory planner: exact parameter and optimizer bytes, and refusal of plans that do not fit."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from dmpo_jax import plan, sharding
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
