"""The perception stage of an image policy (docs/MULTIMODAL.md): before its task SFT, the
policy learns to write each instance's transcript (data/transcripts.py: the edge list, the
item table, the matrix) from the instance's image. It is a dense signal for the vision tower,
as in the alignment stage that vision-language recipes start with.

The stage is the first `PerceptionSpec.steps` (config.perception.steps) steps of the SFT stage: the same jitted SFT
step, checkpoints and data positions (so a resume inside it is exact), its own learning rate
(`steps.make_optimizer`'s lead, `PerceptionSpec.lead`) and completion length. At its end `evaluate` writes
perception.json: per task, on the held-out instances, the greedy transcription's token
accuracy and the share read back exactly, from the image and from a blank image, beside
`blind_bound`: the best score of a transcription that ignores the image.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from dmpo_jax import sampling
from dmpo_jax.data import pipeline
from dmpo_jax.parallel import distributed as dist
from dmpo_jax.data import transcripts
from dmpo_jax.training import report

FILE = "perception.json"
KEYS = ("per_task", "overall", "steps")


@dataclasses.dataclass(frozen=True)
class PerceptionSpec:
  """The perception stage's settings (config.perception; compiled by training/specs.py). A
  config without the block has steps = 0: no stage."""
  steps: int = 0            # the first `steps` SFT steps transcribe images
  lr: float = 0.0           # their learning rate (peak) and warmup
  warmup: int = 0
  max_new_tokens: int = 0   # a transcript's length (its completions)
  batch_size: int = 0       # instances per step (config.sft.batch_size)
  num_per_task: int = 1     # held-out instances per task, the evaluation's
  batch_prompts: int = 8    # instances per sampler call

  @property
  def lead(self):
    """make_optimizer's `lead` for the SFT optimizer: (steps, lr, warmup), or None."""
    return (self.steps, self.lr, self.warmup) if self.steps else None


def batch(spec: PerceptionSpec, taskset, encoder, prompt_len: int, images, step: int) -> dict:
  """spec.batch_size instances of the SFT stream at `step`, each prompted with its image and its
  task's word; the target is its transcript (host arrays, as `stages.sft_batch`).
  images(items, prompt_tokens, prompt_mask): their image inputs."""
  enc, length = encoder, spec.max_new_tokens
  items = taskset.train("sft", step, spec.batch_size)
  pt, pm = sampling.pad_prompts([enc.perception_ids(k, q) for k, q in items], prompt_len, enc.pad)
  at, am = pipeline.pad_right([enc.transcript_ids(k, q, length) for k, q in items], length, enc.pad)
  seqs = {"tokens": np.concatenate([pt, at], 1), "prompt_mask": pm,
          "images": images(items, pt, pm)}
  return {"seqs": seqs, "mask": am}


def score(key: str, q: dict, target: list[int], ids: list[int], text: str) -> tuple[float, bool]:
  """(token accuracy: the share of the target's tokens, end token included, that the
  transcription has at their position; whether its text reads back as the instance)."""
  acc = sum(a == b for a, b in zip(ids, target)) / len(target)
  try:
    exact = transcripts.same_instance(key, transcripts.read(key, text), q)
  except ValueError:  # TranscriptError, or a question its task refuses
    exact = False
  return acc, exact


def blind_bound(targets: list[list[int]]) -> float:
  """The highest mean token accuracy that one transcription, the same for every instance, can
  score against `targets`: at each position the token with the most weight (an instance
  weighs 1 / its length, as in `score`). A policy that does not read the image writes the
  same greedy transcription for every instance of a task (its prompt ids are the same), so
  it cannot beat this bound; one that reads can."""
  if not targets:
    raise ValueError("blind_bound needs at least one target")
  best = 0.0
  for j in range(max(len(t) for t in targets)):
    weight: dict[int, float] = {}
    for t in targets:
      if j < len(t):
        weight[t[j]] = weight.get(t[j], 0.0) + 1.0 / len(t)
    best += max(weight.values())
  return best / len(targets)


def bounds(encoder, items, length: int) -> dict:
  """`blind_bound` of the transcripts of [(task key, instance)], per task and overall (the
  per-task bounds weighted by their instances, as the overall token accuracy is)."""
  targets: dict[str, list] = {}
  for key, q in items:
    targets.setdefault(key, []).append(encoder.transcript_ids(key, q, length))
  per_task = {key: blind_bound(ts) for key, ts in targets.items()}
  overall = sum(per_task[key] * len(ts) for key, ts in targets.items()) / len(items)
  return {"overall": float(overall), "per_task": per_task}


def greedy_config(spec: PerceptionSpec, encoder) -> sampling.SamplingConfig:
  """The greedy sampling of transcriptions, at spec.max_new_tokens (one sampler serves the
  image and the blank prompts alike: same ids, same shapes)."""
  return sampling.SamplingConfig(max_new_tokens=spec.max_new_tokens, greedy=True,
                                 eos_id=encoder.eos, stop_ids=encoder.stop_ids, pad_id=encoder.pad)


def transcribe(sampler, params, encoder, items, rng, *, batch_prompts: int, prompt_len: int,
               images) -> list[tuple[list[int], str]]:
  """Greedy transcriptions of [(task key, instance)] from `encoder`'s prompts (`sampler`: of
  `greedy_config`; images(items, prompt_tokens, prompt_mask, encoder) their image inputs):
  (ids up to and with the end token, text before it)."""
  bp = batch_prompts
  out = []
  for c0 in range(0, len(items), bp):
    chunk = items[c0:c0 + bp]
    padded = chunk + [chunk[-1]] * (bp - len(chunk))  # one shape: one compilation
    pt, pm = sampling.pad_prompts([encoder.perception_ids(k, q) for k, q in padded],
                                  prompt_len, encoder.pad)
    inputs = images(padded, pt, pm, encoder)
    tokens, mask, _ = sampler(params, pt, pm, jax.random.fold_in(rng, c0), inputs)
    tokens, mask = dist.to_host(tokens), dist.to_host(mask)
    for row, m in list(zip(tokens, mask))[:len(chunk)]:
      ids = [int(t) for t, v in zip(row, m) if v]
      body = [t for t in ids if t != encoder.end and t != encoder.eos]
      out.append((ids, encoder.tok.decode(body, skip_special_tokens=True)))
  return out


def evaluate(spec: PerceptionSpec, workdir: str, taskset, encoder, params, rng, *,
             prompt_len: int, make_sampler, images) -> dict:
  """perception.json in `workdir`: per task and overall, token accuracy and exact read-back of
  greedy transcriptions (of `params`, from `rng`) of the held-out instances, from their images
  ("image") and from blank ones ("blank", the control). A finished file is read back, not
  redone. make_sampler(SamplingConfig) -> the run's jitted sampler; images as `transcribe`'s."""
  path = os.path.join(workdir, FILE)
  if dist.agree(os.path.exists(path)):
    res, why = report.read_result(path, KEYS)
    if res is not None:
      return res
    print(f"warning: {path} is damaged ({why}); evaluating again", flush=True)
  items = taskset.held_out(spec.num_per_task)
  length = spec.max_new_tokens
  res = {"steps": spec.steps, "per_task": {}, "overall": {}}
  bound = bounds(encoder, items, length)
  res["overall"]["blind_bound"] = bound["overall"]
  for key, b in bound["per_task"].items():
    res["per_task"][key] = {"blind_bound": b}
  sampler = make_sampler(greedy_config(spec, encoder))
  for name, enc in (("image", encoder), ("blank", encoder.blank_control())):
    got = transcribe(sampler, params, enc, items, jax.random.fold_in(rng, 17),
                     batch_prompts=spec.batch_prompts, prompt_len=prompt_len, images=images)
    rows = {}
    for (key, q), (ids, text) in zip(items, got):
      acc, exact = score(key, q, enc.transcript_ids(key, q, length), ids, text)
      rows.setdefault(key, []).append((acc, exact))
    for key, r in rows.items():
      res["per_task"].setdefault(key, {})[name] = {
          "token_accuracy": float(np.mean([a for a, _ in r])),
          "exact": float(np.mean([e for _, e in r])), "n": len(r)}
    every = [x for r in rows.values() for x in r]
    res["overall"][name] = {"token_accuracy": float(np.mean([a for a, _ in every])),
                            "exact": float(np.mean([e for _, e in every])), "n": len(every)}
  if dist.is_main():
    report.write_json(res, path)
  o = res["overall"]
  print(f"perception after {res['steps']} steps: token accuracy {o['image']['token_accuracy']:.3f} "
        f"(blank image {o['blank']['token_accuracy']:.3f}; the best an instance-independent "
        f"transcription can score: {o['blind_bound']:.3f}), read back exactly "
        f"{o['image']['exact']:.3f} (blank {o['blank']['exact']:.3f})", flush=True)
  return res
