"""Rollout collection: prompts -> sampled completions -> scored, shaped rewards, as one typed batch.

`collect_rollouts` samples G completions of each prompt in `chunks` pieces:
while the host decodes and verifies piece c, the device already samples
piece c + 1 (and computes piece c's reference log-probs), so scoring does
not stall the device. The result, `Rollouts`, holds the device arrays the
update reads and the host arrays the logs read.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from dmpo_jax.parallel import distributed as dist
from dmpo_jax.training import steps
from dmpo_jax.data import pipeline
from dmpo_jax.objectives import presets, shaping
from dmpo_jax import sampling


LOSS_KEY_STREAM = 10**6  # the loss's PRNG keys of a step: fold_in(the step's sampling key, this)


@dataclasses.dataclass
class Rollouts:
  """One RL step's samples: P prompts x G completions of T = completion_len tokens."""
  items: list                     # the P (task key, instance) pairs
  seqs: dict                      # device: "tokens" [P, G, prompt_len + T], "prompt_mask" [P, G, prompt_len]
  completion_mask: np.ndarray     # [P, G, T]; 0 throughout the groups dynamic sampling drops
  old_logprobs: jax.Array         # [P, G, T] the sampler's (pi_old)
  ref_logprobs: jax.Array | None  # [P, G, T] the reference policy's, if the objective reads it
  rewards: np.ndarray             # [P, G] after shaping
  lengths: np.ndarray             # [P, G] completion lengths (tokens)
  stats: dict                     # host scoring: ratio, feasible [P, G]; distinct, solution_entropy [P]
                                  # (+ optimal [P, G] and pipeline.COLLAPSE_STATS [P] with collapse)
  sample_s: float                 # wall time of sampling not overlapped by host scoring
  score_s: float                  # host decoding, verifying and shaping
  images: dict | None = None      # host: image prompts (`qwen2_5_vl.prompt_images`, [P, ...])
  extras: dict = dataclasses.field(default_factory=dict)
  # host: the batch keys the objective declares (`presets.needs(obj).batch`): "answer" [P, G] int32,
  # "key" [P, 2] uint32 PRNG key data, "rl_step" [P] int32

  def batch(self, data_sh) -> dict:
    """The update's input (see `objectives.presets`), on the mesh."""
    seqs = self.seqs if self.images is None else dict(
        self.seqs, images=dist.tree_to_global(self.images, data_sh))
    out = {"seqs": seqs, "mask": dist.to_global(self.completion_mask, data_sh),
           "old_logprobs": self.old_logprobs, "rewards": dist.to_global(self.rewards, data_sh)}
    if self.ref_logprobs is not None:
      out["ref_logprobs"] = self.ref_logprobs
    out.update({k: dist.to_global(v, data_sh) for k, v in self.extras.items()})
    return out

  def metrics(self) -> dict:
    """The step's logged rollout scalars."""
    out = {"reward_mean": float(self.rewards.mean()),
           "qr_mean": float(np.mean(np.minimum(self.stats["ratio"], 10))),
           "feasible": float(self.stats["feasible"].mean()),
           "distinct": float(self.stats["distinct"].mean()),
           "solution_entropy": float(self.stats["solution_entropy"].mean()),
           "length": float(self.lengths.mean())}
    if "correct" in self.stats:  # objective.reward="correct": the share of correct samples
      out["correct"] = float(self.stats["correct"].mean())
    for k in pipeline.COLLAPSE_STATS:  # with collapse: means over groups of supported tasks
      if k in self.stats:
        v = self.stats[k][~np.isnan(self.stats[k])]
        out[k] = float(v.mean()) if v.size else float("nan")
    return out


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
  """What every RL step's rollouts share (made once per run, `Run.rollout_spec`)."""
  group_size: int                     # G completions of each prompt
  chunks: int                         # pieces sampled one while the host scores the last
  prompt_len: int                     # the prompts' padded length (tokens)
  completion_len: int                 # T
  reward_cfg: Any                     # the verifier's rewards (`domain.RewardConfig`)
  objective: presets.ObjectiveConfig  # its shaping fields; what its terms declare
  data_sh: Any                        # batch rows over the mesh
  collapse: pipeline.Collapse | None = None  # also score each group's optima (collapse_stats)
  images: Callable | None = None      # image prompts: images(items, prompt_tokens, prompt_mask)


def collect_rollouts(sampler, params, items, encoder: pipeline.PromptEncoder, *, spec: RolloutSpec,
                     rng, ref_fn: Callable | None = None, rl_step: int = 0,
                     shaping_state: dict | None = None) -> Rollouts:
  """Sample, score and shape G = spec.group_size completions of each of `items`.

  What the objective's terms declare comes with the rollouts: the verifier's correct flag
  (objective.reward="correct"), final-answer ids, a PRNG key per prompt (from `rng`'s
  LOSS_KEY_STREAM), the RL step `rl_step`; shaping_state: the state of a host reward-shaping
  term (`presets.needs(spec.objective).host_state`), updated in place.

  spec.images: for image prompts, images(items, prompt_tokens [P, prompt_len], prompt_mask) ->
  the prompts' `qwen2_5_vl.prompt_images` arrays (host, one fixed patch budget); they go to the
  sampler, to ref_fn's seqs and to the update's batch (seqs["images"]).

  sampler: `sampling.make_sampler`'s; ref_fn(seqs) -> reference log-probs [B, T] (None when the
  objective reads no reference).
  """
  t0 = time.time()
  P, G = len(items), spec.group_size
  prompt_len, completion_len, objective = spec.prompt_len, spec.completion_len, spec.objective
  prompt_tokens, prompt_mask = sampling.pad_prompts([encoder.encode(k, q) for k, q in items],
                                                 prompt_len, encoder.pad)  # [P, prompt_len]
  vis = None if spec.images is None else spec.images(items, prompt_tokens, prompt_mask)
  need = presets.needs(objective)
  needs, host_term = need.batch, need.host_state
  scoring = {"correct": objective.correct if need.correct else None,
             "answers": "answer" in needs or host_term}
  tokens, mask, old_lp, ref_lp, rewards, stats, host_s = _sample_and_score(
      spec, sampler, params, items, encoder, (prompt_tokens, prompt_mask, vis), rng, ref_fn, scoring)
  pt, pm = np.repeat(prompt_tokens, G, 0), np.repeat(prompt_mask, G, 0)  # each sample's prompt
  seqs = {"tokens": jnp.concatenate([dist.to_global(pt, spec.data_sh), tokens], 1).reshape(
              P, G, prompt_len + completion_len),
          "prompt_mask": dist.to_global(pm.reshape(P, G, prompt_len), spec.data_sh)}
  t1 = time.time()
  lengths = mask.sum(-1).reshape(P, G)
  completion_mask = mask.reshape(P, G, completion_len)
  info = ({"prompt": [pipeline.prompt_id(k, q) for k, q in items], "answer": stats["answer"]}
          if host_term else None)
  rewards, keep = shaping.shape_rewards(objective, rewards, lengths, stats["feasible"],
                                        completion_len, correct=stats.get("correct"),
                                        info=info, state=shaping_state)
  extras = {}
  if "answer" in needs:
    extras["answer"] = stats["answer"]
  if "key" in needs:
    keys = jax.random.split(jax.random.fold_in(rng, LOSS_KEY_STREAM), P)
    extras["key"] = np.asarray(jax.random.key_data(keys))
  if "rl_step" in needs:
    extras["rl_step"] = np.full((P,), rl_step, np.int32)
  if keep is not None:  # fixed shapes: dropped groups are masked, not resampled
    completion_mask = completion_mask * keep[:, None, None]
  t2 = time.time()
  as_groups = lambda x: None if x is None else x.reshape(P, G, completion_len)
  return Rollouts(items=items, seqs=seqs, completion_mask=completion_mask,
                  old_logprobs=as_groups(old_lp), ref_logprobs=as_groups(ref_lp), rewards=rewards,
                  lengths=lengths, stats=stats, sample_s=t1 - t0 - host_s, score_s=t2 - t1 + host_s,
                  images=vis, extras=extras)


def _sample_and_score(spec: RolloutSpec, sampler, params, items, encoder, prompts, rng, ref_fn,
                      scoring: dict):
  """The overlapped loop over the padded `prompts` (tokens [P, prompt_len], mask, image inputs
  or None): device tokens [P*G, T], host mask, device old log-probs, device reference
  log-probs (or None), rewards [P, G], stats, host seconds."""
  prompt_tokens, prompt_mask, images = prompts
  G, chunks = spec.group_size, spec.chunks
  per = len(items) // chunks
  piece = lambda x, c: x[c * per:(c + 1) * per]
  pieces = lambda tree, c: None if tree is None else jax.tree.map(lambda x: piece(x, c), tree)
  launch = lambda c: sampler(params, piece(prompt_tokens, c), piece(prompt_mask, c),
                             jax.random.fold_in(rng, c),
                             **({} if images is None else {"images": pieces(images, c)}))
  pending, outs, host_s = launch(0), [], 0.0
  for c in range(chunks):
    tokens, mask, logp = pending
    if c + 1 < chunks:
      pending = launch(c + 1)  # async dispatch: runs while the host scores piece c
    ref = None
    if ref_fn is not None:
      data_sh = tokens.sharding
      per_row = lambda x: np.repeat(piece(x, c), G, 0)  # each sample's prompt
      seqs = {"tokens": jnp.concatenate([dist.to_global(per_row(prompt_tokens), data_sh), tokens], 1),
              "prompt_mask": dist.to_global(per_row(prompt_mask), data_sh)}
      if images is not None:
        seqs["images"] = pieces(images, c)
      ref = ref_fn(seqs)
    tok_h, mask_h = dist.to_host(tokens), dist.to_host(mask)
    h0 = time.time()
    texts = encoder.texts(tok_h, mask_h)
    r, st = pipeline.score_groups(piece(items, c), texts, G, spec.reward_cfg,
                                  collapse=spec.collapse, **scoring)
    host_s += time.time() - h0
    outs.append((tokens, mask_h, logp, ref, r, st))
  cat = lambda i: jnp.concatenate([o[i] for o in outs])
  stats = {k: np.concatenate([o[5][k] for o in outs]) for k in outs[0][5]}
  return (cat(0), np.concatenate([o[1] for o in outs]), cat(2),
          cat(3) if ref_fn is not None else None, np.concatenate([o[4] for o in outs]), stats, host_s)
