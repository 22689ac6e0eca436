"""The finiteness guard of every update (`steps._guarded_update`): its lax.cond form gives
exactly what the per-leaf jnp.where form gave (kept here as the reference), for a finite
update, a non-finite loss, a non-finite gradient, an update whose new params overflow, and a
frozen vision tower."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dmpo_jax.training import steps


def where_guard(opt, loss, grads, params, opt_state, freeze_vision=False):
  """The guard as it was written before the lax.cond form (per-leaf selects)."""
  frozen = steps.frozen_filter(params, freeze_vision)
  if frozen is not None:
    grads = jax.tree_util.tree_map_with_path(
        lambda path, g: jnp.zeros_like(g) if frozen(path) else g, grads)
  finite = jnp.isfinite(loss) & steps._all_finite(grads)
  safe = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)
  updates, new_state = opt.update(safe, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  if frozen is not None:
    new_params = jax.tree_util.tree_map_with_path(
        lambda path, new, old: old if frozen(path) else new, new_params, params)
  finite = finite & steps._all_finite(steps.trained_leaves(new_params, frozen))
  keep = lambda new, old: jnp.where(finite, new, old)
  return (jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_state, opt_state),
          1 - finite.astype(jnp.int32), optax.global_norm(safe))


def tree(key, scale=1.0):
  k = jax.random.split(key, 3)
  return {"model": {"visual": {"w": scale * jax.random.normal(k[0], (3, 4))},
                    "layers": [{"w": scale * jax.random.normal(k[1], (4, 5))},
                               {"b": scale * jax.random.normal(k[2], (5,))}]}}


CASES = {"finite": (0.5, 1.0, 1e-2), "nan_loss": (np.nan, 1.0, 1e-2),
         "inf_grad": (0.5, np.inf, 1e-2), "overflow": (0.5, 1e30, 1e9)}


@pytest.mark.parametrize("freeze_vision", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cond_guard_equals_the_where_guard(case, freeze_vision):
  loss, grad_scale, lr = CASES[case]
  params = tree(jax.random.key(0))
  grads = tree(jax.random.key(1))
  grads["model"]["layers"][0]["w"] = grads["model"]["layers"][0]["w"].at[0, 0].multiply(grad_scale)
  opt = optax.sgd(lr, momentum=0.9)  # no clipping: "overflow" must reach the params
  if case == "overflow":  # finite gradients whose update takes a param past float32's range
    params["model"]["layers"][0]["w"] = params["model"]["layers"][0]["w"].at[0, 0].set(-3e38)
    grads["model"]["layers"][0]["w"] = grads["model"]["layers"][0]["w"].at[0, 0].set(1e30)
  state = opt.init(params)
  got = jax.jit(steps._guarded_update, static_argnums=(0, 5))(opt, jnp.float32(loss), grads,
                                                              params, state, freeze_vision)
  want = jax.jit(where_guard, static_argnums=(0, 5))(opt, jnp.float32(loss), grads, params,
                                                     state, freeze_vision)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
  skipped = int(got[2])
  assert skipped == (0 if case == "finite" else 1)
  if skipped:  # nothing moved
    for a, b in zip(jax.tree.leaves(got[0]), jax.tree.leaves(params)):
      assert np.array_equal(np.asarray(a), np.asarray(b))
  elif freeze_vision:
    assert np.array_equal(got[0]["model"]["visual"]["w"], params["model"]["visual"]["w"])
