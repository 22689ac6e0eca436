"""Can the from-scratch vision tower read, with the language model taken out? (docs/MULTIMODAL.md)

The tower of `configs/mm_nphard.py` (2 blocks of width 64, 14-px patches, 2 x 2 merge) and a
linear head on its flattened merged features name each of subset-sum's 4-5 values (classes
1-9, and "no item" for a missing fifth), trained with cross-entropy on --train renders and
scored on --test others (different seeds). The pixel statistics are the processor's CLIP ones
or white-at-zero (`config.image.mean/std` of the config).

    python scripts/tower_probe.py --stats=clip --tower=train     # learns nothing
    python scripts/tower_probe.py --stats=clip --tower=frozen    # a linear probe of the random tower
    python scripts/tower_probe.py --stats=white --tower=train    # reads every value
"""

from __future__ import annotations

import argparse
import collections
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dmpo_jax import tasks
from dmpo_jax.models import vision as V
from dmpo_jax.models import vl_processor as VP

STATS = {"white": ((1.0, 1.0, 1.0), (0.5, 0.5, 0.5)), "clip": (None, None)}
SLOTS, CLASSES = 5, 11  # values 1-9; 10 = no item


def renders(proc, seeds, size: int):
  task = tasks.get("subset-sum")
  xs, ys, grid = [], [], None
  for s in seeds:
    q = task.generate(s, "tiny")
    values = task.problem(q).values
    out = proc(images=[task.render(q, size)], return_tensors="np")
    xs.append(out["pixel_values"])
    grid = out["image_grid_thw"]
    y = [values[i] for i in sorted(values)][:SLOTS]
    ys.append(y + [CLASSES - 1] * (SLOTS - len(y)))
  return np.stack(xs), np.asarray(ys), grid


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--stats", choices=sorted(STATS), default="white")
  ap.add_argument("--tower", choices=("train", "frozen"), default="train")
  ap.add_argument("--size", type=int, default=224, help="render size (scaled to the 224-px grid)")
  ap.add_argument("--steps", type=int, default=800)
  ap.add_argument("--train", type=int, default=4000)
  ap.add_argument("--test", type=int, default=1000)
  ap.add_argument("--lr", type=float, default=2e-3)
  args = ap.parse_args(argv)
  cfg = V.VisionConfig(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, patch_size=14,
                       temporal_patch_size=2, spatial_merge_size=2, window_size=56,
                       fullatt_block_indexes=(1,), out_hidden_size=128)
  mean, std = STATS[args.stats]
  proc = VP.build_image_processor(cfg, min_pixels=224 * 224, max_pixels=224 * 224, mean=mean, std=std)
  t0 = time.time()
  x_train, y_train, grid = renders(proc, range(100_000, 100_000 + args.train), args.size)
  x_test, y_test, _ = renders(proc, range(args.test), args.size)
  print(f"{len(x_train)} + {len(x_test)} renders in {time.time() - t0:.0f} s", flush=True)
  layout = {k: jnp.asarray(v) for k, v in V.vision_layout(grid, cfg).items()}
  tokens = int(layout["valid"].shape[0])

  class Probe(nnx.Module):
    def __init__(self, rngs):
      self.tower = V.VisionTower(cfg, rngs=rngs)
      self.head = nnx.Linear(tokens * cfg.out_hidden_size, SLOTS * CLASSES, rngs=rngs)

    def __call__(self, x):
      f = jax.vmap(lambda p: self.tower(p, layout))(x)
      return self.head(f.reshape(f.shape[0], -1)).reshape(-1, SLOTS, CLASSES)

  model = Probe(nnx.Rngs(0))
  wrt = nnx.Param if args.tower == "train" else nnx.All(nnx.Param, nnx.PathContains("head"))
  opt = nnx.Optimizer(model, optax.adamw(args.lr), wrt=wrt)

  @nnx.jit
  def step(model, opt, x, y):
    loss = lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()
    value, grads = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, wrt))(model)
    opt.update(model, grads)
    return value

  @nnx.jit
  def correct(model, x, y):
    return (model(x).argmax(-1) == y).sum()

  def accuracy():
    hits = sum(int(correct(model, jnp.asarray(x_test[i:i + 100]), jnp.asarray(y_test[i:i + 100])))
               for i in range(0, len(x_test), 100))
    return hits / y_test.size

  majority = np.mean([(y_test[:, s] == collections.Counter(y_train[:, s]).most_common(1)[0][0]).mean()
                      for s in range(SLOTS)])
  print(f"majority-class slot accuracy (no reading): {majority:.3f}", flush=True)
  rng = np.random.default_rng(0)
  for i in range(args.steps):
    idx = rng.integers(0, len(x_train), 32)
    loss = step(model, opt, jnp.asarray(x_train[idx]), jnp.asarray(y_train[idx]))
    if i % 100 == 0 or i == args.steps - 1:
      print(f"stats {args.stats}, tower {args.tower}, step {i}: loss {float(loss):.3f}, "
            f"held-out slot accuracy {accuracy():.3f} ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
  main()
