"""NP task throughput and reference quality.

    python benchmarks/tasks.py                 # all tasks; quality over 50 easy instances
    python benchmarks/tasks.py --quality 0     # speed only

Per task, prints: instances generated per second and answers verified per
second at `tiny` and `bench` (answers: the reference solution and 7 corrupted
variants, so feasible and infeasible paths both count), the reference
solver's time per instance, the worst time on adversarial text (4 KB of
brackets, deep nesting, a huge answer), and the time to verify a group of 64
answers next to the time our sampler takes to generate them (64 rows of the
compact `tiny` answer length, with the Qwen2-shaped benchmark model, measured
in the same run). With --quality N: the reference's mean ratio to the exact
optimum over N `easy` instances (where the exact solver only finds a solution
without proving it optimal, the ratio to that solution). Verification times
cover both compat modes. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dmpo_jax import tasks  # noqa: E402
from dmpo_jax.tasks import scoring  # noqa: E402


def rate(fn, n):
  t = time.perf_counter()
  for i in range(n):
    fn(i)
  return n / (time.perf_counter() - t)


def answers_for(t, q):
  """The reference answer and corrupted variants (digits changed, truncated, reversed)."""
  good = "Answer: " + t.format_answer(t.reference_solution(q))
  rng = random.Random(0)
  out = [good]
  for _ in range(7):
    s = list(good)
    digits = [i for i, c in enumerate(s) if c.isdigit()]
    for i in rng.sample(digits, min(2, len(digits))):
      s[i] = str(rng.randrange(10))
    out.append("".join(s))
  return out


ADVERSARIAL = ["Answer: " + "[" * 4000, "Answer: " + "[1, " * 1000 + "1" + "]" * 1000,
               "Answer: " + "9" * 4000, "Answer: " + "Answer: " * 500 + "[0, 1]",
               "x" * 1_000_000 + "Answer: [" + "1, " * 100000 + "1]"]


def sampler_seconds(new_tokens: int, prompt_len: int = 64) -> float:
  import jax
  from dmpo_jax.models.config import ModelConfig
  from dmpo_jax.models.transformer import Transformer
  from dmpo_jax.sampling import generate
  from flax import nnx
  sys.path.insert(0, os.path.dirname(__file__))
  from sampler import DEFAULT_CONFIG
  from dmpo_jax.models.hf import config_from_hf
  cfg = config_from_hf(DEFAULT_CONFIG)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  prompts = [[5 + (i % 100) for i in range(prompt_len)] for _ in range(8)]
  run = lambda seed: jax.block_until_ready(generate(
      model, prompts, rng=jax.random.key(seed), max_new_tokens=new_tokens, num_samples=8).tokens)
  run(0)
  t = time.perf_counter()
  run(1)
  return time.perf_counter() - t


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quality", type=int, default=50, help="easy instances for ref/optimum (0: skip)")
  ap.add_argument("--exact_time_limit", type=float, default=10.0)
  ap.add_argument("--no_sampler", action="store_true", help="skip the sampler comparison")
  args = ap.parse_args(argv)

  rows, out = [], {"tasks": {}}
  tok_len = 0
  from dmpo_jax.models import tokenizer
  tok = tokenizer.build()
  for key in tasks.names():
    t = tasks.get(key)
    r = {}
    for level in ("tiny", "bench"):
      r[f"gen_{level}_per_s"] = rate(lambda i: t.generate(1000 + i, level), 20)
      q = t.generate(0, level)
      t0 = time.perf_counter()
      t.reference_value(q)
      r[f"reference_{level}_s"] = time.perf_counter() - t0
      answers = answers_for(t, q)
      r[f"verify_{level}_per_s"] = rate(lambda i: t.verify(q, answers[i % len(answers)]), 400)
      if level == "tiny":
        tok_len = max(tok_len, len(tok.encode(answers[0])))
    q = t.generate(0, "bench")
    worst = 0.0
    for text in ADVERSARIAL:
      for compat in tasks.COMPAT:
        t0 = time.perf_counter()
        v = t.verify(q, text, compat=compat)
        worst = max(worst, time.perf_counter() - t0)
        assert isinstance(v, tasks.Verdict)
    r["adversarial_worst_ms"] = 1e3 * worst
    group = answers_for(t, q) * 8
    t0 = time.perf_counter()
    for a in group:
      t.verify(q, a)
    r["verify_64_bench_ms"] = 1e3 * (time.perf_counter() - t0)
    if args.quality:
      ratios, found, status = [], [], {}
      for seed in range(args.quality):
        q = t.generate(10_000 + seed, "easy")
        ex = t.exact(q, time_limit=args.exact_time_limit)
        status[ex.status] = status.get(ex.status, 0) + 1
        if ex.status == "OPTIMAL":
          ratios.append(scoring.ratio(t.reference_value(q), ex.value, t.direction))
        elif ex.status == "FEASIBLE":  # unproven: the ratio to the best solution found
          found.append(scoring.ratio(t.reference_value(q), ex.value, t.direction))
      r["ref_over_opt_easy_mean"] = sum(ratios) / len(ratios) if ratios else None
      r["ref_over_opt_easy_min"] = min(ratios) if ratios else None
      r["ref_optimal_share"] = sum(x == 1.0 for x in ratios) / len(ratios) if ratios else None
      r["ref_over_unproven_best_mean"] = sum(found) / len(found) if found else None
      r["exact_status"] = status
    out["tasks"][key] = r
    print(f"{key:24s} gen/s tiny {r['gen_tiny_per_s']:8.0f} bench {r['gen_bench_per_s']:6.0f} | "
          f"verify/s tiny {r['verify_tiny_per_s']:7.0f} bench {r['verify_bench_per_s']:6.0f} | "
          f"ref s tiny {r['reference_tiny_s']:.3f} bench {r['reference_bench_s']:.3f} | "
          f"64 answers {r['verify_64_bench_ms']:.1f} ms | adversarial {r['adversarial_worst_ms']:.1f} ms"
          + (f" | ref/opt easy {r['ref_over_opt_easy_mean']:.4f} (min {r['ref_over_opt_easy_min']:.3f}, "
             f"optimal on {100 * r['ref_optimal_share']:.0f}%) {r['exact_status']}"
             if args.quality and r["ref_over_opt_easy_mean"] is not None else "")
          + (f" | ref/best unproven {r['ref_over_unproven_best_mean']:.4f} {r['exact_status']}"
             if args.quality and r["ref_over_unproven_best_mean"] is not None else ""),
          flush=True)
  if not args.no_sampler:
    s = sampler_seconds(tok_len)
    worst = max(r["verify_64_bench_ms"] for r in out["tasks"].values())
    out["sample_64_tiny_answers_ms"] = 1e3 * s
    out["worst_verify_64_over_sample_64"] = worst / (1e3 * s)
    print(f"sampling 64 answers of {tok_len} tokens (Qwen2-shaped benchmark model, ours): {1e3 * s:.0f} ms; "
          f"slowest task verifies 64 bench answers in {worst:.1f} ms "
          f"(ratio {out['worst_verify_64_over_sample_64']:.3f})")
  print(json.dumps(out))


if __name__ == "__main__":
  main()
