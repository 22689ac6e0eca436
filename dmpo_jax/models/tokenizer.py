"""The task tokenizer: a small vocabulary for models trained from scratch on NP tasks.

Digits are single tokens (numbers are spelt digit by digit, so a model can
copy and compare them), so are spaces, punctuation and single letters;
frequent task words are whole tokens. Built with the `tokenizers` library,
saved as tokenizer.json and loaded through transformers'
`PreTrainedTokenizerFast`, so tiny and real models share one tokenizer API
(`encode`, `decode`, `eos_token_id`, `save_pretrained`).
"""

from __future__ import annotations

import os
import re
import string

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
# Vision-language models from scratch (`build(vision=True)`): Qwen2.5-VL's image markers,
# appended after the text vocabulary so text models keep their ids.
VISION_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]

# Whole-word tokens: task names and the words of the compact prompts.
WORDS = [
    "Answer", "Impossible", "TSP", "GCP", "clique", "mis", "meet", "cut", "cover",
    "subset", "knap", "ham", "cap", "target", "items", "rooms", "room", "att",
    "dur", "avail", "sets", "edges", "nodes", "dist", "n", "w", "v",
]


def _vocab() -> list[str]:
  chars = list(string.digits) + list(string.ascii_letters) + list(string.punctuation) + [" ", "\n"]
  words = [w for w in WORDS if len(w) > 1]
  return SPECIALS + chars + words


def build(path: str | None = None, *, vision: bool = False):
  """The task tokenizer as a transformers PreTrainedTokenizerFast; saved to `path` if given.
  vision: also the image markers of VISION_SPECIALS (one token each, never split)."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  vocab = {tok: i for i, tok in enumerate(_vocab())}
  words = sorted((w for w in WORDS if len(w) > 1), key=len, reverse=True)
  # Longest known word first, else one character: every string is covered.
  pattern = "|".join(re.escape(w) for w in words) + r"|[\s\S]"
  tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
  tok.decoder = decoders.Fuse()
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS,
                                 eos_token=EOS, unk_token=UNK)
  if vision:
    fast.add_special_tokens({"additional_special_tokens": VISION_SPECIALS})
  if path is not None:
    os.makedirs(path, exist_ok=True)
    fast.save_pretrained(path)
  return fast


def load(path: str):
  """Load a saved task tokenizer (or any HF tokenizer folder); a folder without one, or a
  damaged one, is a CheckpointError naming it."""
  from dmpo_jax.models.hf_text import TOKENIZER_FILES, load_tokenizer
  from dmpo_jax.models.weights import CheckpointError
  if not os.path.isdir(path):
    raise CheckpointError(f"tokenizer folder {path!r} does not exist")
  tok = load_tokenizer(path)
  if tok is None:
    raise CheckpointError(f"{path} has no tokenizer file (one of {', '.join(TOKENIZER_FILES)})")
  return tok
