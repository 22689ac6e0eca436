"""DPH-RL's pre-sampling stage and its store (dph_* presets; arXiv 2509.07430).

Before RL, the initial policy answers the first config.dph.num_prompts prompts of
the RL stream (the prompts every preset trains on, in order) config.dph.samples
times each. Prompts it solves in at least config.dph.pef_threshold of its samples
(DPH-RL: all of them, 1.0) form D_pef: their correct responses are stored with
their per-token log-probs (workdir/dph_store.npz) and the divergence term keeps
the policy close to them. D_exp is the RL stream minus D_pef: RL skips the D_pef
prompts and refills from the stream, so a dph_* run trains on as many RL prompts
per step as any other preset, and on the same ones except D_pef's.

With a fixed instance pool (config.collapse.pool), the pre-sampled prompts are the
pool's first num_prompts instances, each once, and the index of a prompt is its
pool index: RL skips every stream row that draws a D_pef instance.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np

from dmpo_jax.parallel import distributed as dist
from dmpo_jax.training import pipeline

STORE = "dph_store.npz"
STORE_VERSION = 2  # 2: D_pef drawn from the RL stream (flat stream indices); 1: a separate pool


def stream_items(taskset, flat: list[int], per_step: int) -> list:
  """The RL stream's items at flat indices (step = index // per_step, row = index % per_step)."""
  steps = {}
  for f in flat:
    if f // per_step not in steps:
      steps[f // per_step] = taskset.train("rl", f // per_step, per_step)
  return [steps[f // per_step][f % per_step] for f in flat]


def presample(cfg, workdir, taskset, encoder, sampler, logprob_eval, params, state, reward_cfg):
  """The store (read from workdir if a previous run wrote it): the pef_* arrays, pef_index (the
  flat stream index of each stored response's prompt) and exp_index (pre-sampled, not D_pef)."""
  path = os.path.join(workdir, STORE)
  prompt_len, completion_len, k = cfg.model.max_prompt_len, cfg.model.max_new_tokens, cfg.dph.samples
  if dist.agree(os.path.exists(path)):
    z = np.load(path)
    version = int(z["version"]) if "version" in z else 1
    if version != STORE_VERSION:
      raise ValueError(f"{path} was written by an older dmpo_jax (D_pef from a separate pool); "
                       "delete it to pre-sample again from the RL stream")
    return {k: z[k] for k in ("pef_tokens", "pef_prompt_mask", "pef_mask", "pef_logprobs",
                              "pef_index", "exp_index")}
  if taskset.pool:
    items = taskset.pool_items()[:cfg.dph.num_prompts]
  else:
    items = stream_items(taskset, list(range(cfg.dph.num_prompts)), cfg.rl.prompts_per_step)
  pef_tok, pef_pm, pef_m, pef_lp, pef_index, exp_index = [], [], [], [], [], []
  chunk = cfg.eval.batch_prompts
  for c0 in range(0, len(items), chunk):
    part = items[c0:c0 + chunk]
    real = len(part)
    part = part + [part[-1]] * (chunk - real)
    pt, pm = pipeline.pad_left([encoder.encode(kk, q) for kk, q in part], prompt_len, encoder.pad)
    tokens, mask, _ = sampler(params, pt, pm, state.dph_key(c0))
    pt, pm = np.repeat(pt, k, 0), np.repeat(pm, k, 0)
    sh = tokens.sharding
    seqs = {"tokens": jnp.concatenate([dist.to_global(pt, sh), tokens], 1), "prompt_mask": dist.to_global(pm, sh)}
    ref = dist.to_host(logprob_eval(params, seqs))
    tokens, mask = dist.to_host(tokens), dist.to_host(mask)
    texts = encoder.texts(tokens, mask)
    _, stats = pipeline.score_groups(part[:real], texts[:real * k], k, reward_cfg)
    ok = stats["feasible"] if cfg.dph.correct == "feasible" else stats["ratio"] >= 1.0
    for i in range(real):
      # D_pef: the initial policy solves the prompt in at least pef_threshold of its k samples
      # (DPH-RL: all of them, 1.0); its correct responses are stored.
      if ok[i].any() and ok[i].mean() >= cfg.dph.pef_threshold:
        for j in range(k):
          if not ok[i, j]:
            continue
          r = i * k + j
          pef_tok.append(np.concatenate([pt[r], tokens[r]]))
          pef_pm.append(pm[r])
          pef_m.append(mask[r])
          pef_lp.append(ref[r])
          pef_index.append(c0 + i)
      else:
        exp_index.append(c0 + i)
  store = {"pef_tokens": np.asarray(pef_tok, np.int32).reshape(-1, prompt_len + completion_len),
           "pef_prompt_mask": np.asarray(pef_pm, np.int32).reshape(-1, prompt_len),
           "pef_mask": np.asarray(pef_m, np.int32).reshape(-1, completion_len),
           "pef_logprobs": np.asarray(pef_lp, np.float32).reshape(-1, completion_len),
           "pef_index": np.asarray(pef_index, np.int64), "exp_index": np.asarray(exp_index, np.int64),
           "version": np.asarray(STORE_VERSION)}
  if dist.is_main():
    tmp = path + ".tmp.npz"
    np.savez(tmp, **store)
    os.replace(tmp, path)
  n_pef = len(items) - len(exp_index)
  print(f"DPH pre-sampling: {n_pef} of {len(items)} prompts in D_pef ({len(pef_tok)} stored responses), "
        f"{len(exp_index)} in D_exp", flush=True)
  return store


def rl_items(store, taskset, rl_step: int, n: int) -> list:
  """The n instances of RL step rl_step: the RL stream's, minus D_pef's prompts when a store
  has them (the stream refilled past them, so every step still has n prompts)."""
  skip = set() if store is None else {int(i) for i in store["pef_index"]}
  if not skip:
    return taskset.train("rl", rl_step, n)
  if not taskset.pool:
    return stream_items(taskset, exp_indices(skip, rl_step * n, n), n)
  if skip >= set(range(len(taskset.pool_items()))):
    raise ValueError("DPH: every instance of the pool (config.collapse.pool) is in D_pef, so D_exp "
                     "is empty; raise config.dph.pef_threshold or lower config.dph.num_prompts")
  ident = lambda f: taskset.pool_id("rl", f // n, f % n, n)
  return stream_items(taskset, exp_indices(skip, rl_step * n, n, ident), n)


def exp_indices(skip: set[int], start: int, n: int, ident=lambda f: f) -> list[int]:
  """Flat stream indices of D_exp's items start..start+n-1: the stream without the rows whose
  identity (the flat index itself; with a pool, the row's pool index) is in `skip`."""
  out, f, seen = [], 0, 0
  while len(out) < n:
    if ident(f) not in skip:
      if seen >= start:
        out.append(f)
      seen += 1
    f += 1
  return out


def batch_part(store, rl_step: int, n: int) -> dict:
  """n stored D_pef responses for RL step rl_step (cycling through the store), as the
  `dph_*` batch entries; empty when the store holds none."""
  total = len(store["pef_tokens"]) if store is not None else 0
  if not total:
    return {}
  idx = (np.arange(n) + rl_step * n) % total
  return {"dph_seqs": {"tokens": jnp.asarray(store["pef_tokens"][idx]),
                       "prompt_mask": jnp.asarray(store["pef_prompt_mask"][idx])},
          "dph_ref_logprobs": jnp.asarray(store["pef_logprobs"][idx]),
          "dph_mask": jnp.asarray(store["pef_mask"][idx])}
