"""Bad input never loses work: a table of bad inputs to the training and evaluation CLIs, run
in-process. Each case must exit with status 2, name the field or file in a one-line message,
and leave the workdir (checkpoints, config.json, metrics.jsonl, results) byte-identical; a new
workdir or --out folder must not appear. Then fault injection into damaged workdirs: the run
resumes from the newest complete checkpoint and ends where an uninterrupted run ends."""

import hashlib
import json
import os
import shutil

import jax
import numpy as np
import pytest
from absl import flags

from dmpo_jax import train as cli
from dmpo_jax.training import run as run_lib
from dmpo_jax.training import stages
from dmpo_jax.training import checkpoint as ckpt_lib
from dmpo_jax.training import config as config_lib
from tests import helpers
from tests.helpers import REPO, config_module, metric_rows, saved_state, smoke

CONFIG = os.path.join(REPO, "configs", "nphard.py")
BASE = [f"--config={CONFIG}:smoke", "--config.log.tensorboard=False"]


def train_cli(argv, capsys) -> tuple[int, str]:
  """`python -m dmpo_jax.train` in this process: (exit status, stderr)."""
  fv = flags.FlagValues()
  cli.define_flags(fv, ["train"] + argv)
  code = 0
  try:
    rest = cli.parse_flags(["train"] + argv, fv)
    cli.main(rest, fv)
  except SystemExit as e:
    code = e.code
  return code, capsys.readouterr().err


def evaluate_cli(argv, capsys) -> tuple[int, str]:
  """`python -m dmpo_jax.evaluate` in this process: (exit status, stderr)."""
  code, _, err = helpers.run_evaluate(argv, capsys)
  return code, err


def snapshot(folder) -> dict:
  """{relative path: sha256} of every file under folder."""
  out = {}
  for root, _, files in os.walk(folder):
    for f in files:
      path = os.path.join(root, f)
      with open(path, "rb") as fh:
        out[os.path.relpath(path, folder)] = hashlib.sha256(fh.read()).hexdigest()
  return out


def assert_refused(code, err, expected):
  lines = [l for l in err.strip().splitlines() if l.strip()]
  assert code == 2, err[-2000:]
  assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
  for e in expected if isinstance(expected, tuple) else (expected,):
    assert e in lines[0], lines[0]


# ---------------------------------------------------------------------------
# Fast: the config is refused before anything is built or written.
CONFIG_CASES = [
    (["--config.checkpoint.keep=0"], "config.checkpoint.keep=0: must be an int >= 1"),
    (["--config.checkpoint.keep=-1"], "config.checkpoint.keep=-1"),
    (["--config.rl.lr=-1"], "config.rl.lr=-1.0: must be a finite number > 0"),
    (["--config.sft.lr=inf"], "config.sft.lr=inf"),
    (["--config.sft.steps=-1"], "config.sft.steps=-1: must be an int >= 0"),
    (["--config.rl.steps=-5"], "config.rl.steps=-5"),
    (["--config.checkpoint.every=0"], "config.checkpoint.every=0"),
    (["--config.log.every=0"], "config.log.every=0"),
    (["--config.rl.temperature=0"], "config.rl.temperature=0.0"),
    (["--config.eval.samples=0"], "config.eval.samples=0"),
    (["--config.rl.algo=gpg", "--config.rl.group_size=0"], "config.rl.group_size=0"),
    (["--config.eval.k=5"], "config.eval.k=5 exceeds config.eval.samples=4"),
    (["--config.eval.pass_ks=(1,9)"], "config.eval.pass_ks=(1, 9): [9] exceed"),
    (["--config.rl.algo=ppo_xyz"], ("config.rl.algo='ppo_xyz'", "dmpo")),
    (["--config.tasks=TSP,knapsak"], ("knapsak", "did you mean 'knapsack'")),
    (["--config.rl.top_p=1.5"], "config.rl.top_p=1.5"),
    (["--config.dph.pef_threshold=0"], "config.dph.pef_threshold=0.0"),
    (["--config.mesh.data=0"], "config.mesh.data=0"),
    (["--config.rl.stepz=3"], ("--config.rl.stepz: config has no field 'rl.stepz'",
                               "did you mean 'rl.steps'?")),
    (["--config.rl.steps=abc"], "--config.rl.steps=abc"),
    ([f"--config={CONFIG}:smoke,bogus=1"], ("unknown argument(s) ['bogus']", "nphard.py")),
    (["--allow_config_change=rl.algo"], "--allow_config_change=rl.algo: rl.algo changes the result"),
    (["--allow_config_change=log.evry"], "did you mean 'log.every'"),
    (["--config.tasks="], "config.tasks='' names no task"),
    (["--config.tasks=TSP,TSP"], ("config.tasks='TSP,TSP' names ['TSP'] more than once",)),
    (["--config.model.lorra.rank=4"], ("--config.model.lorra.rank: config has no field 'model.lorra'",
                                       "did you mean 'model.lora.rank'?")),
    (["--config.modl.num_layers=2"], ("config has no field 'modl'", "did you mean 'model.num_layers'?")),
    (["--config.rl.prefix_shared=yes"],
     "config.rl.prefix_shared='yes': must be one of ['auto', 'on', 'off']"),
    (["--config.rl.prefix_shared=on", "--config.rl.algo=dph_js"],
     ("config.rl.prefix_shared='on' cannot apply", "dph_js's stored D_pef responses")),
    (["--config.rl.prefix_shared=on", "--config.rl.algo=gpg", "--config.rl.group_size=1",
      "--config.rl.rollout_chunks=1"],
     ("config.rl.prefix_shared='on' cannot apply", "config.rl.group_size=1")),
]
# Sizes no machine holds: refused by the memory estimate (training/memory.py) before anything
# is built or written, naming the stage and its fields, instead of aborting inside XLA.
ABSURD_CASES = [
    (["--config.rl.group_size=100000000"], ("the RL update", "rl.group_size=100000000", "GiB per device",
                                            "--config.check_memory=False")),
    (["--config.eval.samples=100000000"], ("the evaluation sampler", "eval.samples=100000000", "KV cache")),
    (["--config.model.max_new_tokens=10000000"], ("model.max_new_tokens=10000000", "the host's available memory")),
]
CONFIG_CASES += ABSURD_CASES


@pytest.mark.parametrize("args,expected", CONFIG_CASES, ids=[" ".join(a) for a, _ in CONFIG_CASES])
def test_bad_config_is_one_line_and_writes_nothing(args, expected, tmp_path, capsys):
  wd = tmp_path / "new_run"
  code, err = train_cli(BASE + args + [f"--workdir={wd}"], capsys)
  assert_refused(code, err, expected)
  assert not wd.exists()  # no stray empty workdir


# --dry_run runs the trainer's checks (the memory estimate included) before it writes anything.
DRY_RUN_CASES = [
    (["--config.tasks="], "config.tasks='' names no task"),
    (["--config.rl.lr=inf"], "config.rl.lr=inf: must be a finite number > 0"),
    (["--config.eval.temperature=nan"], "config.eval.temperature=nan: must be a finite number > 0"),
    (["--config.tasks=TSP,TSP"], "more than once"),
    (["--config.eval.k=5"], "config.eval.k=5 exceeds config.eval.samples=4"),
    (["--config.eval.points=2", "--config.eval.points_samples=X:3"], "config.eval.points_samples"),
] + ABSURD_CASES


@pytest.mark.parametrize("args,expected", DRY_RUN_CASES, ids=[" ".join(a) for a, _ in DRY_RUN_CASES])
def test_dry_run_checks_the_config_and_writes_nothing(args, expected, tmp_path, capsys):
  wd = tmp_path / "dry"
  code, err = train_cli(BASE + args + ["--dry_run", f"--workdir={wd}"], capsys)
  assert_refused(code, err, expected)
  assert not wd.exists()


def test_dry_run_writes_only_instances_json(tmp_path, capsys):
  wd = tmp_path / "dry"
  code, err = train_cli(BASE + ["--dry_run", f"--workdir={wd}"], capsys)
  assert code == 0, err[-2000:]
  assert sorted(os.listdir(wd)) == ["instances.json"]
  assert json.loads((wd / "instances.json").read_text())["checks"]["disjoint"] is True


@pytest.mark.parametrize("name,content", [("tokenizer.json", "not json"),
                                          ("tokenizer_config.json", "{")])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_damaged_tokenizer_file_is_named(name, content, dry_run, tmp_path, capsys):
  from dmpo_jax.models import tokenizer as tok_lib
  folder = tmp_path / "tok"
  tok_lib.build(str(folder))
  (folder / name).write_text(content)
  wd = tmp_path / "run"
  code, err = train_cli(BASE + [f"--config.model.tokenizer={folder}", f"--workdir={wd}"]
                        + ["--dry_run"] * dry_run, capsys)
  assert_refused(code, err, (f"cannot read the tokenizer file {folder / name}", "JSONDecodeError"))
  assert not wd.exists()


def test_the_memory_check_refuses_past_the_limit_unless_overridden(tmp_path, monkeypatch):
  """A config whose largest stage exceeds the device by one byte is refused, naming the stage,
  its fields and both figures; one byte more memory, or config.check_memory=False, lets it
  through (the estimate is the planner's: no run needed)."""
  from dmpo_jax.parallel import sharding
  from dmpo_jax.training import memory
  cfg = smoke()
  obj = run_lib.objective_from_config(cfg)
  mesh = sharding.make_mesh(dict(cfg.mesh))
  phase, p = max(memory.estimate(cfg, obj, mesh, cfg.eval.samples), key=lambda pp: pp[1][pp[0].peak])
  peak = p[phase.peak]
  assert peak > p["param_bytes"] + p["optimizer_bytes"]  # the rows count, not only the model
  devices = mesh.devices.size  # CPU devices share the host's memory (tests run 8 of them)
  monkeypatch.setattr(memory, "host_available", lambda: peak * devices - 1)
  with pytest.raises(config_lib.ConfigError, match=rf"{phase.name} \(config\..*GiB per device.*"
                     r"more than the .* GiB a device has.*check_memory=False"):
    config_lib.check_config(cfg, obj, mesh)
  cfg.check_memory = False
  config_lib.check_config(cfg, obj, mesh)
  cfg.check_memory = True
  monkeypatch.setattr(memory, "host_available", lambda: peak * devices)
  config_lib.check_config(cfg, obj, mesh)
  # The override is an instruction to one invocation: a resume may change it.
  (tmp_path / "config.json").write_text(json.dumps(config_lib.config_json(cfg)))
  assert config_lib.check_resume(smoke(check_memory=False), str(tmp_path)) is False


def test_every_config_field_is_declared(tmp_path):
  """Each field of each config in configs/ has a SCHEMA entry and passes it (a new field
  without a declaration fails here, not in a user's run)."""
  import sys
  collapse = config_module("collapse")
  llama3_dph = config_module("llama3_dph")
  mm_nphard = config_module("mm_nphard")
  mm_nphard_qwen = config_module("mm_nphard_qwen")
  nphard = config_module("nphard")
  nphard_qwen = config_module("nphard_qwen")
  smollm2_nphard = config_module("smollm2_nphard")
  folder = str(tmp_path)  # the HF configs take a local folder; it only has to exist here
  gguf_file = tmp_path / "model.gguf"  # ... or a .gguf file
  gguf_file.write_bytes(b"")
  for cfg in (nphard.get_config(), nphard.get_config("smoke"), collapse.get_config(),
              collapse.get_config("smoke,pool=4"), mm_nphard.get_config(), mm_nphard.get_config("smoke"),
              nphard_qwen.get_config(folder), llama3_dph.get_config(folder),
              mm_nphard_qwen.get_config(folder), smollm2_nphard.get_config(f"gguf={gguf_file}"),
              smollm2_nphard.get_config(f"smoke,gguf={gguf_file}")):
    config_lib.check_fields(cfg)
  with pytest.raises(config_lib.ConfigError, match="config.model.init='/no/such/folder': must be 'scratch', a local"):
    config_lib.check_fields(nphard_qwen.get_config("/no/such/folder"))
  cfg = nphard.get_config("smoke")
  with cfg.unlocked():
    cfg.rl.new_field = 1
  with pytest.raises(config_lib.ConfigError, match=r"config.rl.new_field=1 is not a known field"):
    config_lib.check_fields(cfg)


def test_resume_contract_lists_the_differing_fields(tmp_path):
  cfg = smoke()
  (tmp_path / "config.json").write_text(json.dumps(config_lib.config_json(cfg)))
  assert config_lib.check_resume(cfg, str(tmp_path)) is False  # same config: nothing to write
  cfg.stop_at_step = 4  # never compared
  assert config_lib.check_resume(cfg, str(tmp_path)) is False
  changed = smoke("smoke,algo=grpo", **{"eval.samples": 8, "log.every": 2})
  with pytest.raises(config_lib.ConfigError, match=r"3 field\(s\) differ: eval.samples: 4 -> 8; "
                     r"log.every: 1 -> 2; rl.algo: 'dmpo' -> 'grpo'.*allow_config_change=log.every"):
    config_lib.check_resume(changed, str(tmp_path))
  logging_only = smoke(**{"log.every": 2, "checkpoint.keep": 3})
  assert config_lib.check_resume(logging_only, str(tmp_path), ["log.every", "checkpoint.keep"])
  (tmp_path / "config.json").write_text('{"seed": 0, "rl": {"al')
  with pytest.raises(config_lib.ConfigError, match=r"config.json is damaged"):
    config_lib.check_resume(cfg, str(tmp_path))


def test_a_field_added_later_resumes_at_the_value_its_absence_meant(tmp_path):
  """A run saved before eval.zero_shot / eval.points existed resumes when the config keeps the
  values their absence meant, and is refused when it sets another."""
  cfg = smoke()
  old = config_lib.config_json(cfg)
  for field in ("zero_shot", "points", "points_samples"):
    del old["eval"][field]
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert config_lib.check_resume(cfg, str(tmp_path)) is False
  with pytest.raises(config_lib.ConfigError, match=r"eval.zero_shot: '<absent>' -> True"):
    config_lib.check_resume(smoke(**{"eval.zero_shot": True}), str(tmp_path))



def test_a_run_from_before_prefix_sharing_resumes_per_row_or_when_allowed(tmp_path):
  """A config.json without rl.prefix_shared ran every forward per row: it resumes as it was
  with "off"; the default "auto" is refused, naming the field and --allow_config_change
  (the same float32 sums in another order, as a mesh change)."""
  cfg = smoke()
  old = config_lib.config_json(cfg)
  del old["rl"]["prefix_shared"]
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert config_lib.check_resume(smoke(**{"rl.prefix_shared": "off"}), str(tmp_path)) is False
  with pytest.raises(config_lib.ConfigError, match=r"rl.prefix_shared: '<absent>' -> 'auto'.*"
                     r"allow_config_change=rl.prefix_shared"):
    config_lib.check_resume(cfg, str(tmp_path))
  assert config_lib.check_resume(cfg, str(tmp_path), ["rl.prefix_shared"]) is True


def npbench_record(task="TSP", level="easy", seed=0, **over):
  from dmpo_jax.tasks import data
  r = data.make_record(task, seed, level)
  r.update(over)
  return r


def keyed(records) -> str:
  return json.dumps({f"{r['task_type']}_{r['level']}_question{i + 1}": r for i, r in enumerate(records)})


def file_cases():
  tsp, knap = npbench_record("TSP"), npbench_record("knapsack")
  gt = lambda v: keyed([dict(tsp, ground_truth=v)])
  return [
      ("nan.json", gt(float("nan")), "record 'TSP_easy_question1': ground_truth=nan must be finite"),
      ("inf.json", gt(float("inf")), "ground_truth=inf must be finite and > 0"),
      ("zero.json", gt(0), "ground_truth=0 must be finite and > 0"),
      ("neg.json", gt(-3.5), "ground_truth=-3.5"),
      ("text.json", gt("many"), "ground_truth='many' must be a number"),
      ("digits.json", gt(12345).replace("12345", "9" * 5000), "over 30 digits"),
      ("empty_q.json", keyed([dict(tsp, question={})]), "question: TSP: the question is empty"),
      ("garbage_q.json", keyed([dict(tsp, question={"x": "y"})]), "question field 'x' is not a vertex id"),
      ("wrong_task.json", keyed([dict(tsp, task_type="knapsack")]),
       "question: knapsack: the question lacks field 'capacity'"),
      ("wrong_key.json", json.dumps({"knapsack_easy_question1": tsp}), "key names another task"),
      ("empty_prompt.json", keyed([dict(tsp, prompt="")]), "prompt must be non-empty"),
      ("empty.json", "", "the file is empty"),
      ("none.json", "[]", "holds no records"),
      ("latin1.jsonl", json.dumps(knap).encode() + b"\n\xe9t\xe9\n", "not UTF-8"),
      ("lines.jsonl", "\n".join([json.dumps(tsp), json.dumps(knap), '{"task_type": "TSP", "quest']),
       "line 3 is not JSON"),
      ("third.jsonl", "\n".join([json.dumps(tsp), json.dumps(knap), json.dumps(dict(knap, question={}))]),
       "record on line 3: question"),
      ("unknown_task.json", keyed([dict(tsp, task_type="TSPX")]), "unknown task_type 'TSPX'"),
  ]


def test_bad_npbench_files_name_file_record_and_field(tmp_path, capsys):
  out = tmp_path / "out"
  for name, content, expected in file_cases():
    path = tmp_path / name
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    before = snapshot(tmp_path)
    code, err = evaluate_cli([f"--hf={tmp_path}/no_model", f"--npbench_file={path}", f"--out={out}"], capsys)
    assert_refused(code, err, (name, expected))
    assert snapshot(tmp_path) == before and not out.exists(), name


EVAL_FLAG_CASES = [
    (["--samples=2"], "--k=3 exceeds --samples=2"),
    (["--k=0"], "--k=0 must be >= 1"),
    (["--temperature=0"], "--temperature=0.0"),
    (["--compat=bogus"], "--compat='bogus'"),
    (["--tasks=TSP,nope"], "unknown task(s) ['nope']"),
]


@pytest.mark.parametrize("args,expected", EVAL_FLAG_CASES, ids=[" ".join(a) for a, _ in EVAL_FLAG_CASES])
def test_bad_evaluate_flags(args, expected, tmp_path, capsys):
  code, err = evaluate_cli([f"--hf={tmp_path}/no_model", f"--out={tmp_path}/out"] + args, capsys)
  assert_refused(code, err, expected)
  assert not (tmp_path / "out").exists()


def test_evaluate_refuses_a_damaged_workdir_config(tmp_path, capsys):
  (tmp_path / "config.json").write_text('{"seed": 0, "mod')
  before = snapshot(tmp_path)
  code, err = evaluate_cli([f"--workdir={tmp_path}", f"--out={tmp_path}/out"], capsys)
  assert_refused(code, err, (f"{tmp_path}/config.json is damaged", "JSONDecodeError"))
  assert snapshot(tmp_path) == before


def test_verifiers_refuse_malformed_questions_and_compat():
  from dmpo_jax import tasks
  for key in tasks.names():
    task = tasks.get(key)
    other = tasks.get("knapsack" if key != "knapsack" else "TSP").generate(0, "tiny")
    for bad, field in (({}, "question"), (other, "question")):
      with pytest.raises(ValueError, match=f"{key}: {field}|{key}: the question"):
        task.reference_value(bad)
      with pytest.raises(ValueError, match=key):
        task.verify(bad, "no answer here")  # refused whatever the text
    with pytest.raises(ValueError, match="unknown compat 'bogus'"):
      task.verify(task.generate(0, "tiny"), "no answer here", compat="bogus")


def test_metrics_cut_drops_a_partial_line_and_later_steps(tmp_path, capsys):
  from dmpo_jax.training import report
  path = tmp_path / "metrics.jsonl"
  rows = [json.dumps({"step": s, "stage": "rl"}) for s in (1, 2, 3)]
  path.write_text("\n".join(rows) + '\n{"step": 4, "sta')
  report.MetricsWriter(str(tmp_path), tensorboard=False, resume_step=None)
  assert path.read_text() == "\n".join(rows) + "\n"
  assert "partial last line (16 bytes) dropped" in capsys.readouterr().out
  report.MetricsWriter(str(tmp_path), tensorboard=False, resume_step=2).write(3, "rl", {"x": 1.0})
  assert [json.loads(l) for l in path.read_text().splitlines()] == [
      {"step": 1, "stage": "rl"}, {"step": 2, "stage": "rl"}, {"step": 3, "stage": "rl", "x": 1.0}]


def test_any_k_in_tables_and_plots(tmp_path):
  from dmpo_jax.training import evaluation, report
  problems = [("TSP", {"SR@2": 1.0, "QR@2": 0.5, "SR_mean": 0.5, "QR_mean": 0.25, "distinct": 1.0,
                       "length": 3.0})]
  res = evaluation.summarize(problems, k=2)
  assert res["k"] == 2
  assert "QR@2" in evaluation.format_table(res, res).splitlines()[0]
  report.plot_before_after(res, res, str(tmp_path / "p.png"))
  assert (tmp_path / "p.png").stat().st_size > 0


# ---------------------------------------------------------------------------
# Slow: one finished smoke run, copied per case.
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  wd = tmp_path_factory.mktemp("finished") / "run"
  stages.train(smoke(), str(wd))
  return wd


def copy_of(finished, tmp_path):
  wd = tmp_path / "run"
  shutil.copytree(finished, wd)
  return wd


RESUME_CASES = [
    (["--config.rl.algo=grpo"], "rl.algo: 'dmpo' -> 'grpo'"),
    (["--config.eval.samples=8"], "eval.samples: 4 -> 8"),
    (["--config.eval.k=2"], "eval.k: 3 -> 2"),
    (["--config.model.hidden_size=64"], "model.hidden_size: 32 -> 64"),
    (["--config.seed=1"], "seed: 0 -> 1"),
    (["--config.checkpoint.keep=0"], "config.checkpoint.keep=0"),
    (["--config.log.every=2"], ("log.every: 1 -> 2", "--allow_config_change=log.every")),
    (["--config.log.every=2", "--allow_config_change=log.every", "--config.rl.steps=4"], "rl.steps: 3 -> 4"),
]


@pytest.mark.slow
def test_refused_resumes_leave_the_workdir_as_it_was(finished, tmp_path, capsys):
  wd = copy_of(finished, tmp_path)
  before = snapshot(wd)
  for args, expected in RESUME_CASES:
    code, err = train_cli(BASE + args + [f"--workdir={wd}"], capsys)
    assert_refused(code, err, expected)
    assert snapshot(wd) == before, args


@pytest.mark.slow
def test_evaluate_any_k_and_prompts_past_the_context(finished, tmp_path, capsys):
  out = tmp_path / "out"
  code, err = evaluate_cli([f"--hf={finished}/hf", "--k=2", "--samples=2", "--num=1", "--tasks=TSP",
                            "--style=compact", "--level=tiny", "--max_new_tokens=8", f"--out={out}"], capsys)
  assert code == 0, err[-2000:]
  assert "QR@2" in json.loads((out / "eval.json").read_text())["overall"]
  big = npbench_record("TSP", prompt="x " * 40_000)
  path = tmp_path / "long.json"
  path.write_text(keyed([big]))
  code, err = evaluate_cli([f"--hf={finished}/hf", f"--npbench_file={path}", "--style=npbench",
                            f"--out={tmp_path / 'out2'}"], capsys)
  assert_refused(code, err, ("long.json: record 'TSP_easy_question1': prompt has", "context"))
  assert not (tmp_path / "out2").exists()



@pytest.mark.slow
def test_damaged_latest_checkpoint_falls_back_and_ends_like_an_uninterrupted_run(finished, tmp_path, capsys):
  wd = tmp_path / "run"
  assert stages.train(smoke(stop_at_step=5), str(wd)) == {"stopped": True, "step": 5}
  meta = wd / "checkpoints" / "5" / "meta" / "metadata"
  meta.write_bytes(meta.read_bytes()[:94])  # truncated mid-record
  with open(wd / "metrics.jsonl", "a") as f:
    f.write('{"step": 6, "stage": "rl", "rew')  # a write cut short
  (wd / "checkpoints" / "7").mkdir()  # an empty step folder
  before = snapshot(wd)
  capsys.readouterr()
  code, err = evaluate_cli([f"--workdir={wd}", "--num=1", "--tasks=TSP", "--samples=2", "--k=2",
                            f"--out={tmp_path / 'eval'}"], capsys)  # reads, never moves
  assert code == 0, err[-2000:]
  assert snapshot(wd) == before and (tmp_path / "eval" / "eval.json").exists()
  capsys.readouterr()
  stages.train(smoke(), str(wd))
  out = capsys.readouterr().out
  assert f"skipping checkpoint {wd}/checkpoints/7 ({wd}/checkpoints/7/_CHECKPOINT_METADATA: missing)" in out
  assert f"skipping checkpoint {wd}/checkpoints/5 ({meta}: JSONDecodeError" in out
  assert f"resumed {wd} at step 4" in out and "partial last line (31 bytes) dropped" in out
  assert sorted(n.split("-")[0] for n in os.listdir(f"{wd}/checkpoints.damaged")) == ["5", "7"]
  a, b = saved_state(finished, 6), saved_state(wd, 6)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  assert metric_rows(wd) == metric_rows(finished)
  ra, rb = (json.loads((d / "results.json").read_text()) for d in (finished, wd))
  assert ra["after"] == rb["after"] and ra["before"] == rb["before"]


@pytest.mark.slow
def test_damaged_eval_file_is_recomputed_and_results_match(finished, tmp_path, capsys):
  wd = copy_of(finished, tmp_path)
  after = wd / "eval_after.json"
  after.write_text(after.read_text()[:200])
  capsys.readouterr()
  stages.train(smoke(), str(wd))
  assert f"{after} is damaged (JSONDecodeError" in capsys.readouterr().out
  assert json.loads(after.read_text()) == json.loads((finished / "eval_after.json").read_text())
  # eval_before of a finished run: its policy (the end of SFT, step 3) is no longer kept
  before = wd / "eval_before.json"
  before.write_text("{}")
  with pytest.raises(run_lib.TrainingError, match="eval_before.json is missing or damaged"):
    stages.train(smoke(), str(wd))


@pytest.mark.slow
def test_a_failing_plot_loses_nothing(finished, tmp_path, capsys, monkeypatch):
  """The end of a run writes results.json and the HF export before the plots; a plot that
  fails is a warning (rerun of a finished copy: the evaluations are read back)."""
  from dmpo_jax.training import report
  wd = copy_of(finished, tmp_path)
  for f in ("results.json", "before_after.png"):
    os.remove(wd / f)
  shutil.rmtree(wd / "hf")
  def broken(*args, **kw):
    raise RuntimeError("no display")
  monkeypatch.setattr(report, "plot_before_after", broken)
  res = stages.train(smoke(), str(wd))
  assert f"warning: could not draw {wd}/before_after.png (RuntimeError: no display)" in capsys.readouterr().out
  assert json.loads((wd / "results.json").read_text())["after"] == res["after"]
  assert (wd / "hf" / "model.safetensors").exists() and not (wd / "before_after.png").exists()


@pytest.mark.slow
def test_no_usable_checkpoint_is_an_error_that_names_the_file(finished, tmp_path):
  wd = copy_of(finished, tmp_path)
  for step in ckpt_lib.Checkpointer(str(wd / "checkpoints")).mngr.all_steps():
    (wd / "checkpoints" / str(step) / "_CHECKPOINT_METADATA").write_text("")
  before = snapshot(wd)
  with pytest.raises(ckpt_lib.CheckpointError, match=r"no usable checkpoint.*checkpoints/6/_CHECKPOINT_METADATA"):
    stages.train(smoke(), str(wd))
  assert snapshot(wd) == before


@pytest.mark.parametrize("name,arg", [("nphard", None), ("nphard", "smoke,algo=grpo"),
                                      ("collapse", None), ("collapse", "smoke,pass256"),
                                      ("mm_nphard", "smoke"), ("nphard_qwen", "FOLDER"),
                                      ("llama3_dph", "FOLDER"), ("mm_nphard_qwen", "FOLDER")])
def test_configs_load_by_path_from_another_directory(name, arg, tmp_path, monkeypatch):
  """Every shipped config loads from its path alone (siblings by path, configs/ not on
  sys.path), whatever the working directory, and passes the schema."""
  import sys
  from dmpo_jax.training import config as config_lib
  repo = REPO
  folder = tmp_path / "model"
  folder.mkdir()
  monkeypatch.chdir(tmp_path)
  configs_dir = os.path.join(repo, "configs")
  monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or ".") != configs_dir])
  cfg = config_lib.load_config(os.path.join(configs_dir, f"{name}.py"),
                               str(folder) if arg == "FOLDER" else arg)
  config_lib.check_fields(cfg)
  assert cfg.rl.steps >= 0 and (arg != "FOLDER" or cfg.model.init == str(folder))


@pytest.mark.parametrize("name", ["nphard", "collapse"])
def test_config_arguments_are_checked_by_one_parser(name):
  from dmpo_jax.training import config as config_lib
  repo = REPO
  with pytest.raises(ValueError, match=rf"configs/{name}.py: unknown argument\(s\) \['bogus'\]"):
    config_lib.load_config(os.path.join(repo, "configs", f"{name}.py"), "smoke,bogus=1")
