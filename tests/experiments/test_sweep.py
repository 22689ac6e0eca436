"""The sweep runner: settings table, input checks, the report on hand-made run folders, and the
CLI end to end on the smoke config (shared SFT equals unshared, resume after an interruption)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dmpo_jax.training import report
from dmpo_jax.experiments import report as sweep_report, stats, sweep
from dmpo_jax.objectives import presets
from studies.collapse_frontier import design
from tests.experiments import fake_sweep
from tests.helpers import REPO, smoke, xla_flags

CONFIG = os.path.join(REPO, "configs", "collapse.py")
TIMING = ("rollout_s", "reward_s", "update_s")  # wall-clock fields: differ between any two runs


def base(smoke=True):
  return sweep.load_config(CONFIG, smoke=smoke)


def plan(*args, **kw):
  """The runner's plan with the collapse frontier's labels (studies/collapse_frontier)."""
  return sweep.plan(*args, settings=design.SETTINGS, **kw)


# ---------------------------------------------------------------------------
# Settings and input.
def test_settings_cover_the_issue_list_and_share_sft():
  cfg = base(smoke=False)
  for label in ("grpo", "dmpo", "dmpo-2-a1_15", "dmpo-20-a1_15", "dm_only-2-a1_15", "dph_f", "dph_js",
                "rkl-0.01", "rkl-0.1", "grpo-g16", "dmpo-2-a1_15-g16"):
    assert label in design.SETTINGS, label
  seen = {}
  for label, over in design.SETTINGS.items():
    c = sweep.apply_overrides(cfg, over, label)  # every field exists and takes its value
    seen[label] = (c.rl.algo, c.rl.group_size, c.rl.objective.dm_coef, c.rl.objective.dm_alpha,
                   c.rl.objective.kl_coef, c.rl.objective.policy_loss, c.dph.weighting, c.rl.lr,
                   c.rl.objective.div_coef, c.rl.prompts_per_step,
                   tuple(sorted((k, repr(v)) for k, v in c.rl.objective.items())))  # every knob
    assert sweep.sft_key(c) == sweep.sft_key(cfg), f"{label} would not share the SFT stage"
  assert len(set(seen.values())) == len(seen), "two labels run the same setting"
  assert {l for l, s in seen.items() if s[1] == 16} == {"grpo-g16", "dmpo-2-a1_15-g16", "grpo-g16-samples"}
  assert seen["dmpo"][2:4] == (0.5, 1.0) and seen["dmpo-20-a1_15"][2:4] == (20.0, 1 / 15)
  assert sorted(s[4] for l, s in seen.items() if l.startswith("rkl")) == [0.01, 0.05, 0.1, 0.25, 1.25]
  assert seen["dm_only-2-a1_15"][5] == "none"
  assert seen["dph_f"][6] == "per_sample" and seen["dph_f-sep"][6] == "separate"
  assert cfg.rl.group_size == 8  # the config itself is untouched


def test_without_a_study_the_runner_sweeps_the_config_as_it_is(tmp_path, capsys):
  """The runner imports no study: run directly, its one label is the config as it is (with
  --set); a study's label is refused, naming the choice."""
  runs = sweep.plan(base(), [sweep.AS_IS], [0, 1], {"rl.steps": 2}, settings=sweep.as_is().settings,
                    log=lambda m: None)
  assert [r.label for r in runs] == [sweep.AS_IS] * 2 and runs[1].cfg.rl.steps == 2 and runs[1].shared
  assert sweep.main([f"--config={CONFIG}", f"--out={tmp_path / 'o'}", "--presets=grpo"]) == 2
  assert "unknown label(s) ['grpo']; choose from ['config']" in capsys.readouterr().err
  assert not (tmp_path / "o").exists()


def test_parse_seeds_and_sets():
  assert sweep.parse_seeds("0-4") == [0, 1, 2, 3, 4]
  assert sweep.parse_seeds("0-2,9") == [0, 1, 2, 9]
  assert sweep.parse_seeds("3") == [3]
  for bad in ("", "a", "1,1", "0-x"):
    with pytest.raises(sweep.SweepError, match="--seeds"):
      sweep.parse_seeds(bad)
  assert sweep.parse_sets(["rl.steps=120", "rl.objective.policy_loss=none", "eval.pass_ks=(1, 8)"]) == {
      "rl.steps": 120, "rl.objective.policy_loss": "none", "eval.pass_ks": (1, 8)}
  with pytest.raises(sweep.SweepError, match="field.path=value"):
    sweep.parse_sets(["rl.steps"])


def test_overrides_name_bad_fields():
  cfg = base()
  with pytest.raises(sweep.SweepError, match="'rl.nope'"):
    sweep.apply_overrides(cfg, {"rl.nope": 1}, "--set")
  with pytest.raises(sweep.SweepError, match="'nope'"):
    sweep.apply_overrides(cfg, {"nope.steps": 1}, "--set")
  with pytest.raises(sweep.SweepError, match="rl.group_size=1.5"):
    sweep.apply_overrides(cfg, {"rl.group_size": 1.5}, "--set")
  with pytest.raises(sweep.SweepError, match="unknown label"):
    plan(cfg, ["grpo", "no-such"], [0], {})


def test_plan_skips_unbuildable_objectives_and_unshareable_settings(monkeypatch):
  monkeypatch.setitem(design.SETTINGS, "bogus", {"rl.algo": "grpo", "rl.objective.policy_loss": "bogus"})
  monkeypatch.setitem(design.SETTINGS, "long-sft", {"rl.algo": "grpo", "sft.steps": 5})
  msgs = []
  runs = plan(base(), ["grpo", "bogus", "long-sft", "dm_only-2-a1_15"], [0, 3], {"rl.steps": 2},
                    log=msgs.append)
  try:
    presets.objective_config("dmpo", policy_loss="none")
    none_ok = True
  except ValueError:
    none_ok = False
  expect = ["grpo", "long-sft"] + (["dm_only-2-a1_15"] if none_ok else [])
  assert sorted({r.label for r in runs}) == sorted(expect)
  assert [r.seed for r in runs if r.label == "grpo"] == [0, 3]
  assert all(r.cfg.rl.steps == 2 and r.cfg.seed == r.seed for r in runs)
  assert any(m.startswith("skipping bogus") for m in msgs)
  assert any("dm_only" in m and "skipping" in m for m in msgs) != none_ok
  shared = {r.label: r.shared for r in runs}
  assert shared["grpo"] and not shared["long-sft"]


class FakeTrainer:
  """Stands in for train.train: writes the workdir files the sweep and report read, and records
  each call (workdir, whether eval_before.json was already there)."""

  def __init__(self, fail=(), signal_at=()):
    self.calls, self.fail, self.signal_at = [], set(fail), set(signal_at)
    self.had_transfer = []  # per run: whether eval_transfer_before.json was already there

  def __call__(self, cfg, wd):
    had_before = os.path.exists(os.path.join(wd, "eval_before.json"))
    self.calls.append((os.path.relpath(wd, os.path.dirname(os.path.dirname(wd))), had_before))
    os.makedirs(os.path.join(wd, "checkpoints"), exist_ok=True)
    if cfg.stop_at_step == cfg.sft.steps:  # the shared SFT stage
      os.makedirs(os.path.join(wd, "checkpoints", str(cfg.sft.steps)))
      with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": cfg.sft.steps, "stage": "sft", "loss": float(cfg.seed)}) + "\n")
      report.write_json({"overall": {"SR_mean": 0.0}}, os.path.join(wd, "eval_zero_shot.json"))
      return {"stopped": True, "step": cfg.sft.steps}
    self.had_transfer.append(os.path.exists(os.path.join(wd, "eval_transfer_before.json")))
    report.write_json({"overall": {"SR_mean": 0.1}}, os.path.join(wd, "eval_before.json"))
    report.write_json({"transfer": {}}, os.path.join(wd, "eval_transfer_before.json"))
    if cfg.rl.algo in self.fail:
      self.fail.discard(cfg.rl.algo)  # fails once
      raise RuntimeError("boom")
    if cfg.rl.algo in self.signal_at:
      return {"stopped": True, "step": cfg.sft.steps + 1}  # a signal, not config.stop_at_step
    report.write_json({"after": {"overall": {"SR_mean": 0.2}}}, os.path.join(wd, "results.json"))
    return {}


def test_runner_shares_skips_records_failures_and_stops_on_signal(tmp_path, monkeypatch):
  monkeypatch.setitem(design.SETTINGS, "gpg", {"rl.algo": "gpg"})
  monkeypatch.setitem(design.SETTINGS, "gspo", {"rl.algo": "gspo"})
  out = str(tmp_path)
  runs = plan(base(), ["grpo", "gpg", "dmpo"], [0, 1], {}, log=lambda m: None)
  fake = FakeTrainer(fail={"gpg"})
  st = sweep.run_sweep(runs, out, train_fn=fake, progress=False, log=lambda m: None)
  assert st["done"] == ["grpo/seed0", "grpo/seed1", "gpg/seed1", "dmpo/seed0", "dmpo/seed1"]
  assert st["failed"] == ["gpg/seed0"]
  assert "boom" in open(os.path.join(out, "gpg", "seed0", "sweep_error.txt")).read()
  # one SFT stage per seed; the first run of a seed evaluates, the later ones get its eval_before
  assert [c for c in fake.calls if c[0].startswith("_sft")] == [("_sft/seed0", False), ("_sft/seed1", False)]
  had = dict(c for c in fake.calls if not c[0].startswith("_sft"))
  assert had == {"grpo/seed0": False, "grpo/seed1": False, "gpg/seed0": True, "gpg/seed1": True,
                 "dmpo/seed0": True, "dmpo/seed1": True}
  assert fake.had_transfer == [False, False, True, True, True, True]  # the transfer eval before RL too
  for l, s in (("grpo", 1), ("dmpo", 1)):  # each run folder starts as a copy of the seed's SFT
    assert os.path.isdir(os.path.join(out, l, f"seed{s}", "checkpoints", str(base().sft.steps)))
    assert os.path.exists(os.path.join(out, l, f"seed{s}", "eval_zero_shot.json"))  # made in SFT
    assert rows(os.path.join(out, l, f"seed{s}")) == rows(os.path.join(out, "_sft", f"seed{s}"))

  # rerun: only the failed run runs again (and succeeds); nothing else is redone
  fake = FakeTrainer()
  st = sweep.run_sweep(runs, out, train_fn=fake, progress=False, log=lambda m: None)
  assert st["done"] == ["gpg/seed0"] and len(st["skipped"]) == 5
  assert [c[0] for c in fake.calls] == ["gpg/seed0"]
  assert not os.path.exists(os.path.join(out, "gpg", "seed0", "sweep_error.txt"))

  # a signal stops the sweep; the runs after it are pending; max_runs limits starts
  runs = plan(base(), ["gspo", "grpo"], [2, 3], {}, log=lambda m: None)
  st = sweep.run_sweep(runs, out, train_fn=FakeTrainer(signal_at={"gspo"}), progress=False,
                       log=lambda m: None)
  assert st["stopped"] == ["gspo/seed2"] and st["pending"] == ["gspo/seed3", "grpo/seed2", "grpo/seed3"]
  st = sweep.run_sweep(runs, out, train_fn=FakeTrainer(), max_runs=2, progress=False, log=lambda m: None)
  assert st["done"] == ["gspo/seed2", "gspo/seed3"] and st["pending"] == ["grpo/seed2", "grpo/seed3"]


# ---------------------------------------------------------------------------
# The report, on hand-made run folders.
def fake_run(out, label, seed, after, before, rl_rows, finished=True, sft=3):
  wd = os.path.join(out, label, f"seed{seed}")
  os.makedirs(os.path.join(wd, "checkpoints"))
  report.write_json({"sft": {"steps": sft}, "rl": {"steps": len(rl_rows)}}, os.path.join(wd, "config.json"))
  with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
    for i, row in enumerate(rl_rows):
      f.write(json.dumps({"step": sft + i + 1, "stage": "rl", **row}) + "\n")
  report.write_json({"overall": before}, os.path.join(wd, "eval_before.json"))
  if finished:
    report.write_json({"overall": after}, os.path.join(wd, "eval_after.json"))
    report.write_json({"after": {"overall": after}, "steps": {"sft": sft, "rl": len(rl_rows)}, "wall_s": 9.0},
                      os.path.join(wd, "results.json"))


def test_report_on_a_partial_sweep(tmp_path):
  out = str(tmp_path)
  rng = np.random.default_rng(0)
  vals = {"grpo": [0.30, 0.50, 0.40], "dmpo": [0.45, 0.52, 0.61]}
  before = {s: {"SR_mean": 0.2 + 0.01 * s, "pass@1": 0.1, "pass@8": 0.3 + 0.01 * s} for s in range(3)}
  for label, v in vals.items():
    for s in range(3):
      after = {"SR_mean": v[s], "length": 10.0 + s, "pass@1": v[s] / 2, "pass@8": v[s]}
      if label == "dmpo":
        after["distinct_optimal"] = 1.0 + s
      rows = [{"distinct": float(rng.integers(0, 4)), "length": 12.0 - i} for i in range(4)]
      fake_run(out, label, s, after, before[s], rows)
  fake_run(out, "rkl-0.1", 0, {}, before[0], [{"length": 12.0}], finished=False)
  rep = sweep_report.write_report(out, plots=False)  # plots: in the end-to-end test (matplotlib is slow)

  iv = stats.mean_ci(vals["dmpo"])
  got = rep["final"]["dmpo"]["SR_mean"]
  assert (got["mean"], got["low"], got["high"], got["n"]) == (iv.mean, iv.low, iv.high, 3)
  d = stats.paired_difference(vals["dmpo"], vals["grpo"])
  got = rep["paired"]["dmpo"]["SR_mean"]
  assert np.isclose(got["mean"], np.mean(np.subtract(vals["dmpo"], vals["grpo"])))
  assert (got["low"], got["high"]) == (d.low, d.high)
  assert rep["final"]["grpo"]["distinct_optimal"] == sweep_report.NOT_LOGGED  # the trainer never wrote it
  assert rep["final"]["dmpo"]["distinct_optimal"]["mean"] == 2.0
  assert rep["final"]["grpo"]["coverage"] == sweep_report.NOT_LOGGED
  assert rep["gradients"]["grpo"]["grad_ratio"] == sweep_report.NOT_LOGGED
  assert "rkl-0.1" not in rep["final"] and rep["runs"]["rkl-0.1/seed0"]["status"] == "partial"
  assert rep["before"]["pass@8"]["mean"] == pytest.approx(np.mean([before[s]["pass@8"] for s in range(3)]))
  assert set(rep["pass_at_k"]["feasible"]) == {"SFT (before RL)", "grpo", "dmpo"}
  assert rep["pass_at_k"]["optimal"] == {}
  # curves: per RL step (counted from the end of SFT), the mean over seeds; partial runs count
  c = rep["curves"]["grpo"]["distinct"]
  assert c["step"] == [1, 2, 3, 4] and c["n"] == [3, 3, 3, 3]
  per_seed = [[json.loads(l)["distinct"] for l in open(os.path.join(out, "grpo", f"seed{s}", "metrics.jsonl"))]
              for s in range(3)]
  assert np.allclose(c["mean"], np.mean(per_seed, 0))
  assert rep["curves"]["rkl-0.1"]["length"]["n"] == [1]
  md = open(os.path.join(out, "report.md")).read()
  assert "Partial sweep" in md and "rkl-0.1/seed0 (partial" in md
  assert "not logged" in md and "`coverage`" in md
  json.load(open(os.path.join(out, "report.json")))  # strict JSON (no NaN)


# ---------------------------------------------------------------------------
# The CLI end to end on the smoke config.
def cli(out, *args, cache):
  env = dict(os.environ, XLA_FLAGS=xla_flags(2), PYTHONPATH=REPO)
  r = subprocess.run([sys.executable, "-m", "studies.collapse_frontier.sweep", f"--config={CONFIG}", f"--out={out}",
                      "--smoke", f"--cache_dir={cache}", "--no_progress", "--set=log.tensorboard=False",
                      "--set=log.plots=False", "--set=checkpoint.export_hf=False", *args],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  return r.stdout


def rows(workdir, stage=None):
  out = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  return [{k: v for k, v in r.items() if k not in TIMING} for r in out if stage in (None, r["stage"])]


@pytest.mark.slow
def test_a_run_folder_from_a_lora_sft_stage_holds_its_frozen_base(tmp_path):
  """A LoRA stage's checkpoints hold the adapters only and its frozen base once, in
  checkpoints/base: a run folder seeded from the stage gets the base too (hard-linked: the
  same bytes, no second copy), else its resume would find no base."""
  sft = tmp_path / "_sft" / "seed0"
  for rel, text in (("checkpoints/5/state", "adapters"), ("checkpoints/base/params/a", "base weights"),
                    ("checkpoints/base/params/b", "more"), ("metrics.jsonl", "{}\n")):
    (sft / rel).parent.mkdir(parents=True, exist_ok=True)
    (sft / rel).write_text(text)
  wd = tmp_path / "dmpo" / "seed0"
  sweep.seed_run_folder(str(sft), str(wd), 5)
  assert (wd / "checkpoints" / "5" / "state").read_text() == "adapters"
  for rel in ("params/a", "params/b"):
    linked, source = wd / "checkpoints" / "base" / rel, sft / "checkpoints" / "base" / rel
    assert linked.read_text() == source.read_text() and os.path.samefile(linked, source)
  full = tmp_path / "grpo" / "seed0"  # a full fine-tuning stage has no base, and gets none
  (sft / "checkpoints" / "base").rename(tmp_path / "aside")
  sweep.seed_run_folder(str(sft), str(full), 5)
  assert sorted(os.listdir(full / "checkpoints")) == ["5"]


@pytest.mark.slow
def test_sweep_end_to_end_shared_sft_and_resume(tmp_path):
  out, cache = str(tmp_path / "sweep"), str(tmp_path / "cache")
  run = lambda *a: cli(out, "--presets=grpo,dmpo", "--seeds=0,1", *a, cache=cache)
  wd = lambda label, seed: os.path.join(out, label, f"seed{seed}")

  # 1. one run only: the sweep stops early, the report says it is partial
  text = run("--max_runs=1")
  assert f"resumed {wd('grpo', 0)} at step 3 (sft)" in text  # started from the shared SFT checkpoint
  assert os.path.exists(os.path.join(wd("grpo", 0), "results.json"))
  assert not any(os.path.exists(wd(l, s)) for l, s in (("grpo", 1), ("dmpo", 0), ("dmpo", 1)))
  assert os.path.exists(os.path.join(out, "_sft", "seed0", "eval_before.json"))  # shared back
  assert "Partial sweep" in open(os.path.join(out, "report.md")).read()
  first = os.stat(os.path.join(wd("grpo", 0), "results.json")).st_mtime_ns

  # 2. the rest, interrupted one step into RL (smoke: 3 SFT steps)
  text = run("--set=stop_at_step=4")
  assert "grpo/seed0: finished earlier, skipped" in text
  for l, s in (("grpo", 1), ("dmpo", 0), ("dmpo", 1)):
    assert os.path.isdir(os.path.join(wd(l, s), "checkpoints", "4"))
    assert not os.path.exists(os.path.join(wd(l, s), "results.json"))
  rep = json.load(open(os.path.join(out, "report.json")))
  assert rep["runs"]["dmpo/seed1"]["status"] == "partial" and rep["runs"]["grpo/seed0"]["status"] == "finished"

  # 3. rerun: the three resume from step 4, nothing finished is redone, the report is complete
  text = run()
  assert text.count("resumed") == 3 and "grpo/seed0: finished earlier, skipped" in text
  assert os.stat(os.path.join(wd("grpo", 0), "results.json")).st_mtime_ns == first
  for l, s in (("grpo", 0), ("grpo", 1), ("dmpo", 0), ("dmpo", 1)):
    r = rows(wd(l, s))
    assert [x["step"] for x in r] == [1, 2, 3, 4, 5, 6] and [x["stage"] for x in r] == ["sft"] * 3 + ["rl"] * 3
  # one SFT stage per seed: the runs of a seed start from the same policy
  assert rows(wd("grpo", 1), "sft") == rows(wd("dmpo", 1), "sft") != rows(wd("grpo", 0), "sft")
  rep = json.load(open(os.path.join(out, "report.json")))
  assert all(v["status"] == "finished" for v in rep["runs"].values()) and len(rep["runs"]) == 4
  assert rep["final"]["dmpo"]["length"]["n"] == 2 and rep["paired"]["dmpo"]["length"]["n"] == 2
  assert "Partial sweep" not in open(os.path.join(out, "report.md")).read()
  for f in ("curves.png", "pass_at_k.png"):
    assert os.path.getsize(os.path.join(out, f)) > 10_000

  # 4. an unshared, uninterrupted run gives the same per-step metrics and evaluations (dmpo: its DM
  # term moves the parameters even where every reward is 0, as in the smoke setting)
  solo = str(tmp_path / "solo")
  cli(solo, "--presets=dmpo", "--seeds=0", "--no_share", cache=cache)
  assert not os.path.exists(os.path.join(solo, "_sft"))
  a, b = wd("dmpo", 0), os.path.join(solo, "dmpo", "seed0")
  assert all(x["grad_norm"] > 0 for x in rows(a, "rl"))
  assert rows(a) == rows(b)
  for f in ("eval_before.json", "eval_after.json", "points/rl0.json", "points/rl3.json"):
    assert report.read_json(os.path.join(a, f)) == report.read_json(os.path.join(b, f)), f
  # the shared start point came from the seed's SFT folder; dmpo moved away from the start
  assert os.path.exists(os.path.join(out, "_sft", "seed0", "points", "rl0.json"))
  end = report.read_json(os.path.join(a, "points", "rl3.json"))["sets"]["A"]["overall"]
  start = report.read_json(os.path.join(a, "points", "rl0.json"))["sets"]["A"]["overall"]
  assert start["kl_k1"] == 0.0 and end["kl_k1"] != 0.0 and end["kl_k3"] > 0.0


def test_every_label_passes_the_config_checks():
  """Each label of the sweep (the strength axes of every method, the collapse baselines' knobs
  included) builds its objective and passes the schema and the cross-field checks on the
  collapse config: a label that could not run is found here, not hours into a sweep."""
  import jax
  from dmpo_jax.parallel import sharding
  from dmpo_jax.training import config as config_lib
  from dmpo_jax.training import run as run_lib
  base = sweep.load_config(os.path.join(REPO, "configs", "collapse.py"))
  skipped = []
  runs = plan(base, list(design.SETTINGS), [0], {}, log=skipped.append)
  assert skipped == [] or all("trains its own SFT" in m for m in skipped), skipped
  assert {r.label for r in runs} == set(design.SETTINGS)
  for algo, (knob, values) in design.BASELINE_AXES.items():
    assert design.FAMILIES[algo] and len(values) >= 4, algo
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  for r in runs:
    config_lib.check_fields(r.cfg)
    obj = run_lib.objective_from_config(r.cfg)
    config_lib.check_config(r.cfg, obj, mesh)
    if r.label.startswith(tuple(design.BASELINE_AXES)):
      knob = design.BASELINE_AXES[r.cfg.rl.algo][0]
      assert getattr(obj, knob) == r.cfg.rl.objective[knob], r.label


def test_merge_moves_finished_runs_and_refuses_clashes(tmp_path):
  """Two sweep folders run in parallel on other seeds merge into one: finished runs and their
  seeds' SFT stages move, unfinished ones stay, sessions are kept; clashes are refused."""
  from dmpo_jax.training import report
  a, b = tmp_path / "a", tmp_path / "b"
  settings = {"grpo": {"rl.algo": "grpo"}, "dmpo": {"rl.algo": "dmpo"}}

  def folder(d, seeds, finished, session):
    report.write_json({"labels": list(settings), "seeds": seeds, "settings": settings,
                       "config": {"rl": {"lr": 3e-4}}, "sessions": [{"commit": session}]},
                      str(d / "sweep.json"))
    for label, seed in finished:
      report.write_json({"wall_s": 1.0}, str(d / label / f"seed{seed}" / "results.json"))
    for seed in seeds:
      (d / "_sft" / f"seed{seed}").mkdir(parents=True)
  folder(a, [0], [("grpo", 0), ("dmpo", 0)], "c1")
  folder(b, [3, 4], [("grpo", 3), ("dmpo", 3), ("grpo", 4)], "c2")
  (b / "dmpo" / "seed4").mkdir(parents=True)  # unfinished: stays
  moved = sweep.merge(str(a), str(b))
  assert sorted(moved) == ["dmpo/seed3", "grpo/seed3", "grpo/seed4"]
  assert (a / "grpo" / "seed4" / "results.json").exists() and (b / "dmpo" / "seed4").exists()
  assert (a / "_sft" / "seed3").is_dir() and (a / "_sft" / "seed4").is_dir()
  manifest = report.read_json(str(a / "sweep.json"))
  assert manifest["seeds"] == [0, 3, 4]
  assert [s["commit"] for s in manifest["sessions"]] == ["c1", "c2"]
  assert manifest["sessions"][1]["merged_from"] == str(b)
  # a run finished in both, and a label with other settings, are refused before anything moves
  folder(tmp_path / "c", [0], [("grpo", 0)], "c3")
  with pytest.raises(sweep.SweepError, match="grpo/seed0 exists in both"):
    sweep.merge(str(a), str(tmp_path / "c"))
  settings["dmpo"] = {"rl.algo": "dmpo", "rl.lr": 1e-4}
  folder(tmp_path / "d", [5], [("dmpo", 5)], "c4")
  with pytest.raises(sweep.SweepError, match=r"labels \['dmpo'\] have other settings"):
    sweep.merge(str(a), str(tmp_path / "d"))
  assert not (a / "dmpo" / "seed5").exists()


def test_gradient_ratio_is_reported_as_a_ratio_of_mean_norms_too(tmp_path):
  out = str(tmp_path)
  # per step: pg 1 and 3, regulariser 0.5 both times: mean of ratios 1/3, ratio of means 1/4
  rows = [{"pg_grad_norm": 1.0, "reg_grad_norm": 0.5, "grad_ratio": 0.5},
          {"pg_grad_norm": 3.0, "reg_grad_norm": 0.5, "grad_ratio": 0.5 / 3}]
  for s in range(2):
    fake_run(out, "dmpo", s, {"SR_mean": 0.5}, {"SR_mean": 0.4}, rows)
  rep = sweep_report.write_report(out, plots=False)
  g = rep["gradients"]["dmpo"]
  assert g["grad_ratio"]["mean"] == pytest.approx(1 / 3)
  assert g["ratio_of_means"]["mean"] == pytest.approx(0.25)
  assert "ratio_of_means" in open(os.path.join(out, "report.md")).read()


# ---------------------------------------------------------------------------
# Evaluation points: a run with a missing one is incomplete, never analysed, and rerun.
class PointsTrainer:
  """Stands in for train.train where points and checkpoints matter: writes config.json, metrics
  rows through the real MetricsWriter (cut back on resume as the trainer's), each due point
  before the checkpoint of its step (and the one due at the resume step, as the trainer's
  start of RL and its end do), checkpoint folders every 2 steps and at the ends of SFT and
  RL, results.json; resumes from its newest checkpoint folder. Records (run, resume step)."""

  def __init__(self):
    self.calls = []

  point = staticmethod(fake_sweep.write_point)

  def __call__(self, cfg, wd):
    from dmpo_jax.training import config as config_lib
    steps = sweep.checkpoint_steps(wd)
    start = max(steps, default=0)
    self.calls.append((os.path.relpath(wd, os.path.dirname(os.path.dirname(wd))), start))
    report.write_json(config_lib.config_json(cfg), os.path.join(wd, "config.json"))
    writer = report.MetricsWriter(wd, False, resume_step=start if steps else None)
    sft, total = cfg.sft.steps, cfg.sft.steps + cfg.rl.steps
    end = cfg.stop_at_step if cfg.stop_at_step >= 0 else total
    if start >= sft:
      self.point(cfg, wd, start)
    for step in range(start + 1, end + 1):
      writer.write(step, "sft" if step <= sft else "rl", {"x": step + 10 * cfg.seed})
      if step == sft:
        report.write_json({"overall": {"SR_mean": 0.1}}, os.path.join(wd, "eval_before.json"))
      if step >= sft:
        self.point(cfg, wd, step)
      if step % 2 == 0 or step in (sft, total):
        os.makedirs(os.path.join(wd, "checkpoints", str(step)))
    if end < total:
      return {"stopped": True, "step": end}
    fake_sweep.write_results(cfg, wd)
    return {}


def snapshot(wd):
  """A run folder's metrics rows and point files, to compare with a rerun's."""
  pts = {f: report.read_json(os.path.join(wd, "points", f)) for f in sorted(os.listdir(os.path.join(wd, "points")))}
  return rows(wd), pts


def test_a_missing_point_makes_a_run_incomplete_and_the_rerun_computes_it(tmp_path):
  out = str(tmp_path / "sweep")
  runs = plan(base(), ["grpo", "dmpo"], [0], {"eval.points": 4}, log=lambda m: None)
  sweep.run_sweep(runs, out, train_fn=PointsTrainer(), progress=False, log=lambda m: None)
  wd = lambda label: os.path.join(out, label, "seed0")
  whole = {l: snapshot(wd(l)) for l in ("grpo", "dmpo")}
  assert sorted(whole["grpo"][1]) == ["rl0.json", "rl1.json", "rl2.json", "rl3.json"]
  assert sweep_report.write_report(out, plots=False)["runs"]["grpo/seed0"]["status"] == "finished"

  # The issue's folder: killed after checkpoint 6, before points/rl3.json; an older trainer's
  # rerun then wrote results.json without the point.
  os.remove(os.path.join(wd("grpo"), "points", "rl3.json"))
  assert not sweep.is_finished(wd("grpo")) and sweep.is_finished(wd("dmpo"))
  rep = sweep_report.write_report(out, plots=False)
  assert rep["runs"]["grpo/seed0"]["status"] == "incomplete"
  assert rep["runs"]["grpo/seed0"]["missing_points"] == [3]
  assert "grpo" not in rep["final"] and "dmpo" in rep["final"] and rep["paired"] == {}
  md = open(os.path.join(out, "report.md")).read()
  assert "| grpo/seed0 | incomplete: no evaluation point at RL step 3 |" in md and "Partial sweep" in md
  per_seed = {r["label"]: r for r in csv_rows(os.path.join(out, "per_seed.csv"))}
  assert (per_seed["grpo"]["status"], per_seed["grpo"]["missing_points"]) == ("incomplete", "3")
  assert per_seed["grpo"]["point_rl_step"] == "2" and per_seed["grpo"].get("final_SR_mean", "") == ""
  assert {r["label"] for r in csv_rows(os.path.join(out, "points.csv"))} == {"dmpo"}  # not analysed
  assert "grpo/seed0 (incomplete: no evaluation point at RL step 3)" in open(
      os.path.join(out, "frontier.md")).read()

  # The rerun resumes at checkpoint 6 (results.json and eval_after.json moved aside) and
  # computes the point; dmpo is skipped.
  fake = PointsTrainer()
  st = sweep.run_sweep(runs, out, train_fn=fake, progress=False, log=lambda m: None)
  assert st["done"] == ["grpo/seed0"] and st["skipped"] == ["dmpo/seed0"]
  assert fake.calls == [("grpo/seed0", 6)]
  aside = os.path.join(wd("grpo"), "superseded", "1")
  assert sorted(os.listdir(aside)) == ["eval_after.json", "metrics.jsonl", "results.json", "why.txt"]
  assert snapshot(wd("grpo")) == whole["grpo"]
  rep = sweep_report.write_report(out, plots=False)
  assert rep["runs"]["grpo/seed0"]["status"] == "finished" and "grpo" in rep["final"]

  # A point in the middle: back to checkpoint 4 (steps 5, 6 redone; metrics cut back to 4).
  os.remove(os.path.join(wd("dmpo"), "points", "rl1.json"))
  fake = PointsTrainer()
  sweep.run_sweep(runs, out, train_fn=fake, progress=False, log=lambda m: None)
  assert fake.calls == [("dmpo/seed0", 4)]
  aside = os.path.join(wd("dmpo"), "superseded", "1")
  assert sorted(os.listdir(os.path.join(aside, "checkpoints"))) == ["6"]
  assert sorted(os.listdir(os.path.join(aside, "points"))) == ["rl2.json", "rl3.json"]
  assert os.path.exists(os.path.join(aside, "results.json"))
  assert [r["step"] for r in rows(os.path.join(aside))] == [1, 2, 3, 4, 5, 6]  # the copy, whole
  assert snapshot(wd("dmpo")) == whole["dmpo"]

  # No checkpoint at or before the missing point: everything but config.json moves aside and
  # the run starts again from the seed's shared SFT stage.
  os.remove(os.path.join(wd("grpo"), "points", "rl1.json"))
  for step in ("3", "4"):
    os.rename(os.path.join(wd("grpo"), "checkpoints", step), os.path.join(str(tmp_path), step))
  fake = PointsTrainer()
  sweep.run_sweep(runs, out, train_fn=fake, progress=False, log=lambda m: None)
  assert fake.calls == [("grpo/seed0", 3)]
  aside = os.path.join(wd("grpo"), "superseded", "2")
  assert {"checkpoints", "metrics.jsonl", "points", "results.json", "eval_before.json"} <= set(os.listdir(aside))
  assert snapshot(wd("grpo")) == whole["grpo"]
  assert sweep_report.write_report(out, plots=False)["runs"]["grpo/seed0"]["status"] == "finished"


def test_an_unshared_run_without_a_checkpoint_before_its_missing_point_starts_again(tmp_path):
  out = str(tmp_path)
  runs = plan(base(), ["grpo"], [1], {"eval.points": 4}, share=False, log=lambda m: None)
  sweep.run_sweep(runs, out, train_fn=PointsTrainer(), progress=False, log=lambda m: None)
  wd = os.path.join(out, "grpo", "seed1")
  whole = snapshot(wd)
  os.remove(os.path.join(wd, "points", "rl0.json"))
  for step in ("2", "3"):  # checkpoints at 2 (SFT) and 3 (its end) gone: 4 and 6 are past RL step 0
    os.rename(os.path.join(wd, "checkpoints", step), os.path.join(out, step))
  from dmpo_jax.training import lock as lock_lib
  held = sorted(os.listdir(wd))
  with lock_lib.acquire(wd):  # another run trains it: nothing moves
    with pytest.raises(lock_lib.LockHeld):
      sweep.rewind(wd)
    assert sorted(os.listdir(wd)) == sorted(held + [lock_lib.LOCK_FILE])
  fake = PointsTrainer()
  sweep.run_sweep(runs, out, train_fn=fake, progress=False, log=lambda m: None)
  assert fake.calls == [("grpo/seed1", 0)]  # from scratch
  assert not os.path.exists(os.path.join(out, "_sft"))
  assert snapshot(wd) == whole


def csv_rows(path):
  import csv
  with open(path) as f:
    return list(csv.DictReader(f))


def merge_folder(d, sets, finished, seeds, labels=("grpo",)):
  """A sweep folder as the CLI leaves it: sweep.json (its base config after `sets`), finished
  runs with results.json, the seeds' SFT stages."""
  cfg = sweep.apply_overrides(base(), sets, "--set")
  runs = plan(base(), list(labels), seeds, sets, log=lambda m: None)
  from dmpo_jax.training import config as config_lib
  d.mkdir(parents=True, exist_ok=True)
  sweep.write_manifest(str(d), {"set": sets}, runs, [{"commit": str(d)}], config_lib.config_json(cfg),
                       design=design.DESIGN)
  for label, seed in finished:
    report.write_json({"wall_s": 1.0}, str(d / label / f"seed{seed}" / "results.json"))
  for seed in seeds:
    (d / "_sft" / f"seed{seed}").mkdir(parents=True)


def test_merge_refuses_another_config_and_moves_nothing(tmp_path, capsys):
  a, b = tmp_path / "a", tmp_path / "b"
  merge_folder(a, {}, [("grpo", 0)], [0])
  merge_folder(b, {"rl.lr": 0.01, "tasks": "TSP"}, [("grpo", 1)], [1])
  before = open(a / "sweep.json").read()
  with pytest.raises(sweep.SweepError) as e:
    sweep.merge(str(a), str(b))
  msg = str(e.value)
  assert "rl.lr: 0.0003 vs 0.01" in msg and "tasks: 'GCP-D,maximum-set,maximum_clique_problem,subset-sum' vs 'TSP'" in msg
  assert "2 field(s) differ" in msg and "\n" not in msg
  assert (b / "grpo" / "seed1" / "results.json").exists() and (b / "_sft" / "seed1").is_dir()
  assert not (a / "grpo" / "seed1").exists() and not (a / "_sft" / "seed1").exists()
  assert open(a / "sweep.json").read() == before
  assert sweep.main([f"--out={a}", f"--merge_from={b}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --merge_from:") and err.count("\n") == 1
  assert not (a / "grpo" / "seed1").exists() and open(a / "sweep.json").read() == before


def test_merge_allows_fields_that_do_not_change_a_run(tmp_path):
  """A field of SAFE_TO_CHANGE, and a base field that every label of theirs sets, may differ."""
  a, b = tmp_path / "a", tmp_path / "b"
  merge_folder(a, {}, [("grpo", 0)], [0])
  merge_folder(b, {"rl.lr": 0.01, "log.every": 5}, [("grpo-lr0.0001", 1)], [1], labels=("grpo-lr0.0001",))
  assert sweep.merge(str(a), str(b)) == ["grpo-lr0.0001/seed1"]
  assert (a / "_sft" / "seed1").is_dir()
  # the same base difference with a label that keeps the base's rl.lr is refused
  merge_folder(tmp_path / "c", {"rl.lr": 0.01}, [("grpo", 2)], [2])
  with pytest.raises(sweep.SweepError, match=r"rl.lr: 0.0003 vs 0.01\)"):
    sweep.merge(str(a), str(tmp_path / "c"))


def test_merge_from_a_missing_or_non_sweep_folder_is_one_line(tmp_path, capsys):
  a = tmp_path / "a"
  merge_folder(a, {}, [("grpo", 0)], [0])
  (tmp_path / "plain").mkdir()
  for other, why in ((tmp_path / "nope", "no such folder"), (tmp_path / "plain", "not a sweep folder")):
    assert sweep.main([f"--out={a}", f"--merge_from={other}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --merge_from={other}: {why}" + (" (no sweep.json)\n" if "sweep" in why else "\n")
  assert sweep.main([f"--out={tmp_path / 'none'}", f"--merge_from={a}"]) == 2
  assert capsys.readouterr().err == f"error: --out={tmp_path / 'none'}: no such folder\n"
  assert (a / "grpo" / "seed0" / "results.json").exists()
