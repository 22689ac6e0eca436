"""The prefix-shared update forward (steps.make_logprob_fn(prefix_shared=...),
Transformer.shared_hidden, attention.attend_shared) equals the per-row forward: log-probs
within 1e-5 and loss gradients within 1e-4 relative (float32), for every text family, left
padding, GQA and group sizes 1, 2 and 8; planted off-by-ones fail the same comparison; its
compiled FLOPs drop as the token and attention counts say."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dmpo_jax.models import attention
from dmpo_jax.models import lora as lora_lib
from dmpo_jax.models import positions as positions_lib
from dmpo_jax.models.config import LoRAConfig
from dmpo_jax.models.transformer import Transformer
from dmpo_jax.objectives import flowrl, presets
from dmpo_jax.training import steps
from tests.helpers import tiny_config

LP, LT = 7, 5  # prompt slots, completion tokens

# Every text family ModelConfig covers: Qwen2 (q/k/v biases, untied, GQA 4/2), Llama 3
# (tied, llama3 RoPE scaling, one kv head), Qwen3 (q/k norms, tied, H != D / N, MHA), and
# Qwen2 with remat, with the fused 'xla' core (the GPU's in float32), and with LoRA adapters.
FAMILIES = {
    "qwen2": dict(),
    "llama3": dict(architecture="llama", qkv_bias=False, tie_embeddings=True, num_kv_heads=1,
                   rope_type="llama3", rope_original_max_position=8),
    "qwen3": dict(architecture="qwen3", qkv_bias=False, qk_norm=True, tie_embeddings=True,
                  num_kv_heads=4, head_dim=16),
    "qwen2_remat": dict(remat=True),
    "qwen2_xla": dict(attention="xla"),  # the fused-core branch (jax.nn.dot_product_attention)
    "qwen2_lora": dict(lora=LoRAConfig(rank=2)),  # adapters on every projection, base frozen
}


def _model(family, seed=0):
  model = Transformer(tiny_config(**FAMILIES[family]), rngs=nnx.Rngs(seed))
  # Sharper distributions than the 0.02 init: log-probs and gradients far from uniform.
  model.embed[...] = model.embed[...] * 4.0
  for n, adapter in enumerate(lora_lib.adapters(model).values()):  # B = 0 would do nothing
    adapter.lora_b[...] = 0.05 * jax.random.normal(jax.random.key(n), adapter.lora_b.shape)
  graphdef, state = nnx.split(model)
  return graphdef, {"model": state}


def _batch(prompts, g, seed=0, pads=None, vocab=61):
  """An RL batch of `prompts` x g rows: left-padded prompts (pads: each prompt's pad count,
  0 .. LP - 1), each repeated over its group, then random completions."""
  rs = np.random.RandomState(seed)
  pads = rs.randint(0, LP, prompts) if pads is None else np.asarray(pads)
  pt = rs.randint(3, vocab, (prompts, LP)).astype(np.int32)
  pm = (np.arange(LP)[None, :] >= pads[:, None]).astype(np.int32)
  pt = np.where(pm == 1, pt, 0)
  tokens = np.concatenate([np.repeat(pt[:, None], g, 1),
                           rs.randint(3, vocab, (prompts, g, LT))], -1).astype(np.int32)
  return {"seqs": {"tokens": tokens, "prompt_mask": np.repeat(pm[:, None], g, 1)},
          "mask": (rs.random_sample((prompts, g, LT)) < 0.8).astype(np.int32),
          "old_logprobs": rs.normal(-4, 0.3, (prompts, g, LT)).astype(np.float32),
          "rewards": rs.random_sample((prompts, g)).astype(np.float32)}


def _grpo_like(fn):
  """A clipped-ratio policy gradient with group-normalised advantages that also holds for
  groups of one (GRPO's own std needs G >= 2), plus a small entropy term."""

  def loss(params, batch):
    out = fn(params, batch["seqs"])
    r = batch["rewards"]
    adv = (r - r.mean(-1, keepdims=True)) / (r.std(-1, keepdims=True) + 1.0) + r
    ratio = jnp.exp(out["logprobs"] - batch["old_logprobs"])
    obj = jnp.minimum(ratio * adv[..., None], jnp.clip(ratio, 0.8, 1.2) * adv[..., None])
    m = batch["mask"]
    return -jnp.sum(obj * m) / jnp.sum(m) - 0.01 * jnp.mean(out["entropy"])

  return loss


def _max_rel(a, b):
  """Largest leaf-wise max |a - b| / max |a| over two params-shaped trees."""
  return max(float(jnp.max(jnp.abs(x - y)) / jnp.maximum(jnp.max(jnp.abs(x)), 1e-30))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _loss(name, fn):
  """(params, batch) -> the scalar loss: "like" (`_grpo_like`) or a preset's `build_loss`."""
  if name == "like":
    return _grpo_like(fn)
  full = presets.build_loss(presets.objective_config(name), fn)
  return lambda params, batch: full(params, batch)[0]


def _compare(graphdef, params, batch, losses=("like",)):
  """(max |log-prob difference|, max |entropy difference|, {loss: max relative gradient
  difference}) of the prefix-shared forward against the per-row one."""
  per_row = steps.make_logprob_fn(graphdef, LP, prefix_shared=False)
  shared = steps.make_logprob_fn(graphdef, LP, prefix_shared=True)
  want, got = jax.jit(per_row)(params, batch["seqs"]), jax.jit(shared)(params, batch["seqs"])
  assert [p[0] for p in shared.paths] == ["prefix_shared"]
  assert [p[0] for p in per_row.paths] == ["per_row"]
  lp = float(jnp.max(jnp.abs(want["logprobs"] - got["logprobs"])))
  ent = float(jnp.max(jnp.abs(want["entropy"] - got["entropy"])))
  grad = lambda name, fn: jax.jit(jax.grad(_loss(name, fn)))(params, batch)
  return lp, ent, {name: _max_rel(grad(name, per_row), grad(name, shared)) for name in losses}


@pytest.mark.slow
@pytest.mark.parametrize("g,prompts", [(1, 4), (2, 3), (8, 2)])
def test_attend_shared_equals_attention_over_the_repeated_prefix(g, prompts):
  """The core and its hand-written backward against `attention.attend` over [prefix | own]
  keys with the prefix repeated per row (GQA: 2 query heads per kv head)."""
  b, k, gq, s, p, h = prompts * g, 2, 2 * 3, 3, 5, 8
  keys = jax.random.split(jax.random.key(g), 6)
  q = jax.random.normal(keys[0], (b, k, gq, h))
  kk, v = jax.random.normal(keys[1], (b, k, h, s)), jax.random.normal(keys[2], (b, k, s, h))
  pk = jax.random.normal(keys[3], (prompts, k, h, p))
  pv = jax.random.normal(keys[4], (prompts, k, p, h))
  w = jax.random.normal(keys[5], (b, k, gq, h))
  offsets = jnp.arange(prompts) % p  # prompt i has i pad keys
  pmask = (jnp.arange(p)[None, :] >= offsets[:, None])[:, None, None, :]
  mask = attention.grouped_mask(jnp.tril(jnp.ones((1, s, s), bool)), 2)
  rep = lambda x: jnp.repeat(x, g, axis=0)

  def plain(q, kk, v, pk, pv):
    m = jnp.concatenate([jnp.broadcast_to(rep(pmask), (b, 1, gq, p)),
                         jnp.broadcast_to(mask, (b, 1, gq, s))], -1)
    return attention.attend(q, jnp.concatenate([rep(pk), kk], -1),
                            jnp.concatenate([rep(pv), v], -2), m)

  shared = lambda q, kk, v, pk, pv: attention.attend_shared(q, kk, v, mask, pk, pv, pmask)
  args = (q, kk, v, pk, pv)
  np.testing.assert_allclose(jax.jit(shared)(*args), jax.jit(plain)(*args), atol=1e-5, rtol=0)
  grad = lambda f: jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=range(5)))(*args)
  g_want, g_got = grad(plain), grad(shared)
  for name, a, e in zip(("q", "k", "v", "pk", "pv"), g_got, g_want):
    np.testing.assert_allclose(a, e, atol=1e-4, rtol=0, err_msg=f"d{name}")


ALL = ("like", "grpo", "dmpo")
# Each family once, at a group size of 2 or 8 in turn; Qwen2 (and its LoRA variant) at every
# group size with every loss. A slow case compiles two forwards and up to six gradients
# (~25-45 s of CPU); the fast tier compares the log-probs and entropies alone, once.
GRID = [pytest.param(f, g, n, losses, id=f"{f}-G{g}", marks=pytest.mark.slow) for f, g, n, losses in (
    ("qwen2", 1, 4, ("like",)), ("qwen2", 2, 3, ALL), ("qwen2", 8, 2, ALL), ("qwen2_lora", 8, 2, ALL),
    ("llama3", 8, 2, ("like",)), ("qwen3", 2, 3, ("like",)), ("qwen2_remat", 8, 2, ("like",)),
    ("qwen2_xla", 2, 3, ("like",)))] + [pytest.param("qwen2", 2, 3, (), id="qwen2-G2-forward")]


@pytest.mark.parametrize("family,g,prompts,losses", GRID)
def test_prefix_shared_logprobs_and_gradients_equal_per_row(family, g, prompts, losses):
  graphdef, params = _model(family)
  # Pads from none to LP - 1 (a one-token prompt) across the prompts.
  pads = np.linspace(0, LP - 1, prompts).astype(int)
  batch = _batch(prompts, g, seed=g, pads=pads)
  lp, ent, grads = _compare(graphdef, params, batch, losses)
  assert lp < 1e-5 and ent < 1e-5, (lp, ent)
  assert set(grads) == set(losses)
  for name, err in grads.items():
    assert err < 1e-4, (name, err)


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["position", "mask"])
def test_a_planted_off_by_one_fails_the_comparison(monkeypatch, planted):
  """The comparison above can fail: completion positions shifted by one, or one pad key of
  the prompt made visible, move log-probs and gradients far past its tolerances."""
  graphdef, params = _model("qwen2")
  batch = _batch(3, 2, seed=1, pads=[0, 2, 5])
  if planted == "position":
    slot_positions = positions_lib.slot_positions
    monkeypatch.setattr(positions_lib, "slot_positions",  # the completions' start != 0
                        lambda o, n, start=0: slot_positions(o, n, start) + (start != 0))
  else:
    attend_shared = attention.attend_shared
    monkeypatch.setattr(attention, "attend_shared", lambda q, k, v, m, pk, pv, pm: attend_shared(
        q, k, v, m, pk, pv, pm | jnp.roll(pm, -1, axis=-1)))  # slot offset - 1 visible too
  lp, _, grads = _compare(graphdef, params, batch)
  assert lp > 10 * 1e-5 and grads["like"] > 10 * 1e-4, (lp, grads)  # 10x the tolerances


@pytest.mark.slow
def test_flowrl_log_z_and_its_gradient_equal_per_row():
  graphdef, params = _model("qwen2")
  params["log_z"] = flowrl.init_log_z_head(jax.random.key(3), 32)
  batch = _batch(3, 4, seed=2)
  batch["ref_logprobs"] = batch["old_logprobs"] - 0.1
  per_row = steps.make_logprob_fn(graphdef, LP, prefix_shared=False)
  shared = steps.make_logprob_fn(graphdef, LP, prefix_shared=True)
  log_z = lambda fn: jax.jit(fn)(params, batch["seqs"])["log_z"]
  np.testing.assert_allclose(log_z(shared), log_z(per_row), atol=1e-5, rtol=0)
  grad = lambda fn: jax.jit(jax.grad(_loss("flowrl", fn)))(params, batch)
  assert _max_rel(grad(per_row), grad(shared)) < 1e-4


@pytest.mark.slow
def test_flat_rows_with_a_group_size_and_the_jitted_eval():
  """Flat seqs [B, P+T] in groups of group_size adjacent rows (the reference pass's and DPH
  pre-sampling's layout): make_logprob_eval's group_size picks the shared forward, also with
  the rows sharded over 4 devices."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec
  graphdef, params = _model("qwen3")
  batch = _batch(2, 4, seed=3)
  mesh = Mesh(np.asarray(jax.devices()[:4]), ("data",))
  data_sh = NamedSharding(mesh, PartitionSpec("data"))
  p_sh = jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), params)
  flat = {k: jax.device_put(np.reshape(v, (8, -1)), data_sh) for k, v in batch["seqs"].items()}
  want = steps.make_logprob_eval(graphdef, LP, 0.9, prefix_shared=False)(params, flat)
  auto = steps.make_logprob_eval(graphdef, LP, 0.9, shardings=(p_sh, data_sh, None),
                                 prefix_shared=None)
  before = steps.PATHS.copy()
  got = auto(params, flat, group_size=4)
  alone = auto(params, flat)  # no group size: per row
  new = steps.PATHS - before
  assert new == {("prefix_shared", "2 prompts x 4", 4): 1,
                 ("per_row", "flat seqs [B, P+T] and no group_size", 1): 1}, new
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  np.testing.assert_array_equal(alone, want)


@pytest.mark.slow
def test_the_update_with_micro_batches_equals_per_row():
  """One SGD step of make_rl_step (DMPO) with whole groups per micro-batch: the same params."""
  graphdef, params = _model("qwen2")
  batch = _batch(4, 2, seed=4)
  obj = presets.objective_config("dmpo")
  out = {}
  for shared, mb in ((False, 1), (None, 1), (None, 4)):
    opt = optax.sgd(0.5)
    p0 = jax.tree.map(jnp.copy, params)
    step = steps.make_rl_step(graphdef, obj, opt, LP, 1.0, micro_batches=mb, prefix_shared=shared)
    out[shared, mb] = step(p0, opt.init(p0), batch)
  moved = lambda new: jax.tree.map(lambda a, b: a - b, new, params)  # the step's update
  for key in ((None, 1), (None, 4)):
    np.testing.assert_allclose(float(out[key][2]["loss"]), float(out[False, 1][2]["loss"]),
                               rtol=1e-5)
    assert _max_rel(moved(out[False, 1][0]), moved(out[key][0])) < 1e-4, key


def test_which_forward_runs_and_refusals():
  graphdef, params = _model("qwen2")
  batch = _batch(2, 1, seed=5)
  auto = steps.make_logprob_fn(graphdef, LP, prefix_shared=None)
  jax.eval_shape(auto, params, batch["seqs"])  # groups of one: nothing to share
  assert list(auto.paths) == [("per_row", "groups of one (nothing to share)", 1)]
  images = dict(batch["seqs"], images={"deltas": jnp.zeros((2, 1))})
  with pytest.raises(ValueError, match="image prompts"):
    steps.make_logprob_fn(graphdef, LP, prefix_shared=True)(params, images)
  flat = {k: jnp.asarray(v).reshape(2, -1) for k, v in batch["seqs"].items()}
  with pytest.raises(ValueError, match="no group_size"):
    steps.make_logprob_fn(graphdef, LP, prefix_shared=True)(params, flat)
  with pytest.raises(ValueError, match="prefix_shared must be"):
    steps.make_logprob_fn(graphdef, LP, prefix_shared="yes")


def test_rows_whose_prompt_is_not_their_groups_get_nan():
  """A layout error (a row's prompt differs from its group's first row's) is not trained on
  silently: those rows' log-probs are NaN; pad ids do not count."""
  graphdef, params = _model("qwen2")
  batch = _batch(2, 3, seed=6, pads=[2, 0])
  tokens = batch["seqs"]["tokens"].copy()
  tokens[0, 1, 0] = 5  # a pad slot: ignored
  tokens[1, 2, 3] = (tokens[1, 2, 3] + 1) % 61  # a real prompt token: row (1, 2) is wrong
  seqs = dict(batch["seqs"], tokens=tokens)
  fn = jax.jit(steps.make_logprob_fn(graphdef, LP, prefix_shared=True))
  lp = np.asarray(fn(params, seqs)["logprobs"])
  bad = np.isnan(lp).all(-1)
  assert bad.tolist() == [[False, False, False], [False, False, True]]
  assert not np.isnan(lp[~bad]).any()


def _forward_flops(graphdef, params, lp, shared, prompts, g, lt):
  fn = steps.make_logprob_fn(graphdef, lp, entropy=False, prefix_shared=shared)
  seqs = {"tokens": jnp.zeros((prompts, g, lp + lt), jnp.int32),
          "prompt_mask": jnp.ones((prompts, g, lp), jnp.int32)}
  cost = jax.jit(lambda p, s: fn(p, s)["logprobs"]).lower(params, seqs).compile().cost_analysis()
  return float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])


@pytest.mark.parametrize("lp", [16, 64])
@pytest.mark.slow
def test_forward_flops_drop_as_counted(lp):
  """XLA's cost analysis of the compiled forward against a count of its matmuls.

  Per layer and token the projections cost lin = 2 (2 D N H + 2 D K H + 3 D F); each
  (query, key) pair of the reference core 4 N H (Q K^T and P V); the output projection 2 D V
  per completion token in both forwards. With Bp prompts of P slots, B = G Bp rows and T
  completion tokens:

    per row: layers x (B (P+T-1) lin + B (P+T-1)^2 4NH)                    + B T 2DV
    shared:  layers x ((Bp P + B (T-1)) lin + Bp P^2 4NH + B (T-1)(P+T-1) 4NH) + B T 2DV

  For D=64, F=128, N=4, K=2, H=16, V=64, 2 layers, Bp=2, G=8, T=16 that is a ratio of
  0.557 at P=16 and 0.293 at P=64; the measured ratio (which also counts softmax, norms and
  RoPE) must be within 0.02 of it."""
  cfg = tiny_config(hidden_size=64, intermediate_size=128, vocab_size=64)
  graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  params = {"model": state}
  prompts, g, lt = 2, 8, 16
  d, f, n, k, h, v = 64, 128, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 64
  b, l1 = prompts * g, lp + lt - 1
  lin, pair, head = 2 * (2 * d * n * h + 2 * d * k * h + 3 * d * f), 4 * n * h, b * lt * 2 * d * v
  per_row = cfg.num_layers * (b * l1 * lin + b * l1 * l1 * pair) + head
  shared = cfg.num_layers * ((prompts * lp + b * (lt - 1)) * lin + prompts * lp * lp * pair
                             + b * (lt - 1) * l1 * pair) + head
  expected = shared / per_row
  assert abs(expected - {16: 0.557, 64: 0.293}[lp]) < 1e-3
  measured = (_forward_flops(graphdef, params, lp, True, prompts, g, lt)
              / _forward_flops(graphdef, params, lp, False, prompts, g, lt))
  assert abs(measured - expected) < 0.02, (measured, expected)


def _broken(batch, masked=False):
  """The batch with row (1, 2)'s real prompt token 3 changed: the [prompts, G] layout claims
  a group that is not one. masked: that row's completion mask 0 too (its NaN log-probs
  multiplied by 0 in a masked mean)."""
  tokens = batch["seqs"]["tokens"].copy()
  tokens[1, 2, 3] = (tokens[1, 2, 3] + 1) % 61
  mask = batch["mask"].copy()
  if masked:
    mask[1, 2] = 0
  return dict(batch, seqs=dict(batch["seqs"], tokens=tokens), mask=mask)


@pytest.mark.slow
@pytest.mark.parametrize("masked", [False, True])
def test_an_update_whose_groups_do_not_hold_is_skipped_and_counted(masked):
  """make_rl_step's default (prefix_shared=None) on [prompts, G] rows whose prompt is not
  their group's: the step is skipped (params and optimizer state bit-identical) and
  metrics["prefix_layout_errors"] counts the row, with micro-batches too; the per-row forward
  (prefix_shared=False) trains on the same batch and counts nothing; the intact batch trains
  with the default and counts nothing."""
  graphdef, params = _model("qwen2")
  good = _batch(4, 3, seed=7, pads=[0, 0, 2, 4])  # row (1, 2)'s prompt slot 3 is real
  bad = _broken(good, masked)
  obj = presets.objective_config("grpo")

  opt = optax.adam(1e-2)

  def run(step, batch):
    p0 = jax.tree.map(jnp.copy, params)
    new, state, m = step(p0, opt.init(p0), batch)
    moved = max(float(jnp.max(jnp.abs(a - b)))
                for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(params)))
    return int(m["skipped"]), int(m["prefix_layout_errors"]), moved

  make = lambda **kw: steps.make_rl_step(graphdef, obj, opt, LP, 1.0, **kw)
  for kw in ({}, {"micro_batches": 2}):
    before = steps.PATHS.copy()
    step = make(**kw)
    assert run(step, bad) == (1, 1, 0.0), kw  # skipped, counted, nothing moved
    assert {p[0] for p in steps.PATHS - before} == {"prefix_shared"}, kw
    skipped, errors, moved = run(step, good)
    assert (skipped, errors) == (0, 0) and moved > 0, kw
  skipped, errors, moved = run(make(prefix_shared=False), bad)
  assert (skipped, errors) == (0, 0) and moved > 0


def test_forward_path_is_what_make_logprob_fn_runs():
  """`forward_path` (what the stages report) decides from the shapes alone, and the traced
  function counts the same (forward, why, G)."""
  graphdef, params = _model("qwen2")
  batch = _batch(3, 4, seed=8)
  flat = {k: jnp.asarray(v).reshape(12, -1) for k, v in batch["seqs"].items()}
  for prefix_shared, seqs, g, want in (
      (None, batch["seqs"], None, ("prefix_shared", "3 prompts x 4", 4)),
      (None, flat, 4, ("prefix_shared", "3 prompts x 4", 4)),
      (None, flat, None, ("per_row", "flat seqs [B, P+T] and no group_size", 1)),
      (None, flat, 5, ("per_row", "12 rows are not groups of 5", 1)),
      (False, batch["seqs"], None, ("per_row", "prefix_shared=False", 1))):
    fn = steps.make_logprob_fn(graphdef, LP, prefix_shared=prefix_shared)
    assert steps.forward_path(prefix_shared, seqs, LP, g) == want
    jax.eval_shape(lambda p, s: fn(p, s, g), params, seqs)
    assert list(fn.paths) == [want]
  default = steps.make_logprob_fn(graphdef, LP)  # prefix_shared=None
  jax.eval_shape(default, params, batch["seqs"])
  assert list(default.paths) == [("prefix_shared", "3 prompts x 4", 4)]
  with pytest.raises(ValueError, match="prefix_shared=True does not apply: flat seqs"):
    steps.forward_path(True, flat, LP)
