"""studies/mm_control/tables.py: the image policy's control tables from sweep folders
(synthetic results with known differences)."""

import json
import os

import pytest

from studies.mm_control import tables as mm_control

TASKS = ("GCP-D", "TSP")


def scores(level: float) -> dict:
  per = {t: {"SR@3": level, "QR@3": level / 2} for t in TASKS}
  return {"per_task": per, "categories": {}, "overall": {"SR@3": level, "QR@3": level / 2}}


def write(path, obj):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(obj, f)


def image_run(seed: int, gain: float) -> dict:
  mods = lambda base: {"image": scores(base + gain + 0.01 * seed), "blank": scores(base + 0.02 * seed),
                       "text": scores(0.0)}
  return {"before": scores(0.3 + gain), "after": scores(0.4 + gain + 0.01 * seed),
          "modalities": {"before": mods(0.3), "after": mods(0.4)}}


@pytest.fixture
def sweeps(tmp_path):
  img, txt = tmp_path / "mm", tmp_path / "text"
  for seed in range(5):
    write(img / "dmpo" / f"seed{seed}" / "results.json", image_run(seed, 0.2))
    write(img / "grpo" / f"seed{seed}" / "results.json", image_run(seed, 0.1))
    write(txt / "dmpo" / f"seed{seed}" / "results.json", {"after": scores(0.5 + 0.01 * seed)})
    write(txt / "grpo" / f"seed{seed}" / "results.json", {"after": scores(0.5 + 0.02 * seed)})
    per = {t: {"image": {"token_accuracy": 0.9, "exact": 0.5}, "blank": {"token_accuracy": 0.2, "exact": 0.0},
               "blind_bound": 0.8} for t in TASKS}
    write(img / "_sft" / f"seed{seed}" / "perception.json",
          {"steps": 600, "per_task": per, "overall": dict(per["TSP"])})
  return str(img), str(txt)


def test_the_primary_endpoint_and_the_tables(sweeps):
  img, txt = sweeps
  md = mm_control.report(img, txt, "dmpo", "grpo")
  # QR@3 = level / 2: image - blank after RL = (0.2 + 0.01 s - 0.02 s) / 2 -> mean (0.2 - 0.02) / 2 = 0.09
  _, t = mm_control.primary(mm_control.load(img)["dmpo"])
  assert t["n"] == 5 and t["mean"] == pytest.approx(0.09) and t["low"] > 0
  assert "the claim holds" in md
  assert "| image prompts | QR@3 |" in md and "| text prompts | QR@3 |" in md
  assert "| TSP | 0.900 [0.900, 0.900] | 0.200 [0.200, 0.200] | 0.800 |" in md
  # dmpo - grpo on images: +0.05 QR@3 every seed; on text: -0.005 s
  rows = {l.split("|")[1].strip() + l.split("|")[2].strip(): l for l in md.splitlines() if l.startswith("| ")}
  assert "+0.050 [+0.050, +0.050]" in rows["image promptsQR@3"]


def test_no_gain_is_reported_as_not_shown(sweeps, tmp_path):
  img = tmp_path / "flat"
  for seed in range(5):
    write(img / "dmpo" / f"seed{seed}" / "results.json", image_run(seed, 0.0))
  md = mm_control.report(str(img), None, "dmpo", "grpo")
  assert "not shown" in md
  with pytest.raises(SystemExit, match="no finished 'grpo' runs"):
    mm_control.report(str(img), None, "grpo", "dmpo")


def test_shuffled_table_pairs_image_with_another_instances_image(sweeps):
  img, _ = sweeps
  assert "fewer than 2 seeds evaluated" in mm_control.shuffled_table(img, "dmpo")
  for seed in range(5):
    mods = {"image": scores(0.6), "shuffled": scores(0.5 - 0.01 * seed), "blank": scores(0.2)}
    for root in ("_sft", "dmpo"):
      write(os.path.join(img, root, f"seed{seed}", "eval_shuffled", "eval.json"), {"modalities": mods})
  table = mm_control.shuffled_table(img, "dmpo")
  # QR@3 = level / 2: image - shuffled = (0.1 + 0.01 s) / 2 -> 0.06; shuffled - blank -> 0.14
  assert "| after RL | QR@3 | 0.300 [0.300, 0.300] |" in table
  assert "+0.060 [" in table and "+0.140 [" in table
