"""What an objective needs from the trainer, declared by its terms (`presets.needs` combines them).

Each registered term (advantage estimator, policy loss, regulariser, reward-shaping term)
declares a `Needs` for its settings; the objective's is their union (`a | b`), and the
trainer asks that one value instead of asking about terms:

  batch        batch keys beyond the RL samples ("answer", "key", "rl_step"; rollout.py
               supplies exactly these)
  reference    the reference policy's log-probs (batch["ref_logprobs"]); the trainer keeps
               and checkpoints the RL start policy
  log_z        a learned log Z(x) head in the params (params["log_z"])
  dph_store    DPH-RL's stored reference samples (a pre-sampling stage, training/dph.py,
               and the batch's "dph_*" keys)
  slice_exact  the loss is a mean over sequences and prompt groups, so gradient accumulation
               over slices of whole groups changes only summation order (all terms must agree)
  correct      the rollouts flag correct samples (objective.reward="correct")
  host_state   a host reward-shaping term keeps state over training (saved in checkpoints)
  min_group    (smallest group size, why) pairs; `group_error(G)` names the first one G fails
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Needs:
  batch: tuple[str, ...] = ()
  reference: bool = False
  log_z: bool = False
  dph_store: bool = False
  slice_exact: bool = True
  correct: bool = False
  host_state: bool = False
  min_group: tuple[tuple[int, str], ...] = ()

  def __or__(self, other: Needs) -> Needs:
    """Both terms' needs: the union of batch keys and flags; exact only if both are."""
    return Needs(batch=tuple(sorted(set(self.batch) | set(other.batch))),
                 reference=self.reference or other.reference, log_z=self.log_z or other.log_z,
                 dph_store=self.dph_store or other.dph_store,
                 slice_exact=self.slice_exact and other.slice_exact,
                 correct=self.correct or other.correct,
                 host_state=self.host_state or other.host_state,
                 min_group=self.min_group + other.min_group)

  def group_error(self, group_size: int) -> str | None:
    """The message for the first group-size requirement `group_size` fails, else None."""
    for size, why in self.min_group:
      if group_size < size:
        return f"config.rl.group_size={group_size}: {why}"
    return None
