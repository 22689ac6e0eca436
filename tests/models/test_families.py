"""Model families beyond Qwen2 / Llama 2: Llama 3.x (rope scaling, tied 1B/3B-style embeddings),
Qwen3 dense (q/k norm, free head_dim), multimodal RoPE; parity with transformers (torch, CPU)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmpo_jax import sampling
from dmpo_jax.models import hf, positions
from tests.helpers import perturb_and_save

VOCAB = 97


def _hf_model(path, family, *, tie=False, seed=0):
  """A random tiny transformers model of `family`, saved to `path`; returns the torch model."""
  import torch
  import transformers

  torch.manual_seed(seed)
  kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie,
            rms_norm_eps=1e-6, max_position_embeddings=256)
  if family == "llama3":
    # original_max_position 16 with factor 8: at head_dim 16 the frequencies fall in
    # all three bands (kept, interpolated, divided), so the scaling is exercised.
    kw["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 16}
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
  else:  # qwen3: head_dim 24, not hidden_size / heads = 16
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000.0}
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=24, **kw))
  return perturb_and_save(model, path)


def _padded(lengths, length, seed=1):
  ids = np.random.RandomState(seed).randint(0, VOCAB, (len(lengths), length))
  tokens = np.zeros_like(ids)
  mask = np.zeros(ids.shape, np.int64)
  for i, n in enumerate(lengths):
    tokens[i, length - n:] = ids[i, :n]
    mask[i, length - n:] = 1
  return tokens, mask


def _torch_logits(ref, tokens, mask):
  import torch

  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    return ref(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
               position_ids=torch.tensor(pos)).logits.numpy()


FAMILIES = [("llama3", True), ("llama3", False), ("qwen3", False)]


@pytest.mark.slow
@pytest.mark.parametrize("family,tie", FAMILIES)
def test_parity_with_transformers_on_padded_batch(tmp_path, family, tie):
  ref = _hf_model(tmp_path, family, tie=tie)
  model, _ = hf.load(str(tmp_path))
  cfg = model.cfg
  assert cfg.tie_embeddings == tie
  assert (cfg.rope_type, cfg.qk_norm) == (("llama3", False) if family == "llama3"
                                          else ("default", True))
  tokens, mask = _padded([20, 13, 4], 20)
  want = _torch_logits(ref, tokens, mask)
  offsets = positions.left_pad_offsets(jnp.asarray(mask))
  ours = np.asarray(model(jnp.asarray(tokens, jnp.int32), offsets=offsets))
  valid = mask.astype(bool)
  err = np.abs(ours[valid] - want[valid]).max()
  assert err < 1e-4, f"{family}: max |logit error| {err:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("family,tie", FAMILIES)
def test_save_then_transformers_load_gives_the_same_logits(tmp_path, family, tie):
  import transformers

  _hf_model(tmp_path / "src", family, tie=tie)
  model, _ = hf.load(str(tmp_path / "src"))
  hf.save(model, None, str(tmp_path / "out"))
  saved = json.loads((tmp_path / "out" / "config.json").read_text())
  assert saved["model_type"] == ("llama" if family == "llama3" else "qwen3")
  again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
  tokens, mask = _padded([9, 5], 9, seed=2)
  want = _torch_logits(again, tokens, mask)
  ours = np.asarray(model(jnp.asarray(tokens, jnp.int32),
                          offsets=positions.left_pad_offsets(jnp.asarray(mask))))
  valid = mask.astype(bool)
  np.testing.assert_allclose(ours[valid], want[valid], atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_greedy_sampling_equals_stepwise_argmax_of_transformers(tmp_path, family):
  import torch

  ref = _hf_model(tmp_path, family, tie=family == "llama3")
  model, _ = hf.load(str(tmp_path))
  prompts = [[5, 9, 11, 3, 40, 2], [7, 8], [60, 61, 62, 63]]
  out = sampling.generate(model, prompts, rng=jax.random.key(0), max_new_tokens=6, greedy=True)
  for i, prompt in enumerate(prompts):
    seq = list(prompt)
    for _ in range(6):
      with torch.no_grad():
        logits = ref(input_ids=torch.tensor([seq])).logits[0, -1].numpy()
      seq.append(int(np.argmax(logits)))
    assert list(np.asarray(out.tokens[i])) == seq[len(prompt):], f"prompt {i}"


@pytest.mark.parametrize("change,message", [
    (dict(model_type="qwen3_moe"), "qwen3_moe.*mixture-of-experts"),
    (dict(use_sliding_window=True, sliding_window=8), "sliding-window"),
    (dict(layer_types=["sliding_attention", "full_attention"]), "layer_types"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope scaling 'yarn'"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "lacks"),
    (dict(attention_bias=True), "attention_bias"),
])
def test_unsupported_variants_are_refused_by_name(change, message):
  base = dict(model_type="qwen3", vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24)
  with pytest.raises(hf.CheckpointError, match=message):
    hf.config_from_hf(dict(base, **change))


def test_llama3_config_from_checkpoint_style_rope_scaling():
  """Released Llama 3.1 checkpoints write `rope_scaling` and a top-level `rope_theta`."""
  cfg = hf.config_from_hf(dict(
      model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}))
  assert (cfg.rope_type, cfg.rope_theta, cfg.rope_factor) == ("llama3", 500000.0, 8.0)
  assert hf.config_to_hf(cfg)["rope_scaling"]["original_max_position_embeddings"] == 8192


@pytest.mark.slow
def test_multimodal_rope_matches_transformers_qwen2_5_vl_text_model(tmp_path):
  """Three position streams over mrope_section: our hidden states equal those of
  transformers' Qwen2.5-VL text model given the same [3, B, L] position ids."""
  import torch
  import transformers
  from safetensors.torch import save_file
  from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as vl

  torch.manual_seed(0)
  section = [2, 3, 3]  # head_dim 16: 8 frequencies
  tcfg = transformers.Qwen2_5_VLTextConfig(
      vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, bos_token_id=None,
      eos_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 5000.0,
                                          "mrope_section": section})
  ref = vl.Qwen2_5_VLTextModel(tcfg).eval()
  with torch.no_grad():
    for p in ref.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  tensors = {"model." + k: v.contiguous() for k, v in ref.state_dict().items()}
  save_file(tensors, str(tmp_path / "model.safetensors"))
  cfg = hf.config_from_hf(dict(model_type="qwen2", vocab_size=VOCAB, hidden_size=64,
                               intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, rope_theta=5000.0, rms_norm_eps=1e-6,
                               tie_word_embeddings=True)).replace(mrope_section=tuple(section))
  model = hf.load_params(str(tmp_path), cfg)

  rs = np.random.RandomState(3)
  ids = rs.randint(0, VOCAB, (2, 11))
  # Streams that differ (as an image's grid positions do) and are not 0..L-1.
  pos = np.stack([np.arange(11) * s + rs.randint(0, 5, (2, 11)) for s in (1, 2, 3)], axis=0)
  pos = np.sort(pos, axis=-1)
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(ids), position_ids=torch.tensor(pos)).last_hidden_state
  ours, _ = model.hidden(jnp.asarray(ids, jnp.int32), jnp.asarray(pos, jnp.int32))
  np.testing.assert_allclose(np.asarray(ours), want.numpy(), atol=1e-4, rtol=0)
  # Equal streams are plain RoPE: [3, B, L] of copies == [B, L].
  text, _ = model.hidden(jnp.asarray(ids, jnp.int32), jnp.asarray(pos[0], jnp.int32))
  same, _ = model.hidden(jnp.asarray(ids, jnp.int32), jnp.asarray(np.stack([pos[0]] * 3)))
  np.testing.assert_allclose(np.asarray(same), np.asarray(text), atol=1e-6)
  assert np.abs(np.asarray(ours) - np.asarray(text)).max() > 1e-3  # the streams matter


def test_llama3_dph_config_plans_llama_3_1_8b(tmp_path, capsys):
  """configs/llama3_dph.py on a folder holding Llama-3.1-8B-Instruct's config.json (shapes only):
  the planner reads it (llama3 rope scaling accepted) with the config's mesh and workload."""
  (tmp_path / "config.json").write_text(json.dumps(dict(
      model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128256,
      hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
      num_key_value_heads=8, rope_theta=500000.0, max_position_embeddings=131072,
      rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})))
  from dmpo_jax.parallel import plan

  plan.main([f"--config=configs/llama3_dph.py:{tmp_path}", "--device_gib=1000"])
  out = capsys.readouterr().out
  assert "8.030 B params" in out and "attention core 'cudnn'" in out
