"""Chat-template prompts: a user turn encoded as transformers' `apply_chat_template` does,
and the end-of-turn token an instruct model closes its answer with (sampling stops there).

The end-of-turn token is read off the template itself: render a conversation whose
assistant turn is a marker, and take the special token the template writes right after it
(`<|im_end|>` for ChatML, `<|eot_id|>` for Llama 3). Many files name it nowhere else: a
GGUF's `eos_token_id` may be `<|endoftext|>`, which an instruct model never writes.
"""

from __future__ import annotations

_MARKER = "\u2063dmpo-marker\u2063"  # text no template adds or strips


def encode_chat(tokenizer, text: str, *, system: str | None = None) -> list[int]:
  """Token ids of `text` as one user turn, followed by the assistant turn's opening
  (add_generation_prompt=True): exactly `apply_chat_template`'s ids."""
  messages = [{"role": "user", "content": text}]
  if system is not None:
    messages.insert(0, {"role": "system", "content": system})
  ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
  ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5: a BatchEncoding
  return [int(i) for i in ids]


def end_of_turn_ids(tokenizer) -> tuple[int, ...]:
  """The special token(s) the chat template writes right after an assistant turn's text;
  () when the tokenizer has no chat template or the template ends turns with plain text."""
  if not getattr(tokenizer, "chat_template", None):
    return ()
  messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARKER}]
  text = tokenizer.apply_chat_template(messages, tokenize=False)
  if _MARKER not in text:
    return ()
  after = text.split(_MARKER, 1)[1]
  ids = tokenizer.encode(after, add_special_tokens=False)
  special = set(tokenizer.all_special_ids)
  special |= {int(i) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
              if getattr(t, "special", False)}
  return (int(ids[0]),) if ids and int(ids[0]) in special else ()
