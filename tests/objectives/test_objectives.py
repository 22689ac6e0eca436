"""Objectives: gradients checked with jax.grad, closed forms, hand-derived numbers, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from dmpo_jax.objectives import (common, dapo, divergences, dmpo, grpo, kl, miniature, presets,
                                 registry, shaping, terms)

DIV_NAMES = divergences.names()


def _cat(key, shape, scale=2.0):
  return jax.nn.log_softmax(scale * jax.random.normal(key, shape, jnp.float64), axis=-1)


@pytest.fixture
def x64():
  with jax.enable_x64(True):
    yield


# ---------------------------------------------------------------- divergences

@pytest.mark.parametrize("name", DIV_NAMES)
def test_divergence_gradients_check(x64, name):
  div = divergences.get(name)
  lp, lq = _cat(jax.random.key(0), (3, 5)), _cat(jax.random.key(1), (3, 5))
  check_grads(lambda a, b: div.between(a, b), (lp, lq), order=1, modes=("fwd", "rev"))
  mask = jnp.array([[1, 1, 0, 1], [1, 0, 0, 0]], jnp.float64)
  logp = jnp.log(jax.random.uniform(jax.random.key(2), (2, 4), jnp.float64, 0.05, 0.9))
  logr = jnp.log(jax.random.uniform(jax.random.key(3), (2, 4), jnp.float64, 0.05, 0.9))
  check_grads(lambda a: div.sample_loss(a, logr, mask), (logp,), order=1, modes=("fwd", "rev"))


def test_divergences_equal_closed_forms(x64):
  lp, lq = _cat(jax.random.key(4), (4, 7)), _cat(jax.random.key(5), (4, 7))
  p, q = jnp.exp(lp), jnp.exp(lq)
  m = (p + q) / 2
  a = 0.3
  closed = {
      "forward_kl": jnp.sum(q * (lq - lp), -1),  # KL(Q || P)
      "reverse_kl": jnp.sum(p * (lp - lq), -1),  # KL(P || Q)
      "js": 0.5 * jnp.sum(p * jnp.log(p / m), -1) + 0.5 * jnp.sum(q * jnp.log(q / m), -1),
      "total_variation": 0.5 * jnp.sum(jnp.abs(p - q), -1),
      "hellinger": jnp.sum((jnp.sqrt(p) - jnp.sqrt(q)) ** 2, -1),
      "pearson": jnp.sum((p - q) ** 2 / q, -1),
  }
  for name, want in closed.items():
    np.testing.assert_allclose(divergences.get(name).between(lp, lq), want, rtol=1e-10,
                               err_msg=name)
  want = (jnp.sum(p ** (1 - a) * q ** a, -1) - 1) / (a * (a - 1))
  np.testing.assert_allclose(divergences.get("alpha", alpha=a).between(lp, lq), want, rtol=1e-10)


@pytest.mark.parametrize("name", DIV_NAMES)
def test_generator_properties(x64, name):
  div = divergences.get(name)
  assert abs(float(div.f(jnp.float64(1.0)))) < 1e-12  # f(1) = 0
  lp, lq = _cat(jax.random.key(6), (50, 6)), _cat(jax.random.key(7), (50, 6))
  assert (div.between(lp, lq) > 1e-6).all()  # D > 0 when P != Q
  np.testing.assert_allclose(div.between(lq, lq), 0.0, atol=1e-12)  # D = 0 at P = Q


def test_alpha_limits_reach_the_kl_forms(x64):
  u = jnp.linspace(0.05, 5.0, 40, dtype=jnp.float64)
  fwd, rev = divergences.get("forward_kl"), divergences.get("reverse_kl")
  np.testing.assert_allclose(divergences.get("alpha", alpha=1 - 1e-6).f(u), fwd.f(u), atol=1e-5)
  np.testing.assert_allclose(divergences.get("alpha", alpha=1e-6).f(u), rev.f(u), atol=1e-5)


@pytest.mark.parametrize("name", ["forward_kl", "reverse_kl", "js", "alpha", "hellinger"])
def test_sample_loss_mean_converges_to_between(x64, name):
  div = divergences.get(name)
  # Scale 1: |log u| stays far below the clamps, which would bias the estimate.
  # (forward KL clamps f at 10, reached from u > 13, i.e. log u > 2.6.)
  lp, lq = _cat(jax.random.key(8), (6,), 0.7), _cat(jax.random.key(9), (6,), 0.7)
  assert float(jnp.max(jnp.abs(lp - lq))) < 2.5
  n = 200_000
  ys = jax.random.categorical(jax.random.key(10), lq, shape=(n,))
  vals = div.f_log(lp[ys] - lq[ys])  # one-token samples from the reference Q
  est = div.sample_loss(lp[ys][:, None], lq[ys][:, None], jnp.ones((n, 1)))
  se = float(jnp.std(vals)) / np.sqrt(n)
  assert abs(float(est) - float(div.between(lp, lq))) < 5 * se


def test_divergence_bad_input():
  with pytest.raises(ValueError, match="unknown divergence 'kl2'.*forward_kl"):
    divergences.get("kl2")
  for a in (0.0, -1.0, 1.0):
    with pytest.raises(ValueError, match="0 < alpha < 1"):
      divergences.get("alpha", alpha=a)
  with pytest.raises(ValueError, match="does not take parameters"):
    divergences.get("js", alpha=0.5)


# ---------------------------------------------------------------------- DMPO

def test_dm_loss_by_hand():
  # One group of 3: rewards (1, 0, 0), alpha = 1, equal scores phi = (0, 0, 0).
  # p = (e, 1, 1) / (e + 2) = (0.576117, 0.211942, 0.211942); q = (1/3, 1/3, 1/3).
  # L = [(0.576117 - 0.333333)^2 + 2 (0.211942 - 0.333333)^2] / 3
  #   = [0.0589439 + 2 * 0.0147360] / 3 = 0.0294719.
  got = dmpo.dm_loss(jnp.zeros(3), jnp.array([1.0, 0.0, 0.0]), 1.0)
  np.testing.assert_allclose(got, 0.0294719, atol=1e-6)
  np.testing.assert_allclose(dmpo.boltzmann_target(jnp.array([1.0, 0, 0]), 1.0),
                             [0.576117, 0.211942, 0.211942], atol=1e-6)


def test_dm_loss_invariance_gradient_bound_and_stop_gradient(x64):
  key = jax.random.key(11)
  scores = jax.random.normal(key, (5, 8), jnp.float64)
  rewards = jax.random.uniform(jax.random.key(12), (5, 8), jnp.float64)
  base = dmpo.dm_loss(scores, rewards, 0.7)
  shifted = dmpo.dm_loss(scores + 3.7 * jnp.arange(5.0)[:, None], rewards, 0.7)
  np.testing.assert_allclose(shifted, base, rtol=1e-12)
  # |dL/dphi_j| <= 4 q_j / G for one group.
  for g in range(5):
    grad = jax.grad(dmpo.dm_loss)(scores[g], rewards[g], 0.7)
    q = jax.nn.softmax(scores[g])
    assert (jnp.abs(grad) <= 4 * q / 8 + 1e-15).all()
  # No gradient reaches p (the rewards).
  assert jnp.all(jax.grad(dmpo.dm_loss, argnums=1)(scores, rewards, 0.7) == 0)
  check_grads(lambda s: dmpo.dm_loss(s, rewards, 0.7), (scores,), order=1, modes=("fwd", "rev"))
  # If L_DM < delta then q_i >= p_i - sqrt(G delta).
  p = dmpo.boltzmann_target(rewards[0], 0.7)
  q = jax.nn.softmax(scores[0])
  delta = float(dmpo.dm_loss(scores[0], rewards[0], 0.7)) + 1e-12
  assert (q >= p - np.sqrt(8 * delta)).all()


def test_dmpo_bad_alpha():
  with pytest.raises(ValueError, match="alpha must be > 0"):
    dmpo.dm_loss(jnp.zeros(3), jnp.zeros(3), 0.0)
  with pytest.raises(ValueError, match="dm_coef must be >= 0"):
    presets.objective_config("dmpo", dm_coef=-0.1)


# ------------------------------------------------------- GRPO and the others

def test_grpo_advantages_by_hand():
  # rewards (1, 0, 0, 1): mean 0.5, population std 0.5 -> A = (1, -1, -1, 1);
  # unbiased std sqrt(1/3) = 0.57735 -> A = +-0.866025.
  r = jnp.array([1.0, 0.0, 0.0, 1.0])
  np.testing.assert_allclose(grpo.group_advantages(r, eps=0.0), [1, -1, -1, 1], atol=1e-6)
  np.testing.assert_allclose(grpo.group_advantages(r, eps=0.0, unbiased_std=True),
                             [0.866025, -0.866025, -0.866025, 0.866025], atol=1e-6)
  np.testing.assert_allclose(grpo.dr_grpo_advantages(r), [0.5, -0.5, -0.5, 0.5])
  # RLOO: 1 - mean(0, 0, 1) = 2/3; 0 - mean(1, 0, 1) = -2/3.
  np.testing.assert_allclose(grpo.rloo_advantages(r), [2 / 3, -2 / 3, -2 / 3, 2 / 3], atol=1e-6)
  assert (grpo.group_advantages(jnp.ones((2, 4))) == 0).all()  # equal rewards: A = 0


def test_std_normalised_advantages_refuse_groups_of_one():
  with pytest.raises(ValueError, match="G >= 2"):
    grpo.group_advantages(jnp.ones((4, 1)))


def test_ppo_clip_by_hand():
  # Two sequences, A = (+1, -1) (rewards (1, 0)); token ratios (1.5, 1.0) and (0.5, 1.1).
  # seq 0: min(1.5, 1.2) = 1.2 (clipped), min(1, 1) = 1 -> mean 1.1
  # seq 1: min(-0.5, -0.8) = -0.8 (clipped), min(-1.1, -1.1) = -1.1 -> mean -0.95
  # seq_mean_token_mean = (1.1 - 0.95) / 2 = 0.075 -> loss -0.075; clip fraction 2/4.
  old = jnp.zeros((2, 2))
  new = jnp.log(jnp.array([[1.5, 1.0], [0.5, 1.1]]))
  mask = jnp.ones((2, 2))
  adv = grpo.group_advantages(jnp.array([1.0, 0.0]), eps=0.0)
  loss, aux = grpo.policy_loss(new, old, mask, adv)
  np.testing.assert_allclose(loss, -0.075, atol=1e-6)
  np.testing.assert_allclose(aux["clip_frac"], 0.5)
  # Dual clip c = 3 bounds A < 0 tokens below by -3: ratio 5 on seq 1 gives -3, not -5.
  new2 = new.at[1, 1].set(jnp.log(5.0))
  loss2, aux2 = grpo.policy_loss(new2, old, mask, adv, dual_clip=3.0)
  np.testing.assert_allclose(loss2, -(1.1 + (-0.8 - 3.0) / 2) / 2, atol=1e-6)
  np.testing.assert_allclose(aux2["dual_clip_frac"], 0.25)


@pytest.mark.slow  # > 6 s on the 2-core CPU: full suite only
def test_padding_and_masks_change_nothing():
  key = jax.random.key(13)
  logp = -jax.random.uniform(key, (3, 4, 5))
  old = logp + 0.1 * jax.random.normal(jax.random.key(14), logp.shape)
  mask = (jnp.arange(5)[None, None] < jax.random.randint(jax.random.key(15), (3, 4, 1), 1, 6))
  adv = jax.random.normal(jax.random.key(16), (3, 4))
  pad = lambda x, v: jnp.concatenate([x, jnp.full(x.shape[:-1] + (3,), v, x.dtype)], -1)
  for agg in ("seq_mean_token_mean", "token_mean"):
    a, _ = grpo.policy_loss(logp, old, mask, adv, agg=agg)
    b, _ = grpo.policy_loss(pad(logp, 7.0), pad(old, -3.0), pad(mask, False), adv, agg=agg)
    np.testing.assert_allclose(a, b, rtol=1e-6)
  np.testing.assert_allclose(common.sequence_scores(pad(logp, 9.0), pad(mask, False)),
                             common.sequence_scores(logp, mask), rtol=1e-6)


def test_empty_sequences_are_zero_not_nan():
  mask = jnp.zeros((2, 3))
  assert (common.sequence_scores(jnp.ones((2, 3)), mask) == 0).all()
  loss, _ = grpo.policy_loss(jnp.zeros((2, 3)), jnp.zeros((2, 3)), mask, jnp.ones(2))
  assert jnp.isfinite(loss) and loss == 0


def test_token_mean_is_invariant_to_micro_batching():
  # Splitting a batch in two and weighting each half's token_mean by its token
  # count gives the whole batch's token_mean; seq_mean_token_mean by sequences.
  logp = -jax.random.uniform(jax.random.key(17), (4, 6))
  mask = jnp.arange(6)[None] < jnp.array([[6], [2], [4], [5]])
  adv = jnp.array([1.0, -1.0, 0.5, -0.5])
  whole, _ = grpo.policy_loss(logp, logp, mask, adv, agg="token_mean")
  parts = [grpo.policy_loss(logp[s], logp[s], mask[s], adv[s], agg="token_mean")[0] * mask[s].sum()
           for s in (slice(0, 2), slice(2, 4))]
  np.testing.assert_allclose(whole, sum(parts) / mask.sum(), rtol=1e-6)
  whole, _ = grpo.policy_loss(logp, logp, mask, adv)
  parts = [grpo.policy_loss(logp[s], logp[s], mask[s], adv[s])[0] for s in (slice(0, 2), slice(2, 4))]
  np.testing.assert_allclose(whole, sum(parts) / 2, rtol=1e-6)


def test_gspo_gpg_by_hand():
  # GSPO: sequence ratios exp(mean log-ratio): seq0 exp(0.0002) inside the clip band,
  # seq1 exp(0.1) = 1.10517 clipped to 1.0004 with A = +1 -> min(1.10517, 1.0004) = 1.0004.
  logp = jnp.array([[0.0003, 0.0001], [0.1, 0.1]])
  adv = jnp.array([-1.0, 1.0])
  loss, aux = grpo.gspo_loss(logp, jnp.zeros((2, 2)), jnp.ones((2, 2)), adv)
  np.testing.assert_allclose(loss, -(-np.exp(0.0002) + 1.0004) / 2, atol=1e-6)
  np.testing.assert_allclose(aux["clip_frac"], 0.5)
  # GPG: two groups of 2, one degenerate: B = 4, M = 2 -> scale 2.
  # A = (0.5, -0.5, 0, 0) * 2; loss = -mean_t(A l) with l = -1 everywhere = (1 - 1 + 0 + 0)/4 = 0.
  rewards = jnp.array([[1.0, 0.0], [1.0, 1.0]])
  np.testing.assert_allclose(grpo.gpg_scale(rewards), 2.0)
  l = jnp.array([[[-1.0], [-2.0]], [[-1.0], [-1.0]]])
  loss, _ = grpo.gpg_loss(l, jnp.ones_like(l), rewards)
  # -(1 * -1 + -1 * -2 + 0 + 0) / 4 = -0.25
  np.testing.assert_allclose(loss, -0.25, atol=1e-6)


@pytest.mark.parametrize("which", ["ppo", "ppo_dual", "gspo", "gpg", "flowrl"])
def test_policy_losses_check_grads(x64, which):
  from dmpo_jax.objectives import flowrl

  logp = -jax.random.uniform(jax.random.key(18), (2, 3, 4), jnp.float64, 0.1, 2.0)
  old = logp + 0.05 * jax.random.normal(jax.random.key(19), logp.shape, jnp.float64)
  mask = jnp.ones_like(logp).at[:, :, -1].set(0)
  rewards = jax.random.uniform(jax.random.key(20), (2, 3), jnp.float64)
  adv = grpo.group_advantages(rewards)
  fns = {
      "ppo": lambda l: grpo.policy_loss(l, old, mask, adv, eps_low=0.5, eps_high=0.5)[0],
      "ppo_dual": lambda l: grpo.policy_loss(l, old, mask, adv, eps_low=0.5, eps_high=0.5,
                                             dual_clip=3.0)[0],
      "gspo": lambda l: grpo.gspo_loss(l, old, mask, adv, eps_low=0.5, eps_high=0.5)[0],
      "gpg": lambda l: grpo.gpg_loss(l, mask, rewards)[0],
      "flowrl": lambda l: flowrl.flowrl_loss(
          common.sequence_scores(l, mask), common.sequence_scores(old, mask) - 0.1,
          # phi_old far below phi: the stop-gradient weight sits at its clip (1.2),
          # so finite differences see it constant, as autodiff does.
          common.sequence_scores(l, mask) - 1.0, rewards, jnp.array([0.3, -0.2]))[0],
  }
  check_grads(fns[which], (logp,), order=1, modes=("fwd", "rev"))


def test_kl_estimators(x64):
  l = jnp.array([-1.0, -2.0, -0.5])
  r = jnp.array([-1.5, -2.0, -3.0])
  np.testing.assert_allclose(kl.k1(l, r), [0.5, 0.0, 2.5])
  np.testing.assert_allclose(kl.k2(l, r), [0.125, 0.0, 3.125])
  # k3 = exp(r - l) - (r - l) - 1: exp(-0.5) + 0.5 - 1 = 0.106531
  np.testing.assert_allclose(kl.k3(l, r)[0], np.exp(-0.5) - 0.5, atol=1e-12)
  assert float(kl.k3(jnp.array(0.0), jnp.array(100.0))) == 10.0  # clamped value
  # The k3 gradient w.r.t. l is unbiased for KL(pi || ref): E_pi[d k3/d l] ... checked numerically.
  check_grads(lambda a: kl.k3(a, r).sum(), (l,), order=1, modes=("fwd", "rev"))


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_token_logprobs_chunked_equals_full():
  logits = jax.random.normal(jax.random.key(21), (2, 8, 11))
  tokens = jax.random.randint(jax.random.key(22), (2, 8), 0, 11)
  full = jax.nn.log_softmax(logits / 0.7)[jnp.arange(2)[:, None], jnp.arange(8), tokens]
  np.testing.assert_allclose(common.token_logprobs(logits, tokens, temperature=0.7), full,
                             atol=1e-6)
  np.testing.assert_allclose(common.token_logprobs(logits, tokens, temperature=0.7, chunk=4),
                             full, atol=1e-6)
  f = lambda lg, c: common.token_logprobs(lg, tokens, chunk=c).sum()
  grad = jax.jit(jax.grad(f), static_argnums=1)
  np.testing.assert_allclose(grad(logits, 2), grad(logits, None), atol=1e-6)


def test_dapo_helpers():
  # Lmax 20, cache 4: free up to 16; 18 -> (16 - 18) / 4 = -0.5; 25 -> -1.
  np.testing.assert_allclose(dapo.overlong_penalty([10, 16, 18, 20, 25], 20, 4),
                             [0, 0, -0.5, -1.0, -1.0])
  keep = dapo.dynamic_sampling_keep([[1, 1], [0, 1], [0, 0]])
  assert keep.tolist() == [False, True, False]


def test_shape_rewards_applies_overlong_penalty_and_masks_groups():
  obj = presets.objective_config("dapo", overlong_cache=4)
  rewards = np.array([[1.0, 0.5], [0.2, 0.1], [0.0, 0.3]], np.float32)
  lengths = np.array([[10, 18], [20, 3], [16, 25]])
  feasible = np.array([[1, 1], [0, 1], [0, 0]], bool)
  shaped, keep = shaping.shape_rewards(obj, rewards, lengths, feasible, max_len=20)
  np.testing.assert_allclose(shaped, [[1.0, 0.0], [-0.8, 0.1], [0.0, -0.7]], rtol=1e-6)
  assert keep.tolist() == [False, True, False]  # all right or all wrong: masked out
  shaped, keep = shaping.shape_rewards(presets.objective_config("grpo"), rewards, lengths,
                                       feasible, max_len=20)
  assert keep is None and shaped is rewards  # no shaping configured: untouched
  assert dapo.dynamic_sampling_keep is shaping.dynamic_sampling_keep  # the old name still works


def test_kl_in_reward_subtracts_the_sampled_log_ratio():
  old = jnp.array([[[-1.0, -2.0], [-0.5, -0.5]]])  # [1, G=2, T=2]
  ref = jnp.array([[[-1.5, -1.0], [-0.5, -1.5]]])
  mask = jnp.array([[[1, 1], [1, 0]]], jnp.float32)
  out = shaping.kl_in_reward(jnp.array([[1.0, 2.0]]), old, ref, mask, 0.1)
  np.testing.assert_allclose(out, [[1.0 - 0.1 * (0.5 - 1.0), 2.0 - 0.1 * 0.0]], rtol=1e-6)
  cfg = presets.objective_config("rkl", kl_in_reward=True)
  np.testing.assert_allclose(presets.kl_penalised_rewards(cfg, jnp.array([[1.0, 2.0]]), old, ref, mask),
                             [[1.0 + 0.01 * 0.5, 2.0]], rtol=1e-6)


# ------------------------------------------------------------------- registries

def test_unknown_names_list_the_choices():
  with pytest.raises(ValueError, match=r"unknown advantage estimator objective.advantage='ppo'; "
                                       r"choose one of \['dr_grpo', 'grpo', 'passk', 'pkpo', 'psr_nsr', 'rloo'\]"):
    presets.objective_config("grpo", advantage="ppo")
  with pytest.raises(ValueError, match=r"unknown policy loss objective.policy_loss='ppo'.*'none'"):
    presets.objective_config("grpo", policy_loss="ppo")
  with pytest.raises(ValueError, match=r"unknown KL estimator objective.kl_estimator='k4'.*'k3'"):
    presets.objective_config("rkl", kl_estimator="k4")
  with pytest.raises(ValueError, match="already registered"):
    terms.POLICY_LOSSES.register("ppo_clip")(lambda cfg, x: None)


def test_advantages_dispatch_to_the_named_estimator():
  r = jnp.array([[1.0, 0.0, 0.5, 0.5]])
  for name, want in (("grpo", grpo.group_advantages(r)), ("dr_grpo", grpo.dr_grpo_advantages(r)),
                     ("rloo", grpo.rloo_advantages(r))):
    np.testing.assert_allclose(presets.advantages(presets.objective_config("grpo", advantage=name), r),
                               want, rtol=1e-6)


def test_objectives_declare_what_their_batch_needs():
  needs = {n: (presets.needs_reference(c), presets.needs_log_z(c), presets.needs_dph_store(c))
           for n, c in ((n, presets.objective_config(n)) for n in presets.preset_names())}
  assert needs["rkl"] == (True, False, False) and needs["flowrl"] == (True, True, False)
  assert needs["dph_js"] == (False, False, True) and needs["dmpo"] == (False, False, False)
  assert presets.needs_reference(presets.objective_config("grpo", kl_coef=0.1))


def test_a_registered_policy_loss_trains_without_other_edits():
  reg = registry.Registry("thing", "objective.thing")
  reg.register("a")(len)
  assert reg.get("a") is len and reg.names() == ["a"] and "a" in reg
  name = "test_ratio_pg"
  if name not in terms.POLICY_LOSSES:
    @terms.POLICY_LOSSES.register(name, slice_exact=True)
    def _ratio_pg(cfg, x):
      ratio = jnp.exp(x.logprobs - x.old_logprobs)
      return -common.aggregate(ratio * x.advantages[..., None], x.mask), {"ratio": jnp.mean(ratio)}
  cfg = presets.objective_config("grpo", policy_loss=name)
  assert presets.slice_exact(cfg)
  theta = jnp.array([0.1, -0.3, 0.5, 0.0])
  lp_fn = lambda t, seqs: {"logprobs": jax.nn.log_softmax(t)[seqs][..., None]}
  seqs = jnp.array([[0, 1, 2, 2]])
  batch = {"seqs": seqs, "mask": jnp.ones((1, 4, 1)), "old_logprobs": lp_fn(theta, seqs)["logprobs"],
           "rewards": jnp.array([[1.0, 0, 0.5, 0.5]])}
  loss, m = presets.build_loss(cfg, lp_fn)(theta, batch)
  np.testing.assert_allclose(m["pg_ratio"], 1.0, rtol=1e-6)
  assert float(loss) == pytest.approx(0.0, abs=1e-6)  # ratio 1, advantages with mean 0


def test_none_policy_loss_leaves_only_the_other_terms():
  theta = jnp.array([0.1, -0.3, 0.5, 0.0])
  lp_fn = lambda t, seqs: {"logprobs": jax.nn.log_softmax(t)[seqs][..., None]}
  seqs = jnp.array([[0, 1, 2, 2], [3, 3, 1, 0]])
  batch = {"seqs": seqs, "mask": jnp.ones((2, 4, 1)), "old_logprobs": lp_fn(theta, seqs)["logprobs"],
           "rewards": jnp.array([[1.0, 0, 0.5, 0.5], [0, 0, 1, 1]])}
  dm_only = presets.objective_config("dmpo", policy_loss="none")
  loss, m = presets.build_loss(dm_only, lp_fn)(theta, batch)
  assert float(m["pg_loss"]) == 0.0
  np.testing.assert_allclose(loss, 0.5 * m["dm_loss"], rtol=1e-6)
  g = jax.grad(lambda t: presets.build_loss(dm_only, lp_fn)(t, batch)[0])(theta)
  g_dm = jax.grad(lambda t: 0.5 * presets.build_loss(dm_only, lp_fn)(t, batch)[1]["dm_loss"])(theta)
  np.testing.assert_allclose(g, g_dm, rtol=1e-6)
  assert float(jnp.abs(g).sum()) > 0  # DMPO's term alone still trains


# ------------------------------------------------------------------- presets

@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_presets_and_builder():
  assert set(presets.preset_names()) >= {"grpo", "dr_grpo", "dapo", "gspo", "gpg", "flowrl",
                                         "dmpo", "dph_f", "dph_js", "dph_alpha", "rkl"}
  with pytest.raises(ValueError, match="unknown preset 'ppo'.*dmpo"):
    presets.objective_config("ppo")
  with pytest.raises(ValueError, match=r"unknown objective field\(s\) \['dm_coeff'\]"):
    presets.objective_config("dmpo", dm_coeff=1.0)
  with pytest.raises(ValueError, match="unknown divergence"):
    presets.objective_config("dph_f", divergence="fkl")

  theta = jnp.array([0.1, -0.3, 0.5, 0.0])
  lp_fn = lambda t, seqs: {"logprobs": jax.nn.log_softmax(t)[seqs][..., None],
                           "log_z": jnp.zeros(seqs.shape[:-1])}
  seqs = jnp.array([[0, 1, 2, 2], [3, 3, 1, 0]])
  logp = jax.nn.log_softmax(theta)[seqs][..., None]
  batch = {"seqs": seqs, "mask": jnp.ones((2, 4, 1)), "old_logprobs": logp,
           "ref_logprobs": logp - 0.1, "rewards": jnp.array([[1.0, 0, 0.5, 0.5], [0, 0, 1, 1]]),
           "dph_seqs": jnp.array([[0], [2]]).reshape(2), "dph_ref_logprobs": logp[0, :2],
           "dph_mask": jnp.ones((2, 1)),
           # what the baselines' terms declare (presets.batch_needs)
           "answer": seqs.astype(jnp.int32), "rl_step": jnp.zeros((2,), jnp.int32),
           "key": jax.random.key_data(jax.random.split(jax.random.key(0), 2))}
  grpo_loss, m = presets.build_loss(presets.objective_config("grpo"), lp_fn)(theta, batch)
  dmpo_loss, m2 = presets.build_loss(presets.objective_config("dmpo"), lp_fn)(theta, batch)
  np.testing.assert_allclose(dmpo_loss, grpo_loss + 0.5 * m2["dm_loss"], rtol=1e-6)
  for key in ("clip_frac", "kl_k1", "kl_k2", "kl_k3", "dm_loss", "dm_pq_argmax_agree"):
    assert key in m2, key
  for name in presets.preset_names():
    full = presets.build_loss(presets.objective_config(name), lp_fn)
    (loss, metrics), g = jax.jit(jax.value_and_grad(lambda t: full(t, batch), has_aux=True))(theta)
    assert jnp.isfinite(loss) and jnp.all(jnp.isfinite(g)), name
    if name.startswith("dph"):
      assert "divergence" in metrics


# ---------------------------------------------------------- the miniature

REWARDS = [1.0, 1.0, 1.0, 0.5, 0.2, 0.0]  # three optima (0, 1, 2)
SEEDS = 8  # jax.random.split(jax.random.key(0), 8)


def _run(preset, init_probs, steps, **overrides):
  cfg = presets.objective_config(preset, **overrides)
  fn = miniature.train(cfg, REWARDS, jnp.log(jnp.array(init_probs)), steps=steps, lr=0.05)
  final, _ = jax.vmap(fn)(jax.random.split(jax.random.key(0), SEEDS))
  return np.asarray(final)


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_mode_collapse_in_miniature():
  # GRPO from a reference that prefers optimum 0 (0.3 vs 0.03, 0.03): rich get
  # richer, optimum 0 ends with > 85% of all mass in every seed.
  skewed = [0.3, 0.03, 0.03, 0.24, 0.2, 0.2]
  g = _run("grpo", skewed, 300)
  assert (g[:, 0] > 0.85).all(), g[:, :3]
  # Forward-KL rehearsal (eta 0.5) on stored correct reference samples keeps
  # the optima the reference solved alive: mean min-optimum mass at least 2x GRPO's.
  f = _run("dph_f", skewed, 300, div_coef=0.5)
  assert f[:, :3].min(1).mean() > 2 * g[:, :3].min(1).mean(), (f[:, :3], g[:, :3])
  # From an even start over the optima, DMPO keeps every optimum above 0.2 in
  # every seed after 400 steps; GRPO lets at least one seed fall below it.
  even = [0.1, 0.1, 0.1, 0.25, 0.25, 0.2]
  d = _run("dmpo", even, 400)
  g2 = _run("grpo", even, 400)
  assert (d[:, :3].min(1) > 0.2).all(), d[:, :3]
  assert (g2[:, :3].min(1) < 0.2).any(), g2[:, :3]
  assert d[:, :3].sum(1).min() > 0.95 and g2[:, :3].sum(1).min() > 0.95  # both solve it


@pytest.mark.slow  # > 7 s on the 2-core CPU: full suite only
def test_flowrl_log_z_head_learns_the_partition_function():
  # With phi = phi_ref and equal weights, the TB residual is log Z + 0 - beta r_hat:
  # r_hat has mean 0 per group, so the optimal log Z is 0 for every prompt, and
  # the head (zero output at init, w2 = 0) must move towards it from an offset.
  from dmpo_jax.objectives import flowrl

  head = flowrl.init_log_z_head(jax.random.key(0), 8)
  head["b2"] = jnp.array([2.0])
  hidden = jax.random.normal(jax.random.key(1), (3, 5, 8))
  mask = jnp.ones((3, 5))
  rewards = jax.random.uniform(jax.random.key(2), (3, 4))
  phi = -jnp.ones((3, 4))

  def loss(h):
    return flowrl.flowrl_loss(phi, phi, phi, rewards, flowrl.log_z_head(h, hidden, mask))[0]

  before, grad = loss(head), jax.jit(jax.grad(loss))
  for _ in range(100):
    g = grad(head)
    head = jax.tree.map(lambda p, d: p - 0.05 * d, head, g)
  assert float(jnp.max(jnp.abs(flowrl.log_z_head(head, hidden, mask)))) < 0.1
  assert float(loss(head)) < float(before)
