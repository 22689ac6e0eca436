"""Reward terms that pay for rare answers (docs/METHODS.md, exploration rewards).

- Unlikeliness reward (He et al., "Rewarding the Unlikely: Lifting GRPO Beyond
  Distribution Sharpening", arXiv 2506.02355): a correct sample's reward is
  lowered by its likelihood rank in the group, so that GRPO's advantage no
  longer favours the correct answers the policy already prefers.
- Outcome-based exploration (Song, Kempe and Munos, "Outcome-based
  Exploration for LLM Reasoning", arXiv 2509.06941), on final answers (for an
  NP task: the verdict's canonical solution, as an integer id):
  batch exploration penalises answers repeated within a group (on device);
  historical exploration adds a UCB bonus for answers rarely seen on this
  prompt over training (`UcbCounts`, host state saved in checkpoints).

Device terms map rewards [..., G] to rewards [..., G]; answer ids [..., G]
are int32 (-1: no parseable answer).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dmpo_jax.objectives import common


def unlikeliness_rewards(rewards, old_logprobs, mask, penalty: float = 0.25):
  """r_i (1 - penalty rank_i / G), rank_i the ascending rank (0 = least likely) of the sample's
  mean token log-prob under pi_old within its group [..., G].

  As the authors' code does: ranks over the whole group (ties by position), the mean
  (length-normalised) log-prob, and the multiplier applied to every reward, which leaves the
  wrong samples (reward 0) at 0. The most likely correct sample keeps 1 - penalty (G-1)/G of its
  reward, the least likely all of it.
  """
  if not 0.0 <= penalty < 1.0:
    raise ValueError(f"objective.unlikely_penalty={penalty} must be in [0, 1)")
  g = rewards.shape[-1]
  phi = common.sequence_scores(old_logprobs, mask)  # [..., G]
  rank = jnp.argsort(jnp.argsort(phi, axis=-1, stable=True), axis=-1, stable=True)
  return rewards * (1.0 - penalty * rank.astype(jnp.float32) / g)


def repeats_in_group(answers):
  """How many OTHER samples of the group share each sample's answer id [..., G] (float32); a
  sample without an answer (id < 0) counts as repeating nothing."""
  same = (answers[..., :, None] == answers[..., None, :]) & (answers[..., None, :] >= 0)
  others = jnp.sum(same, axis=-1) - 1
  return jnp.where(answers >= 0, others, 0).astype(jnp.float32)


def batch_exploration_rewards(rewards, answers, coef: float):
  """Batch exploration: r_i - coef * (1/G) #{j != i : a_j = a_i}. A group of G distinct answers
  is unchanged; G copies of one answer each lose coef (G-1)/G."""
  return rewards - coef * repeats_in_group(answers) / rewards.shape[-1]


class UcbCounts:
  """Historical exploration's counts N(x, a): how often answer a was sampled on prompt x.

  State is a JSON-able dict {prompt id: {answer id: count}} (string keys), kept in the train
  state's counters and so saved in every checkpoint and restored exactly on resume. `bonus`
  first adds the step's answers to the counts, then pays coef / sqrt(N(x, a_i)) (at most coef,
  on the first sighting); samples without an answer get no bonus and are not counted.
  """

  def __init__(self, state: dict):
    self.state = state

  def bonus(self, prompts, answers, coef: float) -> np.ndarray:
    """prompts [P] str ids, answers [P, G] int ids -> bonus [P, G] float32."""
    answers = np.asarray(answers)
    out = np.zeros(answers.shape, np.float32)
    for p, row in zip(prompts, answers):
      seen = self.state.setdefault(str(p), {})
      for a in row:
        if a >= 0:
          seen[str(int(a))] = seen.get(str(int(a)), 0) + 1
    for i, (p, row) in enumerate(zip(prompts, answers)):
      seen = self.state[str(p)] if str(p) in self.state else {}
      for j, a in enumerate(row):
        if a >= 0:
          out[i, j] = coef / np.sqrt(seen[str(int(a))])
    return out
