"""A new regulariser in one file: its settings section, its needs and a preset, registered here
with no library file edited; build_loss sums it, the trainer supplies what it declares, and the
smoke config trains the preset. Also: the built-in terms own every objective field once."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmpo_jax.objectives import presets, regularisers, settings
from dmpo_jax.objectives.needs import Needs
from tests.helpers import metric_rows, smoke


# ------------------------------------------------------------------ the new term, whole

@dataclasses.dataclass(frozen=True)
class AnswerEntropyConfig:
  answer_entropy_coef: float = 0.0  # weight of the bonus; 0 = off

  def __post_init__(self):
    settings.at_least(self, 0, "answer_entropy_coef")


def answer_entropy_needs(s: AnswerEntropyConfig) -> Needs:
  if s.answer_entropy_coef == 0:
    return Needs()
  return Needs(batch=("answer",), min_group=((2, "the answer entropy needs G >= 2"),))


def answer_entropy(s: AnswerEntropyConfig, x: regularisers.RegInputs):
  """-coef x H(m): m the policy's group distribution q = softmax(phi) summed per final answer,
  H = -sum_a m_a log m_a = -sum_i q_i log m_answer(i), averaged over groups. A sample without
  an answer (id -1) is an answer of its own."""
  if s.answer_entropy_coef == 0:
    return None, {}
  q = jax.nn.softmax(x.scores, axis=-1)  # [..., G]
  a = x.batch["answer"]
  same = ((a[..., :, None] == a[..., None, :]) & (a[..., :, None] >= 0)) | jnp.eye(a.shape[-1],
                                                                               dtype=bool)
  mass = jnp.einsum("...ij,...j->...i", same.astype(q.dtype), q)
  h = jnp.mean(-jnp.sum(q * jnp.log(mass), axis=-1))
  return -s.answer_entropy_coef * h, {"answer_entropy": h}


@pytest.fixture(scope="module")
def answer_entropy_term():
  """Registers the section, the regulariser and a preset; removes them afterwards, so that
  other tests see the built-in objectives only."""
  settings.section("answer_entropy")(AnswerEntropyConfig)
  regularisers.REGULARISERS.register("answer_entropy", config=AnswerEntropyConfig,
                                     needs=answer_entropy_needs)(answer_entropy)
  presets.register_preset("grpo_answer_entropy", {"answer_entropy": {"answer_entropy_coef": 0.1}})
  yield "grpo_answer_entropy"
  presets.PRESETS.pop("grpo_answer_entropy")
  regularisers.REGULARISERS.unregister("answer_entropy")
  settings.release("answer_entropy")


# ------------------------------------------------------------------ a tiny batch

def lp_fn(theta, seqs):
  return {"logprobs": jax.nn.log_softmax(theta)[seqs][..., None]}


THETA = jnp.array([0.4, -0.3, 0.2, 0.0])
SEQS = jnp.array([[0, 1, 2, 3], [3, 3, 1, 0]])
BATCH = {"seqs": SEQS, "mask": jnp.ones((2, 4, 1)), "old_logprobs": lp_fn(THETA, SEQS)["logprobs"],
         "rewards": jnp.array([[1.0, 0, 0.5, 0.5], [0, 0, 1, 1]]),
         "answer": jnp.array([[0, 0, 1, 2], [5, -1, 5, -1]], jnp.int32)}


def test_the_new_term_is_summed_after_the_policy_term_with_its_own_settings(answer_entropy_term):
  cfg = presets.objective_config(answer_entropy_term)
  assert cfg.answer_entropy_coef == 0.1 and cfg.part(AnswerEntropyConfig).answer_entropy_coef == 0.1
  assert "answer_entropy_coef" in presets.field_names()
  loss, m = presets.build_loss(cfg, lp_fn, reg_loss=True)(THETA, BATCH)
  base, mg = presets.build_loss(presets.objective_config("grpo"), lp_fn)(THETA, BATCH)
  # By hand: q = softmax of each sample's log-prob, summed per answer.
  q = np.asarray(jax.nn.softmax(lp_fn(THETA, SEQS)["logprobs"][..., 0], axis=-1))
  m0 = np.array([q[0, 0] + q[0, 1], q[0, 2], q[0, 3]])
  m1 = np.array([q[1, 0] + q[1, 2], q[1, 1], q[1, 3]])  # the two -1s are two answers
  want = np.mean([-(m0 * np.log(m0)).sum(), -(m1 * np.log(m1)).sum()])
  np.testing.assert_allclose(m["answer_entropy"], want, rtol=1e-6)
  np.testing.assert_allclose(m["reg_loss"], -0.1 * want, rtol=1e-6)
  np.testing.assert_allclose(loss, mg["pg_loss"] - 0.1 * m["answer_entropy"], rtol=1e-6)
  assert float(m["pg_loss"]) == float(mg["pg_loss"]) and "answer_entropy" not in mg
  # Its gradient raises the entropy: a step along -grad spreads mass over the answers.
  reg = presets.build_loss(cfg.replace(answer_entropy_coef=1.0), lp_fn, reg_loss=True)
  g = jax.grad(lambda t: reg(t, BATCH)[1]["reg_loss"])(THETA)
  assert float(reg(THETA - 0.1 * g, BATCH)[1]["answer_entropy"]) > float(m["answer_entropy"])
  # Off (coefficient 0): the objective is GRPO's, exactly.
  off, m_off = presets.build_loss(cfg.replace(answer_entropy_coef=0.0), lp_fn)(THETA, BATCH)
  assert float(off) == float(base) and "answer_entropy" not in m_off


def test_the_new_term_declares_its_needs_and_settings(answer_entropy_term):
  cfg = presets.objective_config(answer_entropy_term)
  need = presets.needs(cfg)
  assert need.batch == ("answer",) and not need.reference and need.slice_exact
  assert presets.needs(presets.objective_config("grpo")).batch == ()  # off: nothing asked
  assert need.group_error(2) is None
  assert presets.needs(cfg.replace(advantage="dr_grpo")).group_error(1) == (
      "config.rl.group_size=1: the answer entropy needs G >= 2")
  # The override interface: the new field on any preset, checked by its own section.
  assert presets.objective_config("dmpo", answer_entropy_coef=0.3).answer_entropy_coef == 0.3
  with pytest.raises(ValueError, match=r"objective.answer_entropy_coef must be >= 0, got -1"):
    presets.objective_config("grpo", answer_entropy_coef=-1)
  with pytest.raises(ValueError, match=r"batch\['answer'\] is required"):
    presets.build_loss(cfg, lp_fn)(THETA, {k: v for k, v in BATCH.items() if k != "answer"})


def test_fields_sections_and_presets_are_checked_when_registered(answer_entropy_term):
  @dataclasses.dataclass(frozen=True)
  class Clash:
    dm_coef: float = 0.0

  @dataclasses.dataclass
  class Loose:  # not frozen
    x: int = 0
  with pytest.raises(ValueError, match=r"field\(s\) \['dm_coef'\] already belong to section 'dm'"):
    settings.section("clash")(Clash)
  with pytest.raises(TypeError, match="must be a frozen dataclass"):
    settings.section("loose")(Loose)
  with pytest.raises(ValueError, match=r"section 'dm' has no field\(s\) \['kl_coef'\]"):
    presets.register_preset("bad", {"dm": {"kl_coef": 0.1}})
  with pytest.raises(ValueError, match="unknown section 'dmpo'"):
    presets.register_preset("bad", {"dmpo": {"dm_coef": 0.1}})
  with pytest.raises(ValueError, match="already registered"):
    regularisers.REGULARISERS.register("kl", config=regularisers.KLConfig)(lambda s, x: (None, {}))
  with pytest.raises(ValueError, match="Clash is not a registered settings section"):
    regularisers.REGULARISERS.register("clash", config=Clash)(lambda s, x: (None, {}))
  assert "clash" not in regularisers.REGULARISERS
  assert "bad" not in presets.PRESETS and "clash" not in settings.SECTIONS


def test_every_field_has_one_owner_and_every_preset_builds():
  owners = [f.name for cls in settings.SECTIONS.values() for f in dataclasses.fields(cls)]
  assert len(owners) == len(set(owners)) == len(presets.field_names())
  assert set(presets.objective_config("grpo").as_dict()) == set(owners)
  for name in presets.preset_names():
    cfg = presets.objective_config(name)
    assert cfg == presets.objective_config(name) and cfg.replace() == cfg
    for section, fields in presets.PRESETS[name].items():
      for field, value in fields.items():
        assert getattr(cfg.parts[section], field) == value == getattr(cfg, field), (name, field)
  with pytest.raises(dataclasses.FrozenInstanceError):
    presets.objective_config("grpo").dm_coef = 1.0
  names = [n for n, _ in regularisers.REGULARISERS.items()]
  assert names[:3] == ["kl", "dm", "divergence"]  # build_loss's order of summation


@pytest.mark.slow  # a few SFT and RL steps of the smoke model: ~20 s on the 2-core CPU
def test_a_preset_with_the_new_term_trains_on_the_smoke_config(answer_entropy_term, tmp_path):
  from dmpo_jax.training import stages
  cfg = smoke(f"smoke,algo={answer_entropy_term}", **{
      "sft.steps": 1, "rl.steps": 2, "tasks": "subset-sum,knapsack", "eval.num_per_task": 1,
      "checkpoint.export_hf": False, "log.plots": False})
  cfg.rl.objective.answer_entropy_coef = 0.2  # the override, as --config.rl.objective.<field>
  stages.train(cfg, str(tmp_path))
  rows = [r for r in metric_rows(tmp_path) if r["stage"] == "rl"]
  assert len(rows) == 2
  for r in rows:  # the smoke policy's samples mostly have no answer: H near log G
    assert 0.5 * np.log(4) < r["answer_entropy"] <= np.log(4) + 1e-6
    np.testing.assert_allclose(r["loss"] - r["pg_loss"], -0.2 * r["answer_entropy"], rtol=1e-4,
                               atol=1e-6)
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved["rl"]["objective"]["answer_entropy_coef"] == 0.2
  assert saved["rl"]["algo"] == answer_entropy_term
