r"""Train a policy on the NP tasks: SFT warm start, DPH pre-sampling, RL, evaluation.

    python -m dmpo_jax.train --config=configs/nphard.py --workdir=runs/default
    python -m dmpo_jax.train --config=configs/nphard.py:algo=grpo --workdir=runs/grpo \
        --config.rl.steps=100

The run, top to bottom (STYLE.md 2): setup -> SFT -> evaluation before RL ->
DPH pre-sampling (dph_* presets) -> RL -> evaluation after RL -> table,
plots, HF export. Every stage resumes from the workdir: checkpoints (orbax)
hold params, optimizer state, step, PRNG key and data position (the step:
data is a pure function of (seed, step)); finished evaluations and the DPH
store are files. SIGINT/SIGTERM save a checkpoint and exit cleanly.

Workdir: config.json, checkpoints/, metrics.jsonl, tb/, eval_before.json,
eval_after.json, results.json, dph_store.npz, training.png,
before_after.png, hf/ (the final policy as a Hugging Face folder).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from dmpo_jax import checkpoint as ckpt_lib
from dmpo_jax import distributed as dist
from dmpo_jax import evaluation, pipeline, report, sharding, steps
from dmpo_jax import tasks as tasks_lib
from dmpo_jax.models import hf, tokenizer as tok_lib
from dmpo_jax.models.config import ModelConfig
from dmpo_jax.objectives import dapo, flowrl, presets
from dmpo_jax.sampling import sampler as sampler_lib
from dmpo_jax.tasks import rewards as rewards_lib

FLAGS = flags.FLAGS


def define_flags():
  """CLI flags (defined only when run as a program, so other tools can import this module)."""
  config_flags.DEFINE_config_file("config", None, "Training config (a .py file).", lock_config=True)
  flags.DEFINE_string("workdir", None, "Output folder; an existing run there is resumed.")
  flags.DEFINE_string("coordinator_address", None, "multi-process: host:port of process 0 "
                      "(or JAX_COORDINATOR_ADDRESS; automatic on TPU pods and SLURM)")
  flags.DEFINE_integer("num_processes", None, "multi-process: number of processes (or JAX_NUM_PROCESSES)")
  flags.DEFINE_integer("process_id", None, "multi-process: this process's index (or JAX_PROCESS_ID)")


class TrainingError(RuntimeError):
  """The run cannot continue; the message says why (the last good checkpoint is intact)."""


# ---------------------------------------------------------------------------
# Config checks (bad input names itself).
def objective_from_config(cfg) -> presets.ObjectiveConfig:
  overrides = {k: v for k, v in cfg.rl.objective.items() if v is not None}
  return presets.objective_config(cfg.rl.algo, **overrides)


def micro_batches(cfg, obj: presets.ObjectiveConfig, mesh) -> int:
  """config.rl.micro_batches, with 0 (auto) resolved by `auto_micro_batches`."""
  return cfg.rl.micro_batches or auto_micro_batches(obj, cfg.rl.prompts_per_step,
                                                    sharding.batch_rows(mesh))


def auto_micro_batches(obj: presets.ObjectiveConfig, prompts: int, rows: int = 1) -> int:
  """On a CPU, one slice per prompt group (as many as `rows` batch devices allow) when the
  objective is a mean over sequences and groups, so that slicing changes nothing but
  summation order; 1 otherwise (and on GPU/TPU). Slices of one group keep the update's
  matmuls cache-sized: about 1.4x faster on the 2-core CPU."""
  if jax.default_backend() != "cpu" or not presets.slice_exact(obj):
    return 1
  return max(m for m in range(1, prompts + 1) if prompts % m == 0 and (prompts // m) % rows == 0)


def check_config(cfg, obj: presets.ObjectiveConfig, mesh) -> None:
  g = cfg.rl.group_size
  if g < 2 and obj.advantage in ("grpo", "rloo"):
    raise ValueError(f"config.rl.group_size={g}: {obj.advantage} advantages need a group of at "
                     "least 2 (a std or leave-one-out over one sample is undefined)")
  if g < 2 and obj.dm_coef > 0:
    raise ValueError(f"config.rl.group_size={g}: DMPO's group distribution needs G >= 2")
  rows = sharding.batch_rows(mesh)
  for name, n in (("rl.prompts_per_step", cfg.rl.prompts_per_step), ("sft.batch_size", cfg.sft.batch_size),
                  ("eval.batch_prompts", cfg.eval.batch_prompts), ("dph.batch", cfg.dph.batch)):
    if n % rows:
      raise ValueError(f"config.{name}={n} must divide by the mesh's data x fsdp size ({rows})")
  if cfg.eval.k > cfg.eval.samples:
    raise ValueError(f"config.eval.k={cfg.eval.k} exceeds config.eval.samples={cfg.eval.samples}")
  if cfg.sft.batch_size % cfg.sft.solutions_per_instance:
    raise ValueError("config.sft.batch_size must divide by config.sft.solutions_per_instance")
  chunks = cfg.rl.rollout_chunks
  if chunks < 1 or cfg.rl.prompts_per_step % chunks or (cfg.rl.prompts_per_step // chunks * g) % rows:
    raise ValueError(f"config.rl.rollout_chunks={chunks} must divide rl.prompts_per_step="
                     f"{cfg.rl.prompts_per_step}, and each piece's rows by the mesh's data x fsdp ({rows})")
  mb = cfg.rl.micro_batches
  if mb < 0 or (mb > 0 and (cfg.rl.prompts_per_step % mb or (cfg.rl.prompts_per_step // mb) % rows or (
      obj.divergence is not None and cfg.dph.batch % mb))):
    raise ValueError(f"config.rl.micro_batches={mb} must be 0 (auto) or divide rl.prompts_per_step="
                     f"{cfg.rl.prompts_per_step} (and dph.batch), leaving slices divisible by the "
                     f"mesh's data x fsdp size ({rows})")
  if not 0.0 < cfg.dph.pef_threshold <= 1.0:
    raise ValueError(f"config.dph.pef_threshold={cfg.dph.pef_threshold} must be in (0, 1]")
  if cfg.dph.correct not in ("feasible", "optimal"):
    raise ValueError(f"config.dph.correct={cfg.dph.correct!r}; choose 'feasible' or 'optimal'")


def task_keys(cfg) -> list[str]:
  return tasks_lib.names() if cfg.tasks == "all" else [k.strip() for k in cfg.tasks.split(",")]


def build_model(cfg):
  """(model, tokenizer) from scratch (task tokenizer) or from a local HF folder."""
  m = cfg.model
  if m.init == "scratch":
    tok = tok_lib.load(m.tokenizer) if m.tokenizer else tok_lib.build()
    vocab = -(-len(tok) // 8) * 8
    mcfg = ModelConfig(vocab_size=vocab, hidden_size=m.hidden_size,
                       intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                       num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                       rope_theta=m.rope_theta, dtype=m.dtype, param_dtype=m.param_dtype,
                       max_position_embeddings=m.max_prompt_len + m.max_new_tokens,
                       architecture="llama", remat=m.remat)
    from dmpo_jax.models.transformer import Transformer
    return Transformer(mcfg, rngs=nnx.Rngs(cfg.seed)), tok
  model, tok = hf.load(m.init, dtype=m.dtype, param_dtype=m.param_dtype)
  if m.tokenizer:
    tok = tok_lib.load(m.tokenizer)
  if tok is None:
    raise ValueError(f"config.model.init={m.init!r} has no tokenizer files; set config.model.tokenizer")
  if m.remat:
    model.cfg = model.cfg.replace(remat=True)  # read when the forward is traced
  return model, tok


def model_shape(model) -> dict:
  c = model.cfg
  return {k: getattr(c, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                     "num_heads", "num_kv_heads", "head_dim")}


def make_optimizer(lr: float, steps_total: int, warmup: int, max_grad_norm: float):
  warmup = max(1, min(warmup, steps_total))
  sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps_total, warmup + 1), lr * 0.1)
  return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adamw(sched, weight_decay=0.0))


def make_sampler(graphdef, scfg, p_sh, data_sh, rep):
  """Jitted (params, prompts [Bp, P], mask [Bp, P], key) -> (tokens, mask, logprobs), each
  [Bp * scfg.num_samples, T] and sharded over the mesh's rows. Prompts (host arrays, small)
  and the key (raw key data) are passed replicated."""
  def run(params, prompt_tokens, prompt_mask, key_data):
    steps.TRACES["sampler"] += 1
    rng = jax.random.wrap_key_data(key_data)
    r = sampler_lib._generate(graphdef, params["model"], prompt_tokens, prompt_mask, rng, scfg)
    return r.tokens, r.mask, r.logprobs
  jitted = jax.jit(run, in_shardings=(p_sh, rep, rep, rep),
                   out_shardings=(data_sh, data_sh, data_sh))

  def call(params, pt, pm, key):
    return jitted(params, dist.to_global(pt, rep), dist.to_global(pm, rep),
                  dist.to_global(np.asarray(jax.random.key_data(key)), rep))
  return call


host = dist.tree_to_host


# ---------------------------------------------------------------------------
def train(cfg, workdir: str) -> dict:
  """Run every stage; returns the results dict (also written to workdir/results.json)."""
  t_start = time.time()
  # --- Setup: config, mesh, data, model, optimizer, checkpoints ------------
  os.makedirs(workdir, exist_ok=True)
  obj = objective_from_config(cfg)
  mesh = sharding.make_mesh(dict(cfg.mesh))
  check_config(cfg, obj, mesh)
  keys = task_keys(cfg)
  taskset = pipeline.TaskSet(keys, cfg.level, cfg.seed,
                             pipeline.parse_curriculum(cfg.rl.curriculum, cfg.level))
  reward_cfg = rewards_lib.RewardConfig(**dict(cfg.rl.reward))
  if dist.is_main():
    report.write_json(json.loads(cfg.to_json_best_effort()), os.path.join(workdir, "config.json"))

  model, tok = build_model(cfg)
  encoder = pipeline.PromptEncoder(tok, cfg.prompt_style, cfg.model.max_prompt_len, cfg.chat_template)
  lp, lt = cfg.model.max_prompt_len, cfg.model.max_new_tokens
  graphdef, state = nnx.split(model)
  params = {"model": state}
  if obj.policy_loss == "flowrl":
    params["log_z"] = flowrl.init_log_z_head(jax.random.key(cfg.seed + 1), model.cfg.hidden_size)
  rep = sharding.replicated(mesh)
  p_sh = {"model": sharding.param_shardings(state, mesh)}
  if "log_z" in params:
    p_sh["log_z"] = jax.tree.map(lambda _: rep, params["log_z"])
  params = jax.tree.map(lambda x, s: dist.to_global(np.asarray(x), s), params, p_sh)
  data_sh = sharding.batch_sharding(mesh, 1)  # leading axis; a prefix for every batch leaf

  sft_steps, rl_steps = cfg.sft.steps, cfg.rl.steps
  total = sft_steps + rl_steps
  sft_opt = make_optimizer(cfg.sft.lr, sft_steps, cfg.sft.warmup, 1.0)
  rl_opt = make_optimizer(cfg.rl.lr, rl_steps, 1, cfg.rl.max_grad_norm)
  def init_opt(opt):
    """Optimizer state on the mesh: moments sharded like their params, counts replicated."""
    return sharding.init_opt_state(opt, params, p_sh, mesh)[0]

  opt_state = init_opt(sft_opt if sft_steps else rl_opt)
  o_sh = jax.tree.map(lambda x: x.sharding, opt_state)

  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=cfg.checkpoint.keep)
  step, counters = 0, {"nonfinite_total": 0}
  latest = ckpt.latest_step()
  if latest is not None:
    params, opt_state, meta = ckpt.restore(latest, params, opt_state, model_shape(model))
    step, counters = meta["step"], meta["counters"]
    if meta["seed"] != cfg.seed:
      raise TrainingError(f"{workdir} holds a run with seed {meta['seed']}, config has {cfg.seed}")
    print(f"resumed {workdir} at step {step} ({meta['stage']})", flush=True)
  base_key = jax.random.key(cfg.seed)

  def save(at_step: int, stage: str):
    ckpt.save(at_step, params, opt_state, {
        "step": at_step, "stage": stage, "seed": cfg.seed,
        "rng_key": np.asarray(jax.random.key_data(base_key)).tolist(),
        "data_position": at_step, "model_shape": model_shape(model),
        "counters": counters, "config": json.loads(cfg.to_json_best_effort())})

  writer = (report.MetricsWriter(workdir, cfg.log.tensorboard, resume_step=step if latest else None)
            if dist.is_main() else report.NullWriter(workdir))
  eval_cfg = sampler_lib.SamplingConfig(max_new_tokens=lt, num_samples=cfg.eval.samples,
                                        temperature=cfg.eval.temperature,
                                        eos_id=tok.eos_token_id, pad_id=encoder.pad)
  eval_sampler = make_sampler(graphdef, eval_cfg, p_sh, data_sh, rep)
  eval_items = taskset.held_out(cfg.eval.num_per_task)
  eval_gts = [tasks_lib.get(k).reference_value(q) for k, q in eval_items]

  def run_eval(name: str) -> dict:
    path = os.path.join(workdir, f"eval_{name}.json")
    if dist.agree(os.path.exists(path)):  # every process takes the same branch
      return report.read_json(path)
    res = evaluation.evaluate(
        lambda pt, pm, rng: eval_sampler(params, pt, pm, rng)[:2], encoder, eval_items,
        samples=cfg.eval.samples, k=cfg.eval.k, pass_ks=tuple(cfg.eval.pass_ks),
        rng=jax.random.fold_in(base_key, 10**6), batch_prompts=cfg.eval.batch_prompts,
        prompt_len=lp, reward_cfg=reward_cfg, ground_truths=eval_gts, progress=cfg.log.progress)
    if dist.is_main():
      report.write_json(res, path)
    return res

  progress = None
  if cfg.log.progress and dist.is_main():
    from tqdm import tqdm
    progress = tqdm(total=total, initial=step, desc="train", unit="step", dynamic_ncols=True)
  times = {"sft": 0.0, "rollout": 0.0, "reward": 0.0, "update": 0.0, "eval": 0.0, "dph": 0.0}
  times.update(counters.get("times", {}))

  with ckpt_lib.StopSignal() as stop:

    def maybe_stop(at_step: int, stage: str) -> bool:
      if not dist.agree(stop.received is not None or at_step == cfg.stop_at_step):
        return False
      stop.received = stop.received or f"config.stop_at_step={cfg.stop_at_step}"
      counters["times"] = times
      save(at_step, stage)
      print(f"\n{stop.received}: saved checkpoint at step {at_step}; rerun the same command to resume",
            flush=True)
      return True

    # --- Stage 1: SFT warm start ---------------------------------------------
    if step < sft_steps:
      sft_step = steps.make_sft_step(graphdef, sft_opt, lp, shardings=(p_sh, o_sh, data_sh, rep))
      per = cfg.sft.solutions_per_instance
      while step < sft_steps:
        t0 = time.time()
        items = taskset.train("sft", step, cfg.sft.batch_size // per)
        prompts, answers = [], []
        for key, q in items:
          sols = tasks_lib.get(key).sample_solutions(q, per, seed=step)
          sols = (sols * per)[:per]  # fewer distinct ones than asked: repeat
          ids = encoder.encode(key, q)
          for s in sols:
            prompts.append(ids)
            answers.append(encoder.answer_ids(key, s))
        pt, pm = pipeline.pad_left(prompts, lp, encoder.pad)
        at, am = pipeline.pad_right(answers, lt, encoder.pad)
        batch = {"seqs": {"tokens": np.concatenate([pt, at], 1), "prompt_mask": pm}, "mask": am}
        params, opt_state, m = sft_step(params, opt_state, dist.tree_to_global(batch, data_sh))
        m = host(m)
        step += 1
        times["sft"] += time.time() - t0
        counters["nonfinite_total"] += int(m["skipped"])
        if step % cfg.log.every == 0 or step == sft_steps:
          writer.write(step, "sft", {"loss": m["loss"], "grad_norm": m["grad_norm"]})
        if progress:
          progress.update(1)
          progress.set_postfix(stage="sft", loss=f"{float(m['loss']):.3f}")
        if step % cfg.checkpoint.every == 0 or step == sft_steps:
          counters["times"] = times
          save(step, "sft")
        if maybe_stop(step, "sft"):
          return {"stopped": True, "step": step}

    # --- Stage 2: evaluation before RL ----------------------------------------
    t0 = time.time()
    before = run_eval("before")
    times["eval"] += time.time() - t0
    if rl_steps and step == sft_steps:
      opt_state = init_opt(rl_opt)  # fresh optimizer for RL

    # --- Stage 3: DPH pre-sampling (dph_* presets) ------------------------------
    scfg = sampler_lib.SamplingConfig(max_new_tokens=lt, num_samples=cfg.rl.group_size,
                                      temperature=cfg.rl.temperature, top_p=cfg.rl.top_p,
                                      eos_id=tok.eos_token_id, pad_id=encoder.pad)
    rl_sampler = make_sampler(graphdef, scfg, p_sh, data_sh, rep)
    logprob_eval = steps.make_logprob_eval(graphdef, lp, cfg.rl.temperature,
                                           shardings=(p_sh, data_sh, None))
    dph = None
    if obj.divergence is not None and rl_steps:
      t0 = time.time()
      dph_sampler = make_sampler(graphdef, dataclasses.replace(scfg, num_samples=cfg.dph.samples),
                                 p_sh, data_sh, rep)
      dph = dph_presample(cfg, workdir, taskset, encoder, dph_sampler, logprob_eval, params,
                          base_key, reward_cfg)
      times["dph"] += time.time() - t0

    # --- Stage 4: RL -----------------------------------------------------------
    if step < total:
      rl_update = steps.make_rl_step(graphdef, obj, rl_opt, lp, cfg.rl.temperature,
                                     shardings=(p_sh, o_sh, data_sh, rep),
                                     micro_batches=micro_batches(cfg, obj, mesh))
      need_ref = obj.kl_coef > 0 or obj.policy_loss == "flowrl"
      ref_params = jax.tree.map(jnp.copy, params) if need_ref else None  # the RL start policy
      P, G = cfg.rl.prompts_per_step, cfg.rl.group_size
      consecutive = 0
      first_rl, traces0 = step, steps.TRACES["rl_update"]
      while step < total:
        s = step - sft_steps
        t0 = time.time()
        if dph is not None and len(dph["exp_items"]):
          pool = dph["exp_items"]
          items = [pool[(s * P + i) % len(pool)] for i in range(P)]
        else:
          items = taskset.train("rl", s, P)
        ids = [encoder.encode(k, q) for k, q in items]
        pt, pm = pipeline.pad_left(ids, lp, encoder.pad)
        ref_fn = (lambda sq: logprob_eval(ref_params, sq)) if need_ref else None
        tokens, mask_h, old_lp, ref_lp, rewards, stats, host_s = rollout_and_score(
            rl_sampler, params, items, encoder, pt, pm, jax.random.fold_in(base_key, step), G,
            cfg.rl.rollout_chunks, reward_cfg, ref_fn)
        pt, pm = np.repeat(pt, G, 0), np.repeat(pm, G, 0)  # [P*G, lp]: each sample's prompt
        seqs = {"tokens": jnp.concatenate([dist.to_global(pt, data_sh), tokens], 1).reshape(P, G, lp + lt),
                "prompt_mask": dist.to_global(pm.reshape(P, G, lp), data_sh)}
        t1 = time.time()
        lengths = mask_h.sum(-1).reshape(P, G)
        comp_mask = mask_h.reshape(P, G, lt)
        if obj.overlong_cache:
          rewards = rewards + np.asarray(dapo.overlong_penalty(lengths, lt, obj.overlong_cache))
        if obj.dynamic_sampling:  # fixed shapes: drop groups by masking, not by resampling
          keep = dapo.dynamic_sampling_keep(stats["feasible"])
          comp_mask = comp_mask * keep[:, None, None]
        t2 = time.time()
        batch = {"seqs": seqs, "mask": dist.to_global(comp_mask, data_sh),
                 "old_logprobs": old_lp.reshape(P, G, lt), "rewards": dist.to_global(rewards, data_sh)}
        if need_ref:
          batch["ref_logprobs"] = ref_lp.reshape(P, G, lt)
        if dph is not None and len(dph["pef_tokens"]):
          batch.update(dist.tree_to_global(dph_chunk(dph, s, cfg.dph.batch, lp), data_sh))
        params, opt_state, m = rl_update(params, opt_state, batch)
        m = host(m)
        t3 = time.time()
        times["rollout"] += t1 - t0 - host_s
        times["reward"] += t2 - t1 + host_s
        times["update"] += t3 - t2
        step += 1
        traces = steps.TRACES["rl_update"] - traces0
        if cfg.rl.check_recompile and step - first_rl >= 2 and traces > 1:
          raise TrainingError(f"the RL update recompiled ({traces} traces); "
                              "batch shapes must stay fixed")
        if int(m["skipped"]):
          consecutive += 1
          counters["nonfinite_total"] += 1
          if consecutive >= cfg.rl.nonfinite_patience:
            raise TrainingError(
                f"{consecutive} non-finite losses in a row (at step {step}); stopping. The last "
                f"good checkpoint ({ckpt.latest_step()}) is intact. Lower config.rl.lr or check rewards.")
        else:
          consecutive = 0
        row = {k: float(v) for k, v in m.items() if np.ndim(v) == 0}
        row.update(reward_mean=float(rewards.mean()), qr_mean=float(np.mean(np.minimum(stats["ratio"], 10))),
                   feasible=float(stats["feasible"].mean()), distinct=float(stats["distinct"].mean()),
                   solution_entropy=float(stats["solution_entropy"].mean()),
                   length=float(lengths.mean()), rollout_s=t1 - t0 - host_s,
                   reward_s=t2 - t1 + host_s, update_s=t3 - t2)
        if step % cfg.log.every == 0 or step == total:
          writer.write(step, "rl", row)
        if progress:
          progress.update(1)
          progress.set_postfix(stage=f"rl/{obj.policy_loss}", reward=f"{row['reward_mean']:.3f}",
                               qr=f"{row['qr_mean']:.3f}", distinct=f"{row['distinct']:.2f}")
        if step % cfg.checkpoint.every == 0 or step == total:
          counters["times"] = times
          save(step, "rl")
        if maybe_stop(step, "rl"):
          return {"stopped": True, "step": step}

  if progress:
    progress.close()
  writer.close()

  # --- Stage 5: evaluation after RL, table, plots, export ----------------------
  t0 = time.time()
  after = run_eval("after")
  times["eval"] += time.time() - t0
  keep = {k: tasks_lib.scoring.keep_and_exploration(before["solved"][k], after["solved"][k])
          for k in after["solved"]}
  table = evaluation.format_table(after, before)
  results = {"before": {k: before[k] for k in ("per_task", "categories", "overall")},
             "after": {k: after[k] for k in ("per_task", "categories", "overall")},
             "keep_exploration": keep, "times_s": times, "steps": {"sft": sft_steps, "rl": rl_steps},
             "algo": cfg.rl.algo, "seed": cfg.seed, "nonfinite_steps": counters["nonfinite_total"],
             "wall_s": time.time() - t_start}
  export = dist.tree_to_host(params["model"]) if cfg.checkpoint.export_hf else None  # all processes
  if dist.is_main():  # files are written once
    report.write_json(results, os.path.join(workdir, "results.json"))
    if cfg.log.plots:
      report.plot_training(report.read_metrics(writer.path), os.path.join(workdir, "training.png"))
      report.plot_before_after(before, after, os.path.join(workdir, "before_after.png"))
    if export is not None:
      hf.save(nnx.merge(graphdef, export), tok, os.path.join(workdir, "hf"))
  ckpt.close()
  if not dist.is_main():
    return results
  print(f"\n{cfg.rl.algo}, seed {cfg.seed}: before RL -> after RL (held-out {cfg.level} instances, "
        f"{cfg.eval.samples} samples at T={cfg.eval.temperature})")
  print(table)
  print("time (s): " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()) + f"; outputs in {workdir}")
  return results


# ---------------------------------------------------------------------------
def rollout_and_score(sampler, params, items, encoder, pt, pm, key, G, chunks, reward_cfg, ref_fn):
  """Sample G completions of each prompt (pt, pm [P, lp]) in `chunks` pieces: while the host
  decodes and verifies piece c, the device already samples piece c + 1 (and computes piece c's
  reference log-probs), so reward computation does not stall the device. Returns device
  tokens [P*G, T], host mask, device old log-probs, device reference log-probs (or None),
  rewards [P, G], stats, host seconds."""
  per = len(items) // chunks
  launch = lambda c: sampler(params, pt[c * per:(c + 1) * per], pm[c * per:(c + 1) * per],
                             jax.random.fold_in(key, c))
  pending, outs, host_s = launch(0), [], 0.0
  for c in range(chunks):
    tokens, mask, logp = pending
    if c + 1 < chunks:
      pending = launch(c + 1)  # async dispatch: runs while the host scores piece c
    ref = None
    if ref_fn is not None:
      data_sh = tokens.sharding
      per_row = lambda x: np.repeat(x[c * per:(c + 1) * per], G, 0)  # each sample's prompt
      seqs = {"tokens": jnp.concatenate([dist.to_global(per_row(pt), data_sh), tokens], 1),
              "prompt_mask": dist.to_global(per_row(pm), data_sh)}
      ref = ref_fn(seqs)
    tok_h, mask_h = dist.to_host(tokens), dist.to_host(mask)
    h0 = time.time()
    texts = encoder.texts(tok_h, mask_h)
    r, st = pipeline.score_groups(items[c * per:(c + 1) * per], texts, G, reward_cfg)
    host_s += time.time() - h0
    outs.append((tokens, mask_h, logp, ref, r, st))
  cat = lambda i: jnp.concatenate([o[i] for o in outs])
  stats = {k: np.concatenate([o[5][k] for o in outs]) for k in outs[0][5]}
  return (cat(0), np.concatenate([o[1] for o in outs]), cat(2),
          cat(3) if ref_fn is not None else None, np.concatenate([o[4] for o in outs]), stats, host_s)


def dph_presample(cfg, workdir, taskset, encoder, sampler, logprob_eval, params, base_key, reward_cfg):
  """Sample k responses per training prompt from the initial policy; split D_pef / D_exp;
  store the correct D_pef responses with their per-token log-probs (dph_store.npz)."""
  path = os.path.join(workdir, "dph_store.npz")
  lp, lt, k = cfg.model.max_prompt_len, cfg.model.max_new_tokens, cfg.dph.samples
  items = [it for j in range(cfg.dph.num_prompts) for it in taskset.train("dph", j, 1)]
  if dist.agree(os.path.exists(path)):
    z = np.load(path)
    exp = [items[i] for i in z["exp_index"]]
    return {"pef_tokens": z["pef_tokens"], "pef_prompt_mask": z["pef_prompt_mask"],
            "pef_mask": z["pef_mask"], "pef_logprobs": z["pef_logprobs"], "exp_items": exp}
  pef_tok, pef_pm, pef_m, pef_lp, pef_index, exp_index = [], [], [], [], [], []
  chunk = cfg.eval.batch_prompts
  for c0 in range(0, len(items), chunk):
    part = items[c0:c0 + chunk]
    real = len(part)
    part = part + [part[-1]] * (chunk - real)
    pt, pm = pipeline.pad_left([encoder.encode(kk, q) for kk, q in part], lp, encoder.pad)
    tokens, mask, _ = sampler(params, pt, pm, jax.random.fold_in(base_key, 2 * 10**6 + c0))
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
  store = {"pef_tokens": np.asarray(pef_tok, np.int32).reshape(-1, lp + lt),
           "pef_prompt_mask": np.asarray(pef_pm, np.int32).reshape(-1, lp),
           "pef_mask": np.asarray(pef_m, np.int32).reshape(-1, lt),
           "pef_logprobs": np.asarray(pef_lp, np.float32).reshape(-1, lt),
           "pef_index": np.asarray(pef_index, np.int64), "exp_index": np.asarray(exp_index, np.int64)}
  if dist.is_main():
    tmp = path + ".tmp.npz"
    np.savez(tmp, **store)
    os.replace(tmp, path)
  n_pef = len(items) - len(exp_index)
  print(f"DPH pre-sampling: {n_pef} of {len(items)} prompts in D_pef ({len(pef_tok)} stored responses), "
        f"{len(exp_index)} in D_exp", flush=True)
  store["exp_items"] = [items[i] for i in exp_index]
  return store


def dph_chunk(dph, s: int, n: int, lp: int) -> dict:
  """n stored D_pef responses for RL step s (cycling through the store)."""
  total = len(dph["pef_tokens"])
  idx = (np.arange(n) + s * n) % total
  return {"dph_seqs": {"tokens": jnp.asarray(dph["pef_tokens"][idx]),
                       "prompt_mask": jnp.asarray(dph["pef_prompt_mask"][idx])},
          "dph_ref_logprobs": jnp.asarray(dph["pef_logprobs"][idx]),
          "dph_mask": jnp.asarray(dph["pef_mask"][idx])}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if FLAGS.config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/nphard.py")
  if not FLAGS.workdir:
    raise app.UsageError("--workdir is required")
  if not FLAGS["verbosity"].present:  # orbax logs every save at INFO; -v 0 brings it back
    logging.set_verbosity(logging.WARNING)
  dist.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  try:
    train(FLAGS.config, FLAGS.workdir)
  except (TrainingError, ckpt_lib.CheckpointError, ValueError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
