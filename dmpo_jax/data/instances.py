"""What a config trains and evaluates on, without building a model: `--dry_run`.

    python -m dmpo_jax.train --config=configs/collapse.py --workdir=/tmp/dry --dry_run

writes DIR/instances.json, {"sft": [[task, instance], ...], "rl": [...], "eval": [...]}:
every instance the SFT stage trains on (one row per instance of a step, in order;
each appears config.sft.solutions_per_instance times in the batch; config.sft.gym_tasks'
rows among them), every RL prompt in order, and the evaluation set (with splits: C; A
and B are evaluated too, and their instances are the ones under "sft" and "rl"); with
config.eval.transfer, "transfer": the transfer evaluation's instances. The RL rows are the stream before
DPH's D_pef is taken out of it (dph_* presets skip those rows), so "rl" is a superset
of what a dph_* run trains on. Also "splits" (A, B, C) where the config has them, and
"checks": which of the promised disjointness properties hold.
"""

from __future__ import annotations

import dataclasses
import json
import os

from dmpo_jax.files import atomic_write
from dmpo_jax.data import pipeline
from dmpo_jax.data import splits as splits_lib


@dataclasses.dataclass(frozen=True)
class InstancesSpec:
  """How many rows each stage draws (training/specs.py: instances_spec, of config.sft, rl and
  eval)."""
  sft_steps: int
  sft_prompts: int    # instances per SFT step: sft.batch_size // sft.solutions_per_instance
  rl_steps: int
  rl_prompts: int     # rl.prompts_per_step
  eval_per_task: int  # eval.num_per_task
  transfer_keys: tuple = ()   # eval.transfer's task keys (registered)
  transfer_per_task: int = 0  # eval.transfer_num_per_task


def rows(spec: InstancesSpec, taskset: pipeline.TaskSet) -> dict:
  """{"sft", "rl", "eval"} lists of (key, instance) in training order, and "transfer" (the
  transfer evaluation's instances, `pipeline.held_out_items` as training/transfer.py draws them)
  when the config has transfer tasks."""
  sft = [it for s in range(spec.sft_steps) for it in taskset.train("sft", s, spec.sft_prompts)]
  rl = [it for s in range(spec.rl_steps) for it in taskset.train("rl", s, spec.rl_prompts)]
  out = {"sft": sft, "rl": rl, "eval": taskset.held_out(spec.eval_per_task)}
  if spec.transfer_keys:
    out["transfer"] = pipeline.held_out_items(spec.transfer_keys, spec.transfer_per_task,
                                              taskset.level)
  return out


def checks(out: dict, taskset: pipeline.TaskSet) -> dict:
  """Which properties hold: eval repeats nothing and shares nothing with sft or rl; with
  splits, sft stays off B, and the three sets are disjoint (Splits checks that on build). With
  transfer tasks: the transfer instances share nothing with sft or rl (by content: a gym
  instance's id is its task key and question), and rl draws no transfer task and no SFT-only
  task (config.sft.gym_tasks)."""
  ids = {k: [splits_lib.instance_id(key, q) for key, q in v] for k, v in out.items()}
  ev = set(ids["eval"])
  res = {"eval_distinct": len(ev) == len(ids["eval"]),
         "sft_eval_shared": len(ev & set(ids["sft"])), "rl_eval_shared": len(ev & set(ids["rl"]))}
  if taskset.sft_only:
    res["rl_sft_only_rows"] = sum(key in taskset.sft_only for key, _ in out["rl"])
  if "transfer" in out:
    tr, tasks = set(ids["transfer"]), {k for k, _ in out["transfer"]}
    res.update(sft_transfer_shared=len(tr & set(ids["sft"])), rl_transfer_shared=len(tr & set(ids["rl"])),
               rl_transfer_rows=sum(key in tasks for key, _ in out["rl"]))
  if taskset.splits:
    res["sft_in_B"] = len(set(ids["sft"]) & taskset.split_sets().ids("B"))
  if taskset.pool and not taskset.splits:
    res["pool"] = "evaluation is on the pool's instances, the ones trained on (by design)"
  res["disjoint"] = (res["eval_distinct"] and not res["sft_eval_shared"] and not res["rl_eval_shared"]
                     and not res.get("sft_in_B", 0) and not res.get("sft_transfer_shared", 0)
                     and not res.get("rl_transfer_shared", 0) and not res.get("rl_sft_only_rows", 0)
                     and not res.get("rl_transfer_rows", 0))
  return res


def write(spec: InstancesSpec, taskset: pipeline.TaskSet, workdir: str) -> dict:
  """DIR/instances.json of a config's `rows` (see the module docstring); returns its content."""
  out = rows(spec, taskset)
  result = {k: [[key, q] for key, q in v] for k, v in out.items()}
  if taskset.splits:
    result["splits"] = taskset.split_sets().to_json()
  result["checks"] = checks(out, taskset)
  os.makedirs(workdir, exist_ok=True)
  atomic_write(os.path.join(workdir, "instances.json"), lambda f: json.dump(result, f, indent=1))
  return result


def summary(result: dict) -> str:
  distinct = lambda v: len({splits_lib.instance_id(k, q) for k, q in v})
  parts = [f"{k}: {len(result[k])} rows, {distinct(result[k])} distinct"
           for k in ("sft", "rl", "eval", "transfer") if k in result]
  return "; ".join(parts) + f"; checks {json.dumps(result['checks'])}"
