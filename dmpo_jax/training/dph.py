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

Image prompts (a vision-language policy): the sampler and the stored log-probs see each
prompt's images (its k samples share them, as in an RL rollout), but the store holds no
pixels: `prompt_items` rebuilds each stored response's instance from its pef_index, and
`batch_part` attaches the instances' images, re-rendered (through the encoder's render
cache) for the rows of each step.
"""

from __future__ import annotations

import dataclasses
import os

import jax.numpy as jnp
import numpy as np

from dmpo_jax.parallel import distributed as dist
from dmpo_jax.data import pipeline
from dmpo_jax import sampling

STORE = "dph_store.npz"
STORE_VERSION = 2  # 2: D_pef drawn from the RL stream (flat stream indices); 1: a separate pool


def stream_items(taskset, flat: list[int], per_step: int) -> list:
  """The RL stream's items at flat indices (step = index // per_step, row = index % per_step)."""
  steps = {}
  for f in flat:
    if f // per_step not in steps:
      steps[f // per_step] = taskset.train("rl", f // per_step, per_step)
  return [steps[f // per_step][f % per_step] for f in flat]


@dataclasses.dataclass(frozen=True)
class DPHSpec:
  """The pre-sampling stage's settings (config.dph; compiled by training/specs.py)."""
  num_prompts: int        # prompts pre-sampled: the RL stream's first (or the pool's)
  samples: int            # k: samples per prompt
  pef_threshold: float    # D_pef: solved in at least this share of the k samples
  correct: str            # what counts as solved: "feasible" or "optimal" (ratio >= 1)
  prompts_per_step: int   # the RL stream's prompts per step (its flat indices)
  prompt_len: int         # config.model.max_prompt_len
  completion_len: int     # config.model.max_new_tokens
  chunk: int              # prompts per sampler call (the stage layer: config.eval.batch_prompts)
  batch: int = 0          # stored responses per RL step (`batch_part`'s n)


def presample(spec: DPHSpec, workdir, taskset, encoder, sampler, logprob_eval, params, state,
              reward_cfg, images=None):
  """The store (read from workdir if a previous run wrote it): the pef_* arrays, pef_index (the
  flat stream index of each stored response's prompt) and exp_index (pre-sampled, not D_pef).

  logprob_eval(params, seqs, group_size) -> log-probs [B, T] (`steps.make_logprob_eval`): the
  seqs' rows are each prompt's k samples, adjacent, so group_size=k lets it run each prompt
  once (prefix-shared); a row it cannot place in its group (NaN) is refused, not stored.

  images: for image prompts, images(items, prompt_tokens [Bp, P], prompt_mask) -> the prompts'
  `qwen2_5_vl.prompt_images` arrays (host); the sampler and logprob_eval get them."""
  path = os.path.join(workdir, STORE)
  prompt_len, completion_len, k = spec.prompt_len, spec.completion_len, spec.samples
  if dist.agree(os.path.exists(path)):
    z = np.load(path)
    version = int(z["version"]) if "version" in z else 1
    if version != STORE_VERSION:
      raise ValueError(f"{path} was written by an older dmpo_jax (D_pef from a separate pool); "
                       "delete it to pre-sample again from the RL stream")
    return {k: z[k] for k in ("pef_tokens", "pef_prompt_mask", "pef_mask", "pef_logprobs",
                              "pef_index", "exp_index")}
  if taskset.pool:
    items = taskset.pool_items()[:spec.num_prompts]
  else:
    items = stream_items(taskset, list(range(spec.num_prompts)), spec.prompts_per_step)
  pef_tok, pef_pm, pef_m, pef_lp, pef_index, exp_index = [], [], [], [], [], []
  chunk = spec.chunk
  for c0 in range(0, len(items), chunk):
    part = items[c0:c0 + chunk]
    real = len(part)
    part = part + [part[-1]] * (chunk - real)
    pt, pm = sampling.pad_prompts([encoder.encode(kk, q) for kk, q in part], prompt_len, encoder.pad)
    vis = None if images is None else images(part, pt, pm)  # [chunk, ...]: one per prompt
    tokens, mask, _ = sampler(params, pt, pm, state.dph_key(c0),
                              **({} if vis is None else {"images": vis}))
    pt, pm = np.repeat(pt, k, 0), np.repeat(pm, k, 0)
    sh = tokens.sharding
    seqs = {"tokens": jnp.concatenate([dist.to_global(pt, sh), tokens], 1), "prompt_mask": dist.to_global(pm, sh)}
    if vis is not None:  # rows are the prompts' groups of k samples
      seqs["images"] = dist.tree_to_global(vis, sh)
    ref = dist.to_host(logprob_eval(params, seqs, group_size=k))  # rows: k samples per prompt
    bad = ~np.isfinite(ref).all(-1)
    if bad.any():  # the prefix-shared forward's NaN rows (a broken layout), or a broken policy
      raise ValueError(f"DPH pre-sampling: the log-probs of {int(bad.sum())} of {len(ref)} rows "
                       f"(prompts {c0}..) are not finite: a row whose prompt is not its group's "
                       f"first row's (the prefix-shared forward's groups of k={k} adjacent rows, "
                       "config.rl.prefix_shared), or a non-finite policy; nothing was stored")
    tokens, mask = dist.to_host(tokens), dist.to_host(mask)
    texts = encoder.texts(tokens, mask)
    _, stats = pipeline.score_groups(part[:real], texts[:real * k], k, reward_cfg)
    ok = stats["feasible"] if spec.correct == "feasible" else stats["ratio"] >= 1.0
    for i in range(real):
      # D_pef: the initial policy solves the prompt in at least pef_threshold of its k samples
      # (DPH-RL: all of them, 1.0); its correct responses are stored.
      if ok[i].any() and ok[i].mean() >= spec.pef_threshold:
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


def prompt_items(store, taskset, encoder, per_step: int) -> list:
  """The (task key, instance) of each stored response's prompt, rebuilt from pef_index (a
  pool index with config.collapse.pool, else a flat RL-stream index at per_step prompts a
  step). Each instance's prompt must encode to the stored prompt tokens: a store written
  under another config (tasks, level, seed, prompt style) is refused, not trained on."""
  index = [int(i) for i in store["pef_index"]]
  if taskset.pool:
    pool = taskset.pool_items()
    if index and max(index) >= len(pool):
      raise ValueError(f"{STORE}: pef_index {max(index)} is past the pool's {len(pool)} instances "
                       f"(config.collapse.pool={taskset.pool} per task); delete the store to "
                       "pre-sample again")
    items = [pool[i] for i in index]
  else:
    items = stream_items(taskset, index, per_step)
  prompt_len = store["pef_prompt_mask"].shape[1]
  first = {}  # one check per prompt, not per stored response
  for r, i in enumerate(index):
    first.setdefault(i, r)
  rows = list(first.values())
  pt, pm = sampling.pad_prompts([encoder.encode(*items[r]) for r in rows], prompt_len, encoder.pad)
  bad = np.flatnonzero((pt != store["pef_tokens"][rows, :prompt_len]).any(1) |
                       (pm != store["pef_prompt_mask"][rows]).any(1))
  if bad.size:
    raise ValueError(f"{STORE}: the stored prompt of pef_index {index[rows[bad[0]]]} is not the "
                     "config's prompt of that instance (written under another config?); delete "
                     "the store to pre-sample again")
  return items


def batch_part(store, rl_step: int, n: int, images=None) -> dict:
  """n stored D_pef responses for RL step rl_step (cycling through the store), as the
  `dph_*` batch entries; empty when the store holds none.

  images: for image prompts, images(rows [n], prompt_tokens [n, P], prompt_mask) -> the
  `qwen2_5_vl.prompt_images` arrays of the store rows' prompts, set as dph_seqs["images"]
  (one prompt per row: groups of one)."""
  total = len(store["pef_tokens"]) if store is not None else 0
  if not total:
    return {}
  idx = (np.arange(n) + rl_step * n) % total
  prompt_len = store["pef_prompt_mask"].shape[1]
  seqs = {"tokens": jnp.asarray(store["pef_tokens"][idx]),
          "prompt_mask": jnp.asarray(store["pef_prompt_mask"][idx])}
  if images is not None:
    seqs["images"] = images(idx, store["pef_tokens"][idx, :prompt_len], store["pef_prompt_mask"][idx])
  return {"dph_seqs": seqs, "dph_ref_logprobs": jnp.asarray(store["pef_logprobs"][idx]),
          "dph_mask": jnp.asarray(store["pef_mask"][idx])}
