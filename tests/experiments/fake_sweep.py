"""A sweep entry point whose trainer is a stand-in, for tests/experiments/test_workers.py: the
collapse frontier's design and the real runner (`--processes` included), with `train` below in
place of stages.train.

`train` writes what the sweep and its report read (config.json, metrics rows through the real
MetricsWriter, cut back on resume, the due evaluation points before the checkpoint of their
step, checkpoint folders every 2 steps, at the ends of SFT and RL and where a signal stopped it,
eval_before/eval_after, results.json), resumes from its newest checkpoint folder, and appends
one line per call to <out>/calls.jsonl: the run, its start step and the process id. Its rows
and points depend on the run's config and seed only. FAKE_STEP_S (env) pauses each step
inside the trainer's own StopSignal, so that a signal arrives mid-run."""

from __future__ import annotations

import json
import os
import sys
import time

from dmpo_jax.experiments import sweep
from dmpo_jax.training import checkpoint, points, report
from dmpo_jax.training import config as config_lib
from studies.collapse_frontier import design

PROG = "python -m tests.experiments.fake_sweep"


def write_point(cfg, wd: str, step: int) -> None:
  """The evaluation point due at `step` (none when none is due or its file exists)."""
  rl = step - cfg.sft.steps
  path = os.path.join(wd, points.DIR, f"rl{rl}.json")
  if rl in points.point_steps(cfg.rl.steps, cfg.eval.points) and not os.path.exists(path):
    v = {"kl_k1": 0.01 * rl + cfg.seed + (cfg.rl.algo == "dmpo"), "pass_optimal@1": 0.1 * rl}
    report.write_json({"rl_step": rl, "sets": {"held_out": {"overall_instance": v, "overall": v,
                                                            "per_task": {}}}}, path)


def train(cfg, wd: str) -> dict:
  out = os.path.dirname(os.path.dirname(wd))
  steps = sweep.checkpoint_steps(wd)
  start = max(steps, default=0)
  with open(os.path.join(out, "calls.jsonl"), "a") as f:
    f.write(json.dumps({"run": os.path.relpath(wd, out), "start": start, "pid": os.getpid()}) + "\n")
  report.write_json(config_lib.config_json(cfg), os.path.join(wd, "config.json"))
  writer = report.MetricsWriter(wd, False, resume_step=start if steps else None)
  sft, total = cfg.sft.steps, cfg.sft.steps + cfg.rl.steps
  end = cfg.stop_at_step if cfg.stop_at_step >= 0 else total
  pause = float(os.environ.get("FAKE_STEP_S", "0"))
  if start >= sft:
    write_point(cfg, wd, start)
  with checkpoint.StopSignal() as stop:
    for step in range(start + 1, end + 1):
      time.sleep(pause)
      writer.write(step, "sft" if step <= sft else "rl",
                   {"x": step + 10 * cfg.seed + 100 * (cfg.rl.algo == "dmpo")})
      if step == sft:
        report.write_json({"overall": {"SR_mean": 0.1}}, os.path.join(wd, "eval_before.json"))
      if step >= sft:
        write_point(cfg, wd, step)
      if step % 2 == 0 or step in (sft, total) or stop.received:
        os.makedirs(os.path.join(wd, "checkpoints", str(step)), exist_ok=True)
      if stop.received and step < end:
        return {"stopped": True, "step": step}
  if end < total:
    return {"stopped": True, "step": end}
  write_results(cfg, wd)
  return {}


def write_results(cfg, wd: str) -> None:
  """What a finished run leaves: the evaluation after RL and results.json."""
  report.write_json({"overall": {"SR_mean": 0.2}}, os.path.join(wd, "eval_after.json"))
  report.write_json({"after": {"overall": {"SR_mean": 0.2}}, "steps": {"sft": cfg.sft.steps, "rl": cfg.rl.steps},
                     "wall_s": 1.0}, os.path.join(wd, "results.json"))


def main(argv=None) -> int:
  return sweep.main(argv, design=design.DESIGN, prog=PROG, train_fn=train)


if __name__ == "__main__":
  sys.exit(main())
