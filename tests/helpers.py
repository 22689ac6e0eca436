"""Shared test helpers: the repository root, configs by path, the smoke config, tiny models and
HF folders built inside the tests (no hub), and the invariance comparisons."""

import functools
import os

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# XLA's backend (LLVM) at optimisation level 0 for the tests and their subprocesses: the suite's
# many tiny programs compile about 30% faster (a smoke training: 27.6 s -> 19.1 s on the 2-core
# EPYC); results are compared within one setting, and benchmarks never run under it.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a test's subprocess: `devices` forced CPU devices and TEST_XLA_FLAGS."""
  return f"--xla_force_host_platform_device_count={devices} {TEST_XLA_FLAGS}"


def production_xla_env() -> dict:
  """The environment for a subprocess whose assertion is about what training learns: XLA_FLAGS
  without TEST_XLA_FLAGS (XLA's default backend optimisation, as runs use). A trained policy's
  outcome depends on the rounding of the compiled code, so it is checked at the runs' setting."""
  env = dict(os.environ, PYTHONPATH=REPO)
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f != TEST_XLA_FLAGS)
  return env


def config_module(name: str):
  """configs/<name>.py as a module, loaded by path (as --config does)."""
  from dmpo_jax.training import config as config_lib
  return config_lib.load_config_module(os.path.join(REPO, "configs", name + ".py"))


def smoke(arg="smoke", **over):
  """configs/nphard.py:<arg> without TensorBoard, with dotted-path overrides
  (smoke(**{"rl.steps": 2}))."""
  cfg = config_module("nphard").get_config(arg)
  cfg.log.tensorboard = False
  return override(cfg, **over)


def override(cfg, **over):
  """Set dotted-path fields of a config in place (override(cfg, **{"rl.steps": 2})); returns it."""
  for path, value in over.items():
    node = cfg
    *parents, leaf = path.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return cfg


def tiny_hf(path, arch="qwen2", *, tie=False, vocab=97, seed=0, **overrides):
  """A random tiny transformers model of `arch`, saved to `path`; returns the torch model."""
  import torch
  import transformers

  torch.manual_seed(seed)
  kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rope_theta=5000.0,
            tie_word_embeddings=tie, rms_norm_eps=1e-6)
  kw.update(overrides)
  if arch == "qwen2":
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
  else:
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
  return perturb_and_save(model, path)


def perturb_and_save(model, path):
  """Weights larger than init, so that differences show; then save the folder."""
  import torch

  model.eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  model.save_pretrained(path)
  return model


def tiny_config(**kw):
  from dmpo_jax.models.config import ModelConfig

  base = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
              num_kv_heads=2, qkv_bias=True, rope_theta=10000.0)
  base.update(kw)
  return ModelConfig(**base)


@functools.cache
def _jit_call():
  """The one jitted `nnx.merge(graphdef, state)(*args, **kw)` (made on first use)."""
  import jax
  from flax import nnx
  return jax.jit(lambda graphdef, state, *args, **kw: nnx.merge(graphdef, state)(*args, **kw))


def jitted(model):
  """`model(...)` under jax.jit, compiled once per shape (one jitted function for every model,
  so a model's calls of one shape compile once): eager calls dispatch op by op, which costs
  seconds per call in a loop of decode steps."""
  from flax import nnx
  graphdef, state = nnx.split(model)
  return lambda *args, **kw: _jit_call()(graphdef, state, *args, **kw)


def tiny_model(seed=0, scale=None, **kw):
  """Our Transformer with random weights; `scale` multiplies the embeddings so that
  next-token distributions are far from uniform."""
  import jax
  from flax import nnx

  from dmpo_jax.models.transformer import Transformer

  model = Transformer(tiny_config(**kw), rngs=nnx.Rngs(seed))
  if scale is not None:
    model.embed[...] = model.embed[...] * scale
    if not model.cfg.tie_embeddings:
      model.lm_head[...] = model.lm_head[...] * scale
  return model


def random_prompts(n, lo, hi, vocab, seed=0):
  rs = np.random.RandomState(seed)
  return [list(rs.randint(3, vocab, rs.randint(lo, hi + 1))) for _ in range(n)]


# --- a tiny Qwen2.5-VL ----------------------------------------------------------------------

START, IMAGE, END = 7, 8, 9  # the tiny tokenizer's <|vision_start|>, <|image_pad|>, <|vision_end|>


def tiny_vl_hf_config(start=START, image=IMAGE, end=END):
  """The tiny Qwen2.5-VL config of the VL tests (token ids as the caller's tokenizer has them)."""
  from transformers import Qwen2_5_VLConfig

  # window_size 56 = 2 merged tokens a side: each image is cut into several windows (one of
  # them partial); vision block 1 attends over the whole image, blocks 0 and 2 in windows.
  vc = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, in_channels=3,
            patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=56,
            out_hidden_size=40, fullatt_block_indexes=[1])
  tc = dict(vocab_size=101, hidden_size=40, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "mrope_section": [2, 1, 2]})
  return Qwen2_5_VLConfig(vision_config=vc, text_config=tc, image_token_id=image,
                          video_token_id=100, vision_start_token_id=start,
                          vision_end_token_id=end)


def save_tiny_vl_processor(path, vision_cfg):
  """A word-level tokenizer with the vision special tokens, and an image processor of at
  most 16 merged patches per image."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  from dmpo_jax.models.vl_processor import VLProcessor, build_image_processor

  words = ["<pad>", "<unk>", "describe", "the", "graph", "answer", ":"]
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")
  fast.add_special_tokens({"additional_special_tokens": ["<|vision_start|>", "<|image_pad|>",
                                                        "<|vision_end|>"]})
  ip = build_image_processor(vision_cfg, min_pixels=28 * 28, max_pixels=28 * 28 * 16)
  VLProcessor(fast, ip).save_pretrained(path)


def tiny_vl_folder(path, seed=0):
  """A random tiny transformers Qwen2.5-VL (weights perturbed so every tensor matters) saved
  to `path` with a tokenizer and image processor; returns the torch model."""
  import json
  import os

  import torch
  from transformers import Qwen2_5_VLForConditionalGeneration

  from dmpo_jax.models import vision

  torch.manual_seed(seed)
  model = perturb_and_save(Qwen2_5_VLForConditionalGeneration(tiny_vl_hf_config()), path)
  with open(os.path.join(path, "config.json")) as f:
    save_tiny_vl_processor(path, vision.vision_config_from_hf(json.load(f)))
  return model


# Invariance tests: runs that differ only in summation order (mesh shape, micro-batches,
# processes) agree in float32 up to reordering noise, ~1e-7 relative in a loss or gradient.
# Adam divides by sqrt(v): where a gradient element sits near zero (|g| ~ its own rounding
# noise), the noise can move that element's update by up to a whole step, so parameters after
# Adam cannot be compared at the gradients' tolerance. What a real bug does is different: a lost
# optimizer state, a reset reference policy or a wrong shard moves whole tensors, not single
# elements. Hence two bounds for parameters after Adam (docs/TRAINING.md, "Testing"):
#   1. tight: |a - b| <= PARAM_ATOL + PARAM_RTOL |b| for all but at most
#      max(1, OUTLIER_FRACTION x size) elements of each tensor and OUTLIER_FRACTION of all;
#   2. ceiling: every element within 2 x ADAM_STEP_BOUND x (sum of the learning rates), the
#      most two Adam trajectories from one start can part (Kingma & Ba, arXiv 1412.6980,
#      sec. 2.1: |step| <= lr (1 - b1) / sqrt(1 - b2) = 3.16 lr at b1 = 0.9, b2 = 0.999).
PARAM_RTOL, PARAM_ATOL = 1e-5, 1e-6
OUTLIER_FRACTION = 1e-3
ADAM_STEP_BOUND = 3.2


def assert_adam_close(a_tree, b_tree, *, lr_sum: float, names=None):
  """Parameters after Adam from two runs that differ only in summation order agree: see above.
  lr_sum: the sum of the learning rates of every Adam step either run took (an upper bound)."""
  import jax

  a_leaves, b_leaves = jax.tree.leaves(a_tree), jax.tree.leaves(b_tree)
  assert len(a_leaves) == len(b_leaves), (len(a_leaves), len(b_leaves))
  names = names or [str(i) for i in range(len(a_leaves))]
  ceiling = 2 * ADAM_STEP_BOUND * lr_sum
  total = outliers = 0
  for name, a, b in zip(names, a_leaves, b_leaves):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (name, a.shape, b.shape)
    diff = np.abs(a - b)
    out = diff > PARAM_ATOL + PARAM_RTOL * np.abs(b)
    n_out = int(out.sum())
    assert n_out <= max(1, int(OUTLIER_FRACTION * a.size)), (
        f"{name}: {n_out} of {a.size} elements beyond the tight bound (max diff {diff.max():.3g}): "
        "more than float32 reordering noise through Adam")
    assert diff.max() <= ceiling, (
        f"{name}: an element differs by {diff.max():.3g}, more than two Adam trajectories can "
        f"part ({ceiling:.3g} = 2 x {ADAM_STEP_BOUND} x sum of learning rates {lr_sum:.3g})")
    total, outliers = total + a.size, outliers + n_out
  assert outliers <= OUTLIER_FRACTION * total, (outliers, total)


def adam_lr_sum(cfg) -> float:
  """An upper bound on the sum of the learning rates of a training config's Adam steps (the
  schedules never exceed their peak lr)."""
  return cfg.sft.lr * max(cfg.sft.steps, 0) + cfg.rl.lr * max(cfg.rl.steps, 0)


TIMINGS = {"rollout_s", "reward_s", "update_s"}  # metrics that differ between identical runs


def saved_state(workdir, step):
  """The params and optimizer state of a workdir's checkpoint, as numpy leaves."""
  import jax
  import orbax.checkpoint as ocp
  state = ocp.PyTreeCheckpointer().restore(str(workdir / "checkpoints" / str(step) / "state"))
  return jax.tree.map(np.asarray, state)


def metric_rows(workdir):
  """A workdir's metrics.jsonl rows without the timings."""
  import json
  rows = [json.loads(l) for l in open(workdir / "metrics.jsonl")]
  return [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]


def checkpoint_tensors(path):
  """The tensors of a folder's model.safetensors, as numpy arrays by name."""
  from safetensors.numpy import load_file

  return load_file(os.path.join(path, "model.safetensors"))


def write_checkpoint(path, config: dict, tensors: dict) -> None:
  """A Hugging Face folder: config.json and model.safetensors (PyTorch's metadata)."""
  import json

  from safetensors.numpy import save_file

  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def run_evaluate(argv, capsys):
  """`python -m dmpo_jax.evaluate` in this process: (exit status, stdout, stderr)."""
  from dmpo_jax import evaluate
  evaluate.FLAGS.unparse_flags()
  code = 0
  try:
    evaluate.main(evaluate.FLAGS(["evaluate"] + argv))
  except SystemExit as e:
    code = e.code
  finally:
    evaluate.FLAGS.unparse_flags()
  out = capsys.readouterr()
  return code, out.out, out.err
