"""Resume drills: every preset, stopped at the end of SFT and again mid-RL and resumed in this
process, ends bit-identical to an uninterrupted run (params, optimizer state, every logged
metric but timings)."""


import jax
import numpy as np
import pytest

from dmpo_jax.training import checkpoint as ckpt_lib
from dmpo_jax.training import stages
from dmpo_jax.objectives import presets
from tests.helpers import metric_rows, saved_state, smoke

# One SFT step, three RL steps on a 2-device mesh; a checkpoint every step keeping one, so
# rotation runs. The suite's persistent compilation cache (conftest.py) compiles each program
# once for the three runs of a preset.
DRILL = {"sft.steps": 1, "rl.steps": 3, "checkpoint.every": 1, "checkpoint.keep": 1, "mesh.data": 2,
         "checkpoint.export_hf": False, "log.plots": False, "tasks": "subset-sum,knapsack",
         "eval.num_per_task": 4}



@pytest.mark.slow
@pytest.mark.parametrize("algo", presets.preset_names())
def test_resume_mid_rl_is_bit_identical(algo, tmp_path):
  a, b = tmp_path / "a", tmp_path / "b"
  arg = f"smoke,algo={algo}"
  stages.train(smoke(arg, **DRILL), str(a))
  needs_ref = presets.needs_reference(presets.objective_config(algo))
  # stop at the end of SFT, then after the first RL step
  assert stages.train(smoke(arg, **DRILL, stop_at_step=1), str(b)) == {"stopped": True, "step": 1}
  assert not ckpt_lib.Checkpointer(str(b / "checkpoints"), keep=1).has_reference()
  assert stages.train(smoke(arg, **DRILL, stop_at_step=2), str(b)) == {"stopped": True, "step": 2}
  ck = ckpt_lib.Checkpointer(str(b / "checkpoints"), keep=1)
  assert ck.has_reference() == needs_ref  # written when RL started, at step 1
  ck.close()
  stages.train(smoke(arg, **DRILL), str(b))  # resumes 2 -> 4
  ck = ckpt_lib.Checkpointer(str(b / "checkpoints"), keep=1)
  assert ck.mngr.all_steps() == [4] and ck.has_reference() == needs_ref  # rotation kept it
  ck.close()
  sa, sb = saved_state(a, 4), saved_state(b, 4)
  assert jax.tree.structure(sa) == jax.tree.structure(sb)
  for x, y in zip(jax.tree.leaves(sa), jax.tree.leaves(sb)):
    np.testing.assert_array_equal(x, y)
  ra, rb = metric_rows(a), metric_rows(b)
  assert [r["stage"] for r in ra] == ["sft", "rl", "rl", "rl"]
  assert ra == rb
  # A host reward-shaping term's state (outcome_ucb's answer counts) is restored exactly too.
  metas = [ckpt_lib.Checkpointer(str(w / "checkpoints"), keep=1) for w in (a, b)]
  shaping = [m.read_meta(4)["counters"].get("shaping") for m in metas]
  for m in metas:
    m.close()
  assert shaping[0] == shaping[1]
  assert (shaping[0] is not None) == presets.needs_host_state(presets.objective_config(algo))
