"""pass@k to k = 256, feasible and optimal, before and after RL, for presets trained from one
SFT checkpoint; one figure (docs/METHODS.md, baselines: a first look on the NP tasks).

    # one SFT start, then each preset's RL from a copy of it (configs/nphard.py)
    python -m dmpo_jax.train --config=configs/nphard.py:algo=grpo --workdir=runs/p256/grpo \
        --config.sft.steps=150 --config.rl.steps=20 --config.stop_at_step=150
    mkdir -p runs/p256/passk/checkpoints && cp -r runs/p256/grpo/checkpoints/150 runs/p256/passk/checkpoints/
    python -m dmpo_jax.train --config=configs/nphard.py:algo=passk --workdir=runs/p256/passk \
        --config.sft.steps=150 --config.rl.steps=20          # likewise grpo and each preset
    python scripts/pass256_presets.py runs/p256 grpo,passk,... out.png

Each workdir's checkpoint at the end of SFT (before) and at the end of RL (after) samples 256
answers at T = 0.7 for 2 held-out instances of each task with optimum enumeration; 4
instances per sampler call, so memory does not grow with the 256 samples.
"""

import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"))
import collapse as collapse_cfg  # noqa: E402
import nphard  # noqa: E402

from dmpo_jax import tasks as tasks_lib  # noqa: E402
from dmpo_jax.training import run as run_lib
from dmpo_jax.training import checkpoint as ckpt_lib  # noqa: E402
from dmpo_jax.data import pipeline  # noqa: E402
from dmpo_jax.training import evaluation  # noqa: E402

KS = collapse_cfg.PASS256_KS


def has_optima(key: str) -> bool:
  """Whether the task enumerates its optima (Task.has_optima where the tasks have it)."""
  task = tasks_lib.get(key)
  return task.has_optima


def curves(root: str, algo: str, sft_steps: int, rl_steps: int, with_before: bool) -> dict:
  """{"before"?: {...}, algo: {"feasible": [pass@k for KS], "optimal": [...]}}, task means."""
  cfg = nphard.get_config(f"algo={algo}")
  cfg.sft.steps, cfg.rl.steps = sft_steps, rl_steps
  cfg.log.tensorboard, cfg.log.progress = False, False
  workdir = os.path.join(root, algo)
  run, state = run_lib.setup(cfg, workdir)
  run.ckpt.close()
  items = [it for it in run.taskset.held_out(2) if has_optima(it[0])]
  sampler = run.sampler(run.sampling_config(256, 0.7))
  out = {}
  for name, step in (("before", sft_steps), (algo, sft_steps + rl_steps)):
    if name == "before" and not with_before:
      continue
    ck = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
    params, _ = ck.restore_params(step, state.params, run.model_shape)
    ck.close()
    res = evaluation.evaluate(lambda pt, pm, rng: sampler(params, pt, pm, rng)[:2], run.encoder,
                              items, samples=256, k=3, pass_ks=KS, rng=jax.random.key(7),
                              batch_prompts=4, prompt_len=run.prompt_len, reward_cfg=run.reward_cfg,
                              collapse=pipeline.Collapse())
    out[name] = {kind: [float(np.nanmean([v[f"pass_{kind}@{k}"] for v in res["per_task"].values()]))
                        for k in KS] for kind in ("feasible", "optimal")}
  return out


def plot(data: dict, path: str) -> None:
  from matplotlib import colormaps
  from matplotlib.figure import Figure
  tab = colormaps["tab20"].colors
  fig = Figure(figsize=(10, 3.8))
  for ax, kind in zip(fig.subplots(1, 2), ("feasible", "optimal")):
    for i, (name, c) in enumerate(data.items()):
      before = name == "before"
      ax.plot(KS, c[kind], ms=3, ls="--" if before else "-", marker="o" if i <= 10 else "s",
              color="black" if before else tab[2 * (i - 1) % 20 if i <= 10 else 2 * (i - 11) + 1],
              label="SFT (before RL)" if before else name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_title(f"pass@k, correct = {kind} (before: dashed; after RL: solid)", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def main(root: str, algos: str, path: str, sft_steps: int = 150, rl_steps: int = 20) -> None:
  data = {}
  for i, algo in enumerate(algos.split(",")):
    data.update(curves(root, algo, sft_steps, rl_steps, with_before=i == 0))
  with open(os.path.splitext(path)[0] + ".json", "w") as f:
    json.dump({"ks": list(KS), "curves": data}, f, indent=1)
  plot(data, path)


if __name__ == "__main__":
  main(*sys.argv[1:4], *map(int, sys.argv[4:6]))
