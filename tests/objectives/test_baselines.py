"""The published answers to diversity collapse (docs/METHODS.md, baselines), each against an
independent computation: brute force over k-subsets or outcomes, the authors' rule written
out by hand, or numpy loops."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmpo_jax.objectives import (covariance, exploration, miniature, passk, presets, shaping,
                                 terms)
from tests.helpers import config_module

NEW_PRESETS = ("passk", "pkpo", "unlikely", "w_reinforce", "nsr", "kl_cov", "clip_cov",
               "outcome_batch", "outcome_ucb")


@pytest.fixture
def x64():
  with jax.enable_x64(True):
    yield


def _subsets(n, k):
  return list(itertools.combinations(range(n), k))


# ------------------------------------------------------------------ Pass@k Training

def brute_passk_advantages(r, k):
  """Each sample's mean, over the k-subsets holding it, of the subset's z-scored max reward."""
  subs = _subsets(len(r), k)
  vals = np.array([max(r[j] for j in s) for s in subs], float)
  mean, std = vals.mean(), vals.std()
  if std == 0:
    return np.zeros(len(r))
  z = (vals - mean) / std
  return np.array([np.mean([z[a] for a, s in enumerate(subs) if i in s]) for i in range(len(r))])


@pytest.mark.parametrize("g,k", [(4, 1), (4, 2), (5, 3), (6, 4), (6, 6), (8, 4)])
def test_passk_advantage_equals_subset_enumeration(x64, g, k):
  rng = np.random.default_rng(g * 10 + k)
  rows = [rng.integers(0, 2, g) for _ in range(6)] + [np.zeros(g, int), np.ones(g, int)]
  for r in rows:
    got = np.asarray(passk.passk_advantages(jnp.asarray(r, jnp.float32), k, eps=0.0))
    np.testing.assert_allclose(got, brute_passk_advantages(r, k), atol=1e-5, err_msg=str(r))


def test_passk_k1_is_grpo():
  r = jnp.array([[1., 0., 0., 1., 1., 0.], [0., 0., 0., 1., 0., 0.]])
  from dmpo_jax.objectives import grpo
  np.testing.assert_allclose(passk.passk_advantages(r, 1, eps=0.0),
                             grpo.group_advantages(r, eps=0.0), atol=1e-5)


def test_passk_refuses_k_above_group():
  with pytest.raises(ValueError, match="passk_k"):
    passk.passk_advantages(jnp.zeros((2, 4)), 5)
  with pytest.raises(ValueError, match="reward='correct'"):
    presets.objective_config("grpo", advantage="passk")


# ------------------------------------------------------------------ PKPO

def brute_s(r, k, baseline):
  """(1/C(n,k)) sum over k-subsets S holding i of [max_S r - (baseline: max_{S minus i} r)]."""
  n = len(r)
  out = np.zeros(n)
  for s in _subsets(n, k):
    top = max(r[j] for j in s)
    for i in s:
      rest = [r[j] for j in s if j != i]
      out[i] += top - (max(rest) if (baseline and rest) else 0.0)
  return out / math.comb(n, k)


@pytest.mark.parametrize("n,k", [(4, 1), (4, 2), (5, 3), (6, 6), (7, 4)])
def test_pkpo_weights_equal_subset_enumeration(x64, n, k):
  rng = np.random.default_rng(n + 7 * k)
  for r in [rng.normal(size=n), rng.integers(0, 2, n).astype(float), np.round(rng.random(n), 1)]:
    for baseline in (False, True):
      got = np.asarray(passk.pkpo_weights(jnp.asarray(r), k, baseline=baseline))
      np.testing.assert_allclose(got, brute_s(r, k, baseline), atol=1e-5,
                                 err_msg=f"{r} baseline={baseline}")


def test_pkpo_weights_sum_to_k_times_pass_at_k(x64):
  # The paper's normalisation: mean_i s_i = (k / n) rho, rho the unbiased pass@k estimate.
  for n, k, c in [(6, 3, 2), (8, 4, 1), (5, 5, 3), (7, 2, 0)]:
    r = jnp.asarray([1.0] * c + [0.0] * (n - c))
    rho = 1 - math.comb(n - c, k) / math.comb(n, k)
    np.testing.assert_allclose(float(jnp.mean(passk.pkpo_weights(r, k, baseline=False))),
                               k / n * rho, atol=1e-6)


@pytest.mark.parametrize("baseline", [False, True])
def test_pkpo_gradient_is_unbiased_for_pass_at_k(x64, baseline):
  """Exact expectation over every outcome of n draws from a categorical policy over m answers:
  E[(1/n) sum_i A_i grad log pi(o_i)] with A = n s equals grad pass@k = grad (1 - (1-q)^k)."""
  m, n, k = 3, 4, 2
  theta = jnp.array([0.3, -0.5, 0.9])
  correct = jnp.array([1.0, 0.0, 0.0])
  logp = jax.nn.log_softmax(theta)
  want = jax.grad(lambda t: 1 - (1 - jnp.sum(jax.nn.softmax(t) * correct)) ** k)(theta)
  got = jnp.zeros(m)
  for outcome in itertools.product(range(m), repeat=n):
    o = jnp.asarray(outcome)
    prob = jnp.exp(jnp.sum(logp[o]))
    a = n * passk.pkpo_weights(correct[o], k, baseline=baseline)
    score = jax.jacobian(lambda t: jax.nn.log_softmax(t)[o])(theta)  # [n, m]
    got = got + prob * jnp.mean(a[:, None] * score, axis=0)
  np.testing.assert_allclose(got, want, atol=1e-10)


@pytest.mark.slow
def test_pkpo_annealing_switches_to_k1():
  cfg = presets.objective_config("pkpo", pkpo_anneal_step=5)
  r = jnp.array([[1., 0., 0., 1.], [1., 0., 0., 1.]])
  adv = presets.advantages(cfg, r, {"rl_step": jnp.array([4, 5])})
  np.testing.assert_allclose(adv[0], passk.pkpo_advantages(r[0], 4), atol=1e-6)
  np.testing.assert_allclose(adv[1], r[1], atol=1e-6)  # k = 1: A = r


# ------------------------------------------------------------------ unlikeliness reward

def test_unlikeliness_matches_the_authors_rule():
  # Mean token log-probs of 4 samples (the last token of each is padding).
  lp = jnp.array([[[-1.0, -1.0, 0.0], [-0.2, -0.4, 0.0], [-3.0, -1.0, 0.0], [-0.5, -0.5, 0.0]]])
  mask = jnp.array([[[1, 1, 0]] * 4])
  r = jnp.array([[1.0, 1.0, 0.0, 1.0]])
  # means -1, -0.3, -2, -0.5 -> ascending ranks 1, 3, 0, 2; reward * (1 - 0.25 rank / 4)
  want = np.array([[1 - 0.25 / 4, 1 - 0.75 / 4, 0.0, 1 - 0.5 / 4]])
  np.testing.assert_allclose(exploration.unlikeliness_rewards(r, lp, mask, 0.25), want, rtol=1e-6)
  cfg = presets.objective_config("unlikely")
  assert cfg.unlikely_penalty == 0.25 and cfg.unbiased_std and cfg.reward == "correct"


# ------------------------------------------------------------------ W-REINFORCE / NSR

def test_w_reinforce_gradient_is_weighted_psr_plus_nsr():
  """With pi = pi_old the PPO surrogate's gradient is that of
  -(1/G) [lambda sum_{correct} log pi(o_i) - sum_{wrong} log pi(o_i)] (per-sequence token mean)."""
  for name, lam in (("w_reinforce", 0.1), ("nsr", 0.0)):
    cfg = presets.objective_config(name)
    assert cfg.psr_weight == lam
    theta = jnp.array([0.2, -0.3, 0.5, 0.0])
    seqs = jnp.array([[0, 1, 2, 1, 3]])
    r = jnp.array([[1.0, 0.0, 1.0, 0.0, 0.0]])

    def logprob_fn(t, s):
      return {"logprobs": jax.nn.log_softmax(t)[s][..., None]}
    batch = {"seqs": seqs, "mask": jnp.ones(seqs.shape + (1,)), "rewards": r,
             "old_logprobs": jax.nn.log_softmax(theta)[seqs][..., None]}
    g = jax.grad(lambda t: presets.build_loss(cfg, logprob_fn)(t, batch)[0])(theta)
    want = jax.grad(lambda t: -jnp.mean(jnp.where(r > 0, lam, -1.0) * jax.nn.log_softmax(t)[seqs]))(theta)
    np.testing.assert_allclose(g, want, atol=1e-6)


# ------------------------------------------------------------------ KL-Cov / Clip-Cov

def _cov_case(seed=0, shape=(2, 3, 5)):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  lp = -jax.random.uniform(k1, shape, minval=0.05, maxval=3.0)
  old = lp + 0.1 * jax.random.normal(k2, shape)
  adv = jax.random.normal(k3, shape[:-1]) * 2.0
  mask = jnp.ones(shape).at[0, 1, 3:].set(0).at[1, 2, 1:].set(0)
  return lp, old, adv, mask


def test_token_covariance_by_loops():
  lp, _, adv, mask = _cov_case()
  l, a, m = np.asarray(lp), np.asarray(adv), np.asarray(mask)
  vals = [(l[p, g, t], a[p, g]) for p in range(2) for g in range(3) for t in range(5) if m[p, g, t]]
  ml, ma = np.mean([v[0] for v in vals]), np.mean([v[1] for v in vals])
  got = np.asarray(covariance.token_covariance(lp, adv, mask))
  for p, g, t in itertools.product(range(2), range(3), range(5)):
    want = (l[p, g, t] - ml) * (a[p, g] - ma) if m[p, g, t] else 0.0
    assert abs(got[p, g, t] - want) < 1e-5


def test_kl_cov_penalises_the_top_tokens_and_only_them():
  lp, old, adv, mask = _cov_case(1)
  frac = 0.2
  cov = np.asarray(covariance.token_covariance(lp, adv, mask))
  n_valid = int(np.asarray(mask).sum())
  n = max(1, int(frac * n_valid))
  valid = np.argwhere(np.asarray(mask) > 0)
  order = sorted(map(tuple, valid), key=lambda i: -cov[i])[:n]
  chosen = np.zeros(cov.shape, bool)
  for i in order:
    chosen[i] = True
  ratio = np.exp(np.asarray(lp - old))
  per = -np.asarray(adv)[..., None] * ratio + np.where(chosen, np.abs(np.asarray(lp - old)), 0.0)
  want = (per * np.asarray(mask)).sum() / n_valid
  loss, aux = covariance.kl_cov_loss(lp, old, mask, adv, frac=frac)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  np.testing.assert_allclose(float(aux["cov_frac"]), n / n_valid, rtol=1e-6)


@pytest.mark.slow
def test_clip_cov_detaches_a_random_subset_of_the_band():
  lp, old, adv, mask = _cov_case(2, (2, 4, 8))
  lb, ub, frac = -1.0, 1.0, 0.1
  cov = np.asarray(covariance.token_covariance(lp, adv, mask))
  g = jax.grad(lambda l: covariance.clip_cov_loss(l, old, mask, adv, jax.random.key(3), frac=frac,
                                                  lb=lb, ub=ub, eps_low=10.0, eps_high=10.0)[0])(lp)
  g0 = jax.grad(lambda l: covariance.clip_cov_loss(l, old, mask, adv, jax.random.key(3), frac=1e-9,
                                                   lb=5e3, ub=6e3, eps_low=10.0, eps_high=10.0)[0])(lp)
  zeroed = (np.asarray(g) == 0) & (np.asarray(g0) != 0)
  n_valid = int(np.asarray(mask).sum())
  assert zeroed.sum() == max(1, int(frac * n_valid))  # exactly that many tokens lose their gradient
  assert np.all((cov[zeroed] > lb) & (cov[zeroed] < ub))  # all from the band
  np.testing.assert_array_equal(np.asarray(g)[~zeroed], np.asarray(g0)[~zeroed])


# ------------------------------------------------------------------ outcome-based exploration

def test_batch_exploration_counts_repeats_in_each_group():
  answers = jnp.array([[3, 3, 5, -1, 3, -1], [1, 2, 3, 4, 5, 6]])
  r = jnp.array([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0], [0.0] * 6])
  want = np.array(r)
  for p in range(2):
    a = np.asarray(answers[p])
    for i in range(6):
      if a[i] >= 0:
        want[p, i] -= 0.5 * sum(a[j] == a[i] for j in range(6) if j != i) / 6
  np.testing.assert_allclose(exploration.batch_exploration_rewards(r, answers, 0.5), want)


def test_ucb_bonus_counts_over_steps_and_state_is_json():
  import json
  state = {}
  cfg = presets.objective_config("outcome_ucb", explore_coef=1.0)
  info = {"prompt": ["x", "y"], "answer": np.array([[7, 7, -1], [1, 2, 1]])}
  r1 = shaping.SHAPING.get("outcome_ucb").fn(cfg, np.zeros((2, 3), np.float32), info, state)
  np.testing.assert_allclose(r1, [[1 / np.sqrt(2), 1 / np.sqrt(2), 0], [1 / np.sqrt(2), 1, 1 / np.sqrt(2)]],
                             rtol=1e-6)
  state = json.loads(json.dumps(state))  # a checkpoint round trip
  r2 = shaping.SHAPING.get("outcome_ucb").fn(cfg, np.zeros((2, 3), np.float32), info, state)
  np.testing.assert_allclose(r2[0, :2], 1 / np.sqrt(4), rtol=1e-6)
  assert state == {"outcome_ucb": {"x": {"7": 4}, "y": {"1": 4, "2": 2}}}


def test_correct_flag_replaces_the_shaped_reward():
  cfg = presets.objective_config("passk")
  r, keep = shaping.shape_rewards(cfg, np.full((1, 3), 0.7, np.float32), np.ones((1, 3)),
                                  np.ones((1, 3), bool), 8, correct=np.array([[1, 0, 1]]))
  np.testing.assert_array_equal(r, [[1.0, 0.0, 1.0]])
  with pytest.raises(ValueError, match="correct"):
    shaping.shape_rewards(cfg, r, np.ones((1, 3)), np.ones((1, 3), bool), 8)


# ------------------------------------------------------------------ presets and knobs

def test_every_new_preset_builds_and_declares_its_batch():
  for name in NEW_PRESETS:
    cfg = presets.objective_config(name)
    assert name in presets.preset_names()
    assert set(presets.batch_needs(cfg)) <= {"answer", "key", "rl_step"}
  assert presets.batch_needs(presets.objective_config("dmpo")) == ()
  assert presets.batch_needs(presets.objective_config("grpo")) == ()
  with pytest.raises(ValueError, match="unlikely_penalty"):
    presets.objective_config("unlikely", unlikely_penalty=1.0)
  with pytest.raises(ValueError, match="kl_cov_frac"):
    presets.objective_config("kl_cov", kl_cov_frac=0.0)
  with pytest.raises(ValueError, match="objective.shaping"):
    presets.objective_config("grpo", shaping="bogus")
  with pytest.raises(ValueError, match="objective.correct"):
    presets.objective_config("passk", correct="maybe")


# ------------------------------------------------------------------ the verifier's flags

def test_score_groups_flags_optimal_feasible_and_answers():
  from dmpo_jax import tasks as tasks_lib
  from dmpo_jax.tasks import rewards as rewards_lib
  from dmpo_jax.data import pipeline
  task = tasks_lib.get("knapsack")
  for seed in range(50):  # an instance with a feasible solution that is not optimal
    q = task.generate(seed, "tiny")
    opt = task.optimal_solutions(q)
    worse = [s for s in task.sample_solutions(q, 8, seed=seed)
             if task.verify_solution(q, s).value != opt.value]
    if opt.complete and worse:
      break
  texts = ["Answer: " + task.format_solution(opt.solutions[0]), "Answer: " + task.format_answer(worse[0]),
           "Answer: nonsense", "Answer: " + task.format_solution(opt.solutions[0])]
  cfg = rewards_lib.RewardConfig()
  _, st = pipeline.score_groups([("knapsack", q)], texts, 4, cfg, correct="optimal", answers=True)
  np.testing.assert_array_equal(st["correct"], [[True, False, False, True]])
  _, st_f = pipeline.score_groups([("knapsack", q)], texts, 4, cfg, correct="feasible")
  np.testing.assert_array_equal(st_f["correct"], [[True, True, False, True]])
  a = st["answer"][0]
  assert a[0] == a[3] and a[0] != a[1] and a[2] == -1 and a[0] >= 0
  assert pipeline.prompt_id("knapsack", q) == pipeline.prompt_id("knapsack", task.generate(seed, "tiny"))


# ------------------------------------------------------------------ the miniature

def test_miniature_runs_on_device_terms_and_refuses_host_state():
  with pytest.raises(ValueError, match="host state"):
    miniature.train(presets.objective_config("outcome_ucb"), [1.0, 0.0], jnp.zeros(2))
  fn = miniature.train(presets.objective_config("clip_cov"), [1.0, 1.0, 0.0], jnp.zeros(3), steps=3)
  final, hist = fn(jax.random.key(0))
  assert hist.shape == (3, 3) and np.isclose(float(final.sum()), 1.0, atol=1e-5)


# ------------------------------------------------------------------ end to end (slow tier)

@pytest.mark.slow
@pytest.mark.parametrize("algo", NEW_PRESETS)
def test_smoke_run(algo, tmp_path):
  import json
  from dmpo_jax.training import stages
  from tests.helpers import smoke
  cfg = smoke(f"smoke,algo={algo}", **{"checkpoint.export_hf": False, "log.plots": False})
  res = stages.train(cfg, str(tmp_path))
  assert res["algo"] == algo
  rows = [json.loads(l) for l in open(tmp_path / "metrics.jsonl") if '"rl"' in l]
  assert len(rows) == 3 and all(np.isfinite(r["loss"]) for r in rows)
  obj = presets.objective_config(algo)
  if obj.reward == "correct":
    assert all(0.0 <= r["correct"] <= 1.0 for r in rows)
  if obj.policy_loss in ("kl_cov", "clip_cov"):  # KL-Cov always picks at least one token
    assert all(r["pg_cov_frac"] > 0 if algo == "kl_cov" else r["pg_cov_frac"] >= 0 for r in rows)


# ------------------------------------------------------------------ pass@k to 256

def test_pass_at_k_to_256_against_exact_counts():
  """The product-form estimator against brute force over k-subsets (small n) and against
  exact integer binomials at n = 256 (every k of the pass256 range)."""
  from fractions import Fraction
  from dmpo_jax.tasks import diversity, scoring
  for n in range(1, 9):
    for c in range(n + 1):
      for k in range(1, n + 1):
        hits = [1] * c + [0] * (n - c)
        subs = _subsets(n, k)
        want = sum(any(hits[j] for j in s) for s in subs) / len(subs)
        assert abs(scoring.pass_at_k(n, c, k) - want) < 1e-12, (n, c, k)
  collapse = config_module("collapse")
  assert collapse.PASS256_KS[-1] == 256
  for c in (0, 1, 2, 7, 64, 200, 255, 256):
    for k in collapse.PASS256_KS:
      want = 1 - Fraction(math.comb(256 - c, k), math.comb(256, k))
      assert abs(scoring.pass_at_k(256, c, k) - float(want)) < 1e-12, (c, k)
  correct = np.zeros((3, 256), bool)
  correct[0, :5] = True
  correct[2] = True
  curve = diversity.pass_at_k_curve(correct, collapse.PASS256_KS)
  want = [np.mean([float(1 - Fraction(math.comb(256 - c, k), math.comb(256, k))) for c in (5, 0, 256)])
          for k in collapse.PASS256_KS]
  np.testing.assert_allclose(curve, want, atol=1e-12)


def test_pass256_config():
  collapse = config_module("collapse")
  c = collapse.get_config("pass256")
  assert c.eval.samples == 256 and max(c.eval.pass_ks) == 256
  # Rows per sampler call stay within what the default run's evaluations already sample at once
  # (its evaluation points: up to 64 samples x eval.batch_prompts prompts).
  default = collapse.get_config("")
  point_samples = max(int(part.split(":")[-1]) for part in default.eval.points_samples.split(","))
  largest = max(default.eval.samples, point_samples) * default.eval.batch_prompts
  assert c.eval.samples * c.eval.batch_prompts <= largest, (c.eval.batch_prompts, largest)


def test_group_smaller_than_k_is_refused_before_training():
  presets.check_group_size(presets.objective_config("passk"), 4)
  with pytest.raises(ValueError, match="passk_k=8 exceeds the group size"):
    presets.check_group_size(presets.objective_config("passk", passk_k=8), 4)
  with pytest.raises(ValueError, match="pkpo_k=5"):
    presets.check_group_size(presets.objective_config("pkpo", pkpo_k=5), 4)


@pytest.mark.slow  # the miniature's table (docs/METHODS.md): 400 steps x 8 seeds per preset
def test_miniature_terms_on_answers_keep_the_weakest_optimum():
  rewards = [1.0, 1.0, 1.0, 0.5, 0.2, 0.0]
  skewed = jnp.log(jnp.array([0.3, 0.03, 0.03, 0.24, 0.2, 0.2]))

  def weakest(name):
    fn = miniature.train(presets.objective_config(name), rewards, skewed, steps=400, lr=0.05)
    final, _ = jax.vmap(fn)(jax.random.split(jax.random.key(0), 8))
    return np.asarray(final)[:, :3].min(1)

  g = weakest("grpo")
  assert g.mean() < 0.05, g
  for name in ("unlikely", "outcome_batch"):
    w = weakest(name)
    assert w.min() > 0.25 and w.mean() > 5 * g.mean(), (name, w)


@pytest.mark.slow
def test_pkpo_on_binary_rewards_leaves_wrong_samples_at_zero():
  r = jnp.array([[1., 0., 0., 1., 0., 0., 0., 0.], [0., 0., 0., 0., 1., 0., 0., 0.]])
  adv = np.asarray(passk.pkpo_advantages(r, 4))
  np.testing.assert_allclose(adv[np.asarray(r) == 0], 0.0, atol=1e-6)
  assert (adv[np.asarray(r) == 1] > 0).all()
