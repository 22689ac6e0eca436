"""The comparison that invariance tests use for parameters after Adam (tests/helpers.py): it
passes float32 reordering noise amplified by Adam on a single element, and fails the bugs it
exists to catch, which move whole tensors."""

import numpy as np
import pytest

from tests.helpers import ADAM_STEP_BOUND, assert_adam_close

LR = 3e-4


def _params(seed=0):
  rng = np.random.default_rng(seed)
  return {"w": rng.normal(0, 0.02, (64, 64)).astype(np.float32),
          "norm": np.ones(32, np.float32) + rng.normal(0, 0.01, 32).astype(np.float32)}


def test_reordering_noise_passes():
  a, b = _params(), _params()
  b["w"] = b["w"] * (1 + 1e-7)  # reordering noise in every element
  b["w"][3, 5] -= 2 * LR  # one near-zero gradient flipped sign: a whole Adam step each way
  b["norm"][7] += 1.5e-6  # and one small tensor's element (the failure seen on an AMD EPYC)
  assert_adam_close(a, b, lr_sum=LR)


@pytest.mark.parametrize("bug", ["lost_state", "wrong_shard", "reset_tensor", "few_elements",
                                 "beyond_ceiling"])
def test_real_bugs_fail(bug):
  a, b = _params(), _params()
  if bug == "lost_state":  # every element's update off by a fraction of a step
    b["w"] += 0.1 * LR * np.sign(np.random.default_rng(1).normal(size=b["w"].shape))
  elif bug == "wrong_shard":  # two shards of a tensor swapped
    b["w"] = np.concatenate([b["w"][32:], b["w"][:32]])
  elif bug == "reset_tensor":  # a small tensor back at its start
    b["norm"] = np.ones(32, np.float32)
  elif bug == "few_elements":  # 5 of 4,096 elements: more than 0.1% of the tensor
    b["w"].reshape(-1)[:5] += LR
  else:  # one element further than two Adam trajectories can part
    b["w"][0, 0] += 2.5 * ADAM_STEP_BOUND * LR
  with pytest.raises(AssertionError):
    assert_adam_close(a, b, lr_sum=LR)
