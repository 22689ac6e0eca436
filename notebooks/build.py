"""Writes the notebooks (without outputs) from the cell sources below.

    python notebooks/build.py

Edit the cells here, not in the .ipynb files: the notebooks stay small,
reviewable and free of outputs. tests/notebooks/test_notebooks.py executes both.
"""

import os

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))

SETUP = r'''# Install: set DMPO_JAX_SOURCE to a local checkout of this repository or to its git URL
# (e.g. os.environ["DMPO_JAX_SOURCE"] = "/content/dmpo_jax"); skipped when dmpo_jax is importable.
import importlib.util, os, pathlib, subprocess, sys
if importlib.util.find_spec("dmpo_jax") is None:
    SOURCE = os.environ.get("DMPO_JAX_SOURCE")
    if not SOURCE:
        raise RuntimeError("dmpo_jax is not installed and DMPO_JAX_SOURCE is not set: set it to a "
                           "local checkout of the repository or to its git URL, then rerun this cell")
    if not os.path.isdir(SOURCE):
        subprocess.check_call(["git", "clone", "-q", SOURCE, "dmpo_jax_repo"])
        SOURCE = "dmpo_jax_repo"
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "-e", SOURCE])
    sys.path.insert(0, os.path.abspath(SOURCE))
import dmpo_jax
REPO = pathlib.Path(dmpo_jax.__file__).resolve().parent.parent
# The tests set DMPO_NOTEBOOK_SMALL=1: the smallest budget that still runs every cell.
SMALL = os.environ.get("DMPO_NOTEBOOK_SMALL", "0") == "1"
print("dmpo_jax from", REPO, "| small budget:", SMALL)'''

QUICKSTART = [
    new_markdown_cell("""# dmpo_jax quickstart

Train a small model from scratch on the ten NP-Bench tasks with **DMPO**
(GRPO plus group-level distribution matching), evaluate it, look at its
answers, and switch to other presets or a real checkpoint. Runs top to
bottom on a CPU, a Colab GPU or a TPU runtime; the config size follows the
backend."""),
    new_code_cell(SETUP),
    new_code_cell(r'''import importlib.util, json
import jax
backend = jax.default_backend()
print("backend:", backend, "| devices:", jax.device_count())

def load_config(name, arg=""):
    spec = importlib.util.spec_from_file_location(name, REPO / "configs" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod.get_config(arg or None)

if SMALL:
    cfg = load_config("nphard", "smoke")            # a few steps of every stage
elif backend == "cpu":
    cfg = load_config("nphard")                     # the embedded default: minutes on a laptop
else:                                               # an accelerator: a wider model, more steps
    cfg = load_config("nphard")
    cfg.model.update(hidden_size=256, intermediate_size=768, num_layers=4, head_dim=64)
    cfg.sft.update(steps=1500, batch_size=128)
    cfg.rl.update(steps=200, prompts_per_step=32)
cfg.log.tensorboard = False
print(cfg.rl.algo, "| SFT steps", cfg.sft.steps, "| RL steps", cfg.rl.steps)'''),
    new_markdown_cell("""## Train: SFT warm start, evaluation, RL with `dmpo`, evaluation

`train()` is what `python -m dmpo_jax.train` runs; the workdir gets
checkpoints, metrics, plots and a Hugging Face export. Rerunning the cell
resumes from the workdir."""),
    new_code_cell(r'''from dmpo_jax.training import stages
workdir = "runs/quickstart_dmpo"
results = stages.train(cfg, workdir)'''),
    new_code_cell(r'''import matplotlib.pyplot as plt
from dmpo_jax.training import report
rows = [r for r in report.read_metrics(f"{workdir}/metrics.jsonl") if r["stage"] == "rl"]
fig, axes = plt.subplots(1, 3, figsize=(13, 3))
for ax, key in zip(axes, ["reward_mean", "qr_mean", "distinct"]):
    ax.plot([r["step"] for r in rows], [r[key] for r in rows])
    ax.set_title(key); ax.set_xlabel("step")
plt.show()
print(json.dumps({k: round(v, 3) for k, v in results["after"]["overall"].items()}, indent=1))'''),
    new_markdown_cell("""## One RL step by hand

What the RL stage repeats: collect rollouts (sample G answers per prompt,
verify them on the host while the device samples, shape the rewards) and
update on that batch. `setup` restores the trained run's state from its
workdir."""),
    new_code_cell(r'''import dataclasses
from dmpo_jax.training import collect_rollouts, run as run_lib, steps, update
run, state = run_lib.setup(cfg, workdir)
sampler = run.sampler(run.sampling_config(cfg.rl.group_size, cfg.rl.temperature))
rl_step = steps.make_rl_step(run.graphdef, run.obj, run.rl_opt, run.prompt_len, cfg.rl.temperature,
                             shardings=(run.p_sh, run.rl_o_sh, run.data_sh, run.rep))
items = run.taskset.train("rl", 10_000, cfg.rl.prompts_per_step)   # instances no step has seen
spec = dataclasses.replace(run.rollout_spec(), chunks=2)   # half scored while half samples
rollouts = collect_rollouts(sampler, state.params, items, run.encoder, spec=spec, rng=state.rl_key())
state, metrics = update(state, rollouts.batch(run.data_sh), rl_step)
run.writer.close(); run.ckpt.close()   # nothing saved: the workdir stays as train() left it
print("rollouts:", {k: round(v, 3) for k, v in rollouts.metrics().items()})
print("update:", {k: round(float(metrics[k]), 4) for k in ("loss", "pg_loss", "dm_loss", "grad_norm")})'''),
    new_markdown_cell("""## The model's answers, with the verifier's verdicts

Each task can draw its instance (MM-NP-Bench); the strict verifier says why
an answer is refused."""),
    new_code_cell(r'''import numpy as np
from dmpo_jax.data import pipeline
from dmpo_jax import sampling, tasks
from dmpo_jax.models import hf
model, tok = hf.load(f"{workdir}/hf")
enc = pipeline.PromptEncoder(tok, "compact", cfg.model.max_prompt_len)
fig, axes = plt.subplots(1, 3, figsize=(15, 5))
for ax, key in zip(axes, ["TSP", "knapsack", "GCP-D"]):
    task = tasks.get(key)
    q = task.generate(1_000_000, cfg.level)
    out = sampling.generate(model, [enc.encode(key, q)], rng=jax.random.key(0),
                            max_new_tokens=cfg.model.max_new_tokens, temperature=0.7,
                            eos_id=tok.eos_token_id)
    text = enc.texts(np.asarray(out.tokens), np.asarray(out.mask))[0]
    v = task.verify(q, text)
    ax.imshow(task.render(q, 384)); ax.axis("off")
    ax.set_title(f"{text[8:40]}\n{'feasible, value %g' % v.value if v.feasible else v.reason[:48]}", fontsize=8)
plt.show()'''),
    new_markdown_cell("""## Image prompts (MM-NP-Bench)

The same tasks with the instance given as an image: a small Qwen2.5-VL trained
from scratch (`configs/mm_nphard.py`) reads the drawing and only the task's
word in text. Evaluation scores the same instances three ways: the image, a
blank image of the same size (the control: a policy that reads the image does
worse there) and the text prompt. The renderer is ours, so these numbers are
not comparable with the paper's MM-NP-Bench figures."""),
    new_code_cell(r'''from dmpo_jax.data import images as mm
from dmpo_jax.training import specs
cfg_mm = load_config("mm_nphard", "smoke,tasks=TSP+knapsack" if SMALL else "")
cfg_mm.log.tensorboard = False
res_mm = stages.train(cfg_mm, "runs/quickstart_mm")
print(report.format_modalities({"modalities": res_mm["modalities"]["after"]}))'''),
    new_code_cell(r'''model_mm, proc = hf.load("runs/quickstart_mm/hf")   # a Qwen2.5-VL folder: model + processor
enc_mm = mm.make_encoder(specs.encoder_spec(cfg_mm), proc)
fig, axes = plt.subplots(1, 2, figsize=(10, 5))
for ax, key in zip(axes, ["TSP", "knapsack"]):
    task = tasks.get(key)
    q = task.generate(1_000_000, cfg_mm.level)
    out = sampling.generate(model_mm, [enc_mm.encode(key, q)], images=[enc_mm.images(key, q)],
                            rng=jax.random.key(0), max_new_tokens=cfg_mm.model.max_new_tokens,
                            temperature=0.7, eos_id=proc.tokenizer.eos_token_id)
    text = enc_mm.texts(np.asarray(out.tokens), np.asarray(out.mask))[0]
    v = task.verify(q, text)
    ax.imshow(task.render(q, cfg_mm.image.size)); ax.axis("off")
    ax.set_title(f"text: {task.prompt(q, 'image')!r}\n{text[8:40]}\n"
                 f"{'feasible, value %g' % v.value if v.feasible else v.reason[:48]}", fontsize=8)
plt.show()'''),
    new_markdown_cell("""## Other presets, and a real checkpoint

Any objective preset runs through the same CLI: `grpo`, `dr_grpo`, `dapo`,
`gspo`, `gpg`, `flowrl`, `dmpo`, `dph_f`, `dph_js`, `dph_alpha`, `rkl`.
DPH-RL presets first sample the initial policy to build their stored
reference set. On the command line:

```
python -m dmpo_jax.train --config=configs/nphard.py:algo=grpo --workdir=runs/grpo
python -m dmpo_jax.train --config=configs/nphard_qwen.py:/path/to/Qwen2.5-1.5B-Instruct --workdir=runs/qwen
```"""),
    new_code_cell(r'''cfg_js = load_config("nphard", "smoke,algo=dph_js" if SMALL else "algo=dph_js")
cfg_js.log.tensorboard = False
res_js = stages.train(cfg_js, "runs/quickstart_dph_js")
print("dph_js QR@3 after RL:", round(res_js["after"]["overall"]["QR@3"], 3))

# A local Hugging Face folder (Qwen2.5-Instruct: config.json, *.safetensors, tokenizer files):
# cfg_qwen = load_config("nphard_qwen", "/path/to/Qwen2.5-1.5B-Instruct")
# stages.train(cfg_qwen, "runs/qwen_dmpo")'''),
]

MODE_COLLAPSE = [
    new_markdown_cell("""# Mode collapse in miniature

A policy chooses one of eight "solutions"; three of them are equally good.
Nothing in the reward prefers one optimum over another, yet on-policy RL
piles the probability mass onto whichever optimum it already favours. This
notebook trains the same softmax policy with the library's real loss
builder under GRPO, DMPO (a sweep of its weight lambda and temperature
alpha) and DPH-RL's forward-KL rehearsal, and shows where the mass goes.

**Why.** Maximising expected reward with a KL penalty to a reference is the
same as minimising the *reverse* KL from the policy to a reward-tilted
target. Reverse KL punishes the policy for putting mass where the target has
little, but not for missing places where the target has mass: any single
mode is a fine answer, so the policy settles on one. The *forward* KL (from
the target to the policy) is the opposite: every region the target covers
must keep some mass, so it is mass-covering. DMPO gets the forward-looking
behaviour inside each sampled group, by matching the policy's softmax over
the group to a Boltzmann distribution over the rewards; DPH-RL gets it by
adding a forward-KL (or JS) term on stored samples of the initial
policy."""),
    new_code_cell(SETUP),
    new_code_cell(r'''import jax, jax.numpy as jnp, numpy as np
import matplotlib.pyplot as plt
from dmpo_jax.objectives import dmpo, miniature, presets

rewards = jnp.array([1.0, 1.0, 1.0, 0.6, 0.4, 0.2, 0.0, 0.0])   # solutions 0, 1, 2 are optimal
init_logits = jnp.array([1.5, 0.5, 0.0, 0.5, 0.5, 0.0, 0.0, 0.0])  # the policy starts favouring 0
steps = 120 if SMALL else 400
seeds = jax.random.split(jax.random.key(0), 2 if SMALL else 8)

def run(name, **overrides):
    fn = miniature.train(presets.objective_config(name, **overrides), rewards, init_logits, steps=steps)
    final, hist = jax.vmap(fn)(seeds)
    return np.asarray(final), np.asarray(hist)

runs = {"GRPO": run("grpo"), "DMPO (lambda 0.5)": run("dmpo"),
        "DMPO (lambda 5)": run("dmpo", dm_coef=5.0),
        "DPH forward KL (eta 0.5)": run("dph_f", div_coef=0.5)}
for name, (final, _) in runs.items():
    print(f"{name:26s} mass on optima 0/1/2 (mean over seeds): {np.round(final[:, :3].mean(0), 3)}")'''),
    new_markdown_cell("## How the mass moves (first seed)"),
    new_code_cell(r'''fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.2), sharey=True)
colors = ["C0", "C1", "C2"] + ["0.75"] * 5
for ax, (name, (_, hist)) in zip(axes, runs.items()):
    ax.stackplot(np.arange(steps), hist[0].T, colors=colors, labels=[f"sol {i}" for i in range(8)])
    ax.set_title(name, fontsize=9); ax.set_xlabel("step")
axes[0].set_ylabel("probability"); axes[0].legend(fontsize=6, loc="lower left")
plt.show()'''),
    new_markdown_cell("""## DMPO's sweep: lambda (weight) and alpha (target temperature)

Smaller alpha sharpens the Boltzmann target toward the best rewards; larger
lambda pulls harder toward it. The minimum mass over the three optima tells
whether all of them survive."""),
    new_code_cell(r'''lams, alphas = ([0.5, 5.0], [0.5, 2.0]) if SMALL else ([0.5, 2.0, 5.0], [0.25, 0.5, 1.0, 2.0])
grid = np.zeros((len(lams), len(alphas)))
for i, lam in enumerate(lams):
    for j, a in enumerate(alphas):
        final, _ = run("dmpo", dm_coef=lam, dm_alpha=a)
        grid[i, j] = final[:, :3].min(1).mean()
plt.imshow(grid, cmap="viridis"); plt.colorbar(label="min mass over the 3 optima")
plt.xticks(range(len(alphas)), alphas); plt.yticks(range(len(lams)), lams)
plt.xlabel("alpha"); plt.ylabel("lambda"); plt.show()'''),
    new_markdown_cell("""## One group: the target p against the policy's q

For one sampled group of G = 8 answers, p is the Boltzmann distribution of
the rewards and q the softmax of the policy's length-normalised
log-likelihoods; DMPO's loss is the mean squared gap."""),
    new_code_cell(r'''logp = jax.nn.log_softmax(init_logits)
group = jax.random.categorical(jax.random.key(1), logp, shape=(8,))
p = dmpo.boltzmann_target(rewards[group], 1.0)
q = dmpo.group_policy_distribution(logp[group])
x = np.arange(8)
plt.bar(x - 0.2, p, 0.4, label="target p (rewards)"); plt.bar(x + 0.2, q, 0.4, label="policy q")
plt.xticks(x, [f"sol {int(s)}" for s in group]); plt.legend(); plt.show()
print("L_DM =", float(dmpo.dm_loss(logp[group], rewards[group], 1.0)))'''),
]


def write(cells, name):
  nb = new_notebook(cells=cells, metadata={
      "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
      "language_info": {"name": "python"}, "accelerator": "TPU"})
  nbformat.write(nb, os.path.join(HERE, name))


if __name__ == "__main__":
  write(QUICKSTART, "quickstart.ipynb")
  write(MODE_COLLAPSE, "mode_collapse.ipynb")
  print("wrote notebooks/quickstart.ipynb and notebooks/mode_collapse.ipynb")
