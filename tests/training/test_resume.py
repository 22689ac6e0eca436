"""Resume drills: every preset, stopped at the end of SFT and again mid-RL and resumed in this
process, ends bit-identical to an uninterrupted run (params, optimizer state, every logged
metric but timings); a run killed between its last checkpoint and its last evaluation point
ends with every point an uninterrupted run has."""

import os
import shutil

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



def resume_cases() -> list[str]:
  """grpo and dmpo, then one preset of each other kind of state a resume must restore (a
  reference policy, a log Z head, a DPH store, host state, each batch field a term declares):
  a new preset with a new kind of state is drilled without being named here; the presets that
  differ from grpo only in their loss are not drilled again."""
  def kind(name):
    c = presets.objective_config(name)
    return (presets.needs_reference(c), presets.needs_log_z(c), presets.needs_dph_store(c),
            presets.needs_host_state(c), presets.batch_needs(c))
  cases, kinds = ["grpo", "dmpo"], {kind("grpo"), kind("dmpo")}
  for name in presets.preset_names():
    if kind(name) not in kinds:
      cases.append(name)
      kinds.add(kind(name))
  return cases


def test_the_resume_drill_covers_every_kind_of_state():
  cases = resume_cases()
  assert {"grpo", "dmpo", "rkl", "flowrl", "outcome_ucb", "pkpo", "clip_cov", "outcome_batch"} <= set(cases)
  assert any(presets.needs_dph_store(presets.objective_config(n)) for n in cases)
  assert len(cases) < len(presets.preset_names())


@pytest.mark.slow
@pytest.mark.parametrize("algo", resume_cases())
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


POINTS = {"sft.steps": 3, "rl.steps": 3, "eval.points": 4, "checkpoint.every": 2, "checkpoint.export_hf": False,
          "log.plots": False, "tasks": "subset-sum,knapsack", "eval.num_per_task": 2}


def run_files(workdir) -> dict:
  """The point files, the evaluation after RL and the metrics rows (timings aside) of a run."""
  from dmpo_jax.training import report
  pts = workdir / "points"
  return {"points": {f: report.read_json(str(pts / f)) for f in sorted(os.listdir(pts))},
          "after": report.read_json(str(workdir / "eval_after.json")), "rows": metric_rows(workdir)}


@pytest.mark.slow
def test_a_run_killed_between_its_last_checkpoint_and_its_last_point_ends_with_every_point(tmp_path, monkeypatch):
  """The point of a step is written before its checkpoint, so a fault in the last point
  leaves no checkpoint past the last complete point; and a run resumed at its end whose last
  point file is missing (a kill under the older order) computes it. Both end with the point
  files, the evaluation after RL and the metrics of an uninterrupted run."""
  from dmpo_jax.training import points as eval_points
  a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
  cfg = lambda: smoke("smoke,algo=dmpo", **POINTS)  # dmpo moves the policy at reward 0: points differ
  stages.train(cfg(), str(a))
  want = run_files(a)
  assert sorted(want["points"]) == ["rl0.json", "rl1.json", "rl2.json", "rl3.json"]
  assert want["points"]["rl3.json"]["sets"]["held_out"]["overall"]["kl_k1"] != 0.0

  evaluate = eval_points.Points.evaluate
  def fault(self, state, rl_step):
    if rl_step == 3:
      raise RuntimeError("killed in the last point")
    return evaluate(self, state, rl_step)
  monkeypatch.setattr(eval_points.Points, "evaluate", fault)
  with pytest.raises(RuntimeError, match="killed in the last point"):
    stages.train(cfg(), str(b))
  monkeypatch.setattr(eval_points.Points, "evaluate", evaluate)
  ck = ckpt_lib.Checkpointer(str(b / "checkpoints"), keep=2)
  assert ck.mngr.all_steps() == [3, 4]  # not 6: its point was not written
  ck.close()
  stages.train(cfg(), str(b))  # resumes at 4, redoes 5 and 6
  assert run_files(b) == want

  shutil.copytree(a, c)  # the folder: checkpoint 6, no rl3.json, no results yet
  for f in ("points/rl3.json", "results.json", "eval_after.json"):
    os.remove(c / f)
  stages.train(cfg(), str(c))  # resumes at 6: rl_stage computes the point before returning
  assert run_files(c) == want
