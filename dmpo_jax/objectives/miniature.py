"""Mode collapse in miniature: a softmax policy over N one-token "solutions".

Several solutions share the top reward. The policy samples groups of G,
gets rewards, and is trained with the real loss builder of `presets`
(GRPO, DMPO, DPH-RL forward KL, ...). The whole training run is one jitted
function of a PRNG key (PureJaxRL style), so seeds are a `vmap` away.
Used by the tests and the mode_collapse notebook.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from dmpo_jax.objectives import presets


def train(cfg: presets.ObjectiveConfig, rewards, init_logits, *, steps: int = 300,
          groups: int = 4, group_size: int = 8, lr: float = 0.05, dph_samples: int = 16,
          dph_correct=None):
  """Returns a jitted fn(key) -> (final probs [N], probs over training [steps, N]).

  rewards [N]: reward of each solution. init_logits [N]: the initial (and
  reference) policy. dph_correct [N] bool: which solutions count as correct
  for the DPH-RL stored reference samples and for objective.reward="correct"
  (default: reward == max, the optima). The batch carries what the objective
  declares (`presets.needs(cfg).batch`): the solution id as the final answer, one
  PRNG key per group, the step. Objectives with a host reward-shaping term
  (outcome_ucb's counts) cannot run inside one jitted function and are refused.
  """
  need = presets.needs(cfg)
  if need.host_state:
    raise ValueError(f"objective.shaping={cfg.shaping!r} keeps host state across steps (counts "
                     "per prompt); the jitted miniature runs on-device terms only")
  needs = need.batch
  rewards = jnp.asarray(rewards, jnp.float32)
  init_logits = jnp.asarray(init_logits, jnp.float32)
  ref_logp = jax.nn.log_softmax(init_logits)
  if dph_correct is None:
    dph_correct = rewards == rewards.max()
  dph_correct = jnp.asarray(dph_correct)
  train_rewards = dph_correct.astype(jnp.float32) if cfg.reward == "correct" else rewards

  def logprob_fn(theta, seqs):  # seqs: solution ids [..., G] -> one-token sequences
    return {"logprobs": jax.nn.log_softmax(theta)[seqs][..., None]}

  loss_fn = presets.build_loss(cfg, logprob_fn)
  opt = optax.adam(lr)

  def run(key):
    # Stored reference samples for DPH-RL: correct answers drawn from pi_ref.
    key, k_ref = jax.random.split(key)
    ref_masked = jnp.where(dph_correct, ref_logp, -jnp.inf)
    dph = jax.random.categorical(k_ref, ref_masked, shape=(dph_samples,))

    def step(carry, xs):
      key, t = xs
      theta, opt_state = carry
      logp = jax.nn.log_softmax(theta)
      seqs = jax.random.categorical(key, logp, shape=(groups, group_size))
      batch = {
          "seqs": seqs, "mask": jnp.ones(seqs.shape + (1,)),
          "old_logprobs": jax.lax.stop_gradient(logp[seqs][..., None]),
          "ref_logprobs": ref_logp[seqs][..., None], "rewards": train_rewards[seqs],
          "dph_seqs": dph, "dph_ref_logprobs": ref_logp[dph][..., None],
          "dph_mask": jnp.ones((dph_samples, 1)),
      }
      extras = {"answer": seqs.astype(jnp.int32),
                "key": jax.random.key_data(jax.random.split(jax.random.fold_in(key, 1), groups)),
                "rl_step": jnp.full((groups,), t, jnp.int32)}
      batch.update({k: extras[k] for k in needs})
      grads = jax.grad(lambda t: loss_fn(t, batch)[0])(theta)
      updates, opt_state = opt.update(grads, opt_state, theta)
      theta = optax.apply_updates(theta, updates)
      return (theta, opt_state), jax.nn.softmax(theta)

    (theta, _), history = jax.lax.scan(step, (init_logits, opt.init(init_logits)),
                                       (jax.random.split(key, steps), jnp.arange(steps)))
    return jax.nn.softmax(theta), history

  return jax.jit(run)
