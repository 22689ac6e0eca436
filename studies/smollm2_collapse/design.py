"""The collapse question on SmolLM2-135M-Instruct (`configs/smollm2_nphard.py:collapse,lora`),
as data: the run labels with their settings, the pilots' label lists, and the families the
sweep records (docs/COLLAPSE.md, "The real model"; this folder's README.md has the commands).

Two pilots on seed 0, both exploratory, before any pre-registration:
* `regime`: full GRPO and the "less RL" reference at the config's length: does RL raise
  optimal pass@1 on A + B, and does the start have headroom (`eval.start_bounds`)?
* `strength`: each regulariser along its strength axis for a few RL steps, with each term's
  gradient norm logged every step (`rl.log_term_grads`): the weakest strength whose term is at
  least MIN_GRAD_SHARE of the policy gradient's norm is the one the pre-registration fixes.
"""

from __future__ import annotations

import math
import os
import statistics

from dmpo_jax.experiments import frontier, sweep
from dmpo_jax.training import report


def _fmt(x: float) -> str:
  return f"{x:g}"


RL_LR = 1e-4                 # configs/smollm2_nphard.py:lora's RL rate (ten times full fine-tuning's)
LESS_RL_LR = 3e-5            # the "less RL" reference: GRPO at about a third of the rate
DMPO_LAMBDAS = (5.0, 20.0, 80.0)   # at alpha 1/15; lambda 0.5, alpha 1 was 0.4-0.9% of the PG norm
DPH_ETAS = (0.5, 2.5, 12.5)        # per stored sample (the config's default is 0.05)
RKL_BETAS = (0.01, 0.1, 1.0)
MIN_GRAD_SHARE = 0.1         # the regulariser's norm over the policy gradient's (issue 44)
PILOT_SEEDS = (0,)

SETTINGS: dict[str, dict] = {
    "grpo": {"rl.algo": "grpo"},
    f"grpo-lr{_fmt(LESS_RL_LR)}": {"rl.algo": "grpo", "rl.lr": LESS_RL_LR},
}
for lam in DMPO_LAMBDAS:
  SETTINGS[f"dmpo-{_fmt(lam)}-a1_15"] = {"rl.algo": "dmpo", "rl.objective.dm_coef": lam,
                                         "rl.objective.dm_alpha": 1 / 15}
for eta in DPH_ETAS:
  SETTINGS[f"dph_f-eta{_fmt(eta)}"] = {"rl.algo": "dph_f", "rl.objective.div_coef": eta}
for beta in RKL_BETAS:
  SETTINGS[f"rkl-{_fmt(beta)}"] = {"rl.algo": "rkl", "rl.objective.kl_coef": beta}

REFERENCE = f"grpo-lr{_fmt(LESS_RL_LR)}"
FAMILIES = {
    "grpo-less-rl": ["grpo", REFERENCE],
    "dmpo": [f"dmpo-{_fmt(x)}-a1_15" for x in DMPO_LAMBDAS],
    "dph_f": [f"dph_f-eta{_fmt(x)}" for x in DPH_ETAS],
    "rkl": [f"rkl-{_fmt(x)}" for x in RKL_BETAS],
}
REGIME_PILOT = ["grpo", REFERENCE]
STRENGTH_PILOT = FAMILIES["dmpo"] + FAMILIES["dph_f"] + FAMILIES["rkl"]

DESIGN = sweep.Design(settings=SETTINGS, families=FAMILIES, contrasts=[],
                      tiers={"regime": REGIME_PILOT, "strength": STRENGTH_PILOT,
                             "all": REGIME_PILOT + STRENGTH_PILOT},
                      baseline=REFERENCE, analysis=None)


MIN_GAIN = 0.05              # the regime pilot: full GRPO's least gain in optimal pass@1 on A + B
GAIN = ("AB", "pass_optimal@1")


def trajectory(workdir: str, where=GAIN) -> dict:
  """{RL step: the metric} of a run's evaluation points (`frontier.read_points`) on `where`'s set
  (a union such as "AB" is the instance-weighted mean, `points.set_row`)."""
  out = {}
  for step, point in frontier.read_points(workdir).items():
    row = frontier.set_row(point, where[0])
    if row is not None and where[1] in row:
      out[step] = float(row[where[1]])
  return out


def regime_verdict(out: str, seeds) -> dict:
  """The regime pilot's rule (docs/COLLAPSE.md, "The real model"): kept when every seed's start
  was within the bounds (no `stopped.json`), and full GRPO's gain on A + B optimal pass@1 at its
  last point is at least MIN_GAIN on every seed and larger than the spread (max - min) of the
  seeds' starts. Returns {"kept", "why", "per_seed": {seed: {"start", "end", "gain",
  "stopped"}}, "spread"}."""
  per_seed, why = {}, []
  for seed in seeds:
    wd = os.path.join(out, "grpo", f"seed{seed}")
    traj = trajectory(wd)
    stopped = os.path.exists(os.path.join(wd, report.STOPPED))
    start, end = traj.get(0), (traj[max(traj)] if traj and max(traj) > 0 else None)
    per_seed[seed] = {"start": start, "end": end, "stopped": stopped,
                      "gain": None if start is None or end is None else end - start}
    if stopped:
      why.append(f"seed {seed}: the start is outside the bounds (stopped.json)")
    elif per_seed[seed]["gain"] is None:
      why.append(f"seed {seed}: grpo has no start point or no point after RL step 0")
    elif per_seed[seed]["gain"] < MIN_GAIN:
      why.append(f"seed {seed}: grpo's gain {per_seed[seed]['gain']:+.3f} < {MIN_GAIN}")
  starts = [r["start"] for r in per_seed.values() if r["start"] is not None]
  spread = max(starts) - min(starts) if starts else None
  gains = [r["gain"] for r in per_seed.values() if r["gain"] is not None]
  if not why and spread is not None and min(gains) <= spread:
    why.append(f"grpo's least gain {min(gains):+.3f} is not above the starts' spread {spread:.3f}")
  return {"kept": not why, "why": why, "per_seed": per_seed, "spread": spread}


def grad_shares(workdir: str) -> list[float]:
  """A run's logged gradient shares (metrics.jsonl's RL rows: grad_ratio = the regulariser's
  gradient norm over the policy gradient's), the finite ones, in step order."""
  rows = report.read_metrics(os.path.join(workdir, "metrics.jsonl"))
  return [float(r["grad_ratio"]) for r in rows if r.get("stage") == "rl"
          and isinstance(r.get("grad_ratio"), (int, float)) and math.isfinite(r["grad_ratio"])]


def choose_strengths(out: str, seed: int = PILOT_SEEDS[0]) -> dict:
  """The strength pilot's rule (docs/COLLAPSE.md, "The real model"): per family, the weakest
  label whose median logged share is at least MIN_GRAD_SHARE; none: the strongest, marked.
  Returns {family: {"label", "reached", "medians": {label: median or None}}}; a label without
  logged shares (not run, or no finite ratio) has None and never reaches."""
  choice = {}
  for family in ("dmpo", "dph_f", "rkl"):
    medians = {}
    for label in FAMILIES[family]:
      wd = os.path.join(out, label, f"seed{seed}")
      shares = grad_shares(wd) if os.path.exists(os.path.join(wd, "metrics.jsonl")) else []
      medians[label] = statistics.median(shares) if shares else None
    reached = [l for l in FAMILIES[family] if medians[l] is not None and medians[l] >= MIN_GRAD_SHARE]
    choice[family] = {"label": reached[0] if reached else FAMILIES[family][-1], "reached": bool(reached),
                      "medians": medians}
  return choice


def main(argv) -> int:
  """`regime <folder> [seeds]`: the regime pilot's verdict; `strength <folder>`: the choice."""
  if len(argv) < 2 or argv[0] not in ("regime", "strength") or len(argv) > (3 if argv[0] == "regime" else 2):
    print("usage: python -m studies.smollm2_collapse.design regime <sweep folder> [seeds, e.g. 0,1,2]\n"
          "       python -m studies.smollm2_collapse.design strength <sweep folder>")
    return 2
  if argv[0] == "regime":
    seeds = [int(x) for x in argv[2].split(",")] if len(argv) == 3 else list(PILOT_SEEDS)
    v = regime_verdict(argv[1], seeds)
    print(f"regime: {'kept' if v['kept'] else 'not kept'}" + "".join(f"; {w}" for w in v["why"]))
    for seed, r in v["per_seed"].items():
      print(f"  seed {seed}: start {_num(r['start'])}, end {_num(r['end'])}, gain {_num(r['gain'])}, "
            f"stopped {r['stopped']}")
    return 0
  for fam, c in choose_strengths(argv[1]).items():
    meds = ", ".join(f"{l} {_num(m)}" for l, m in c["medians"].items())
    print(f"{fam}: {c['label']}" + ("" if c["reached"] else f" (none reaches {MIN_GRAD_SHARE}: the strongest)")
          + f"; median shares: {meds}")
  return 0


def _num(x) -> str:
  return "-" if x is None else f"{x:.3f}"


if __name__ == "__main__":
  import sys
  sys.exit(main(sys.argv[1:]))
