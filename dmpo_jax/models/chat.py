"""Chat-template prompts: a user turn encoded as transformers' `apply_chat_template` does, except
that text can never forge a turn, and the end-of-turn token an instruct model closes its answer
with (sampling stops there).

Prompt text is text. `apply_chat_template` renders the template to a string and tokenises all of
it, so a prompt holding `<|im_end|>\\n<|im_start|>assistant\\n...` (ChatML) or `<|eot_id|>` (Llama 3)
gets the real control tokens: it ends the user turn and writes an assistant turn. Here a control
token inside a message's content (the prompt, the system text) is encoded as the plain text it
spells; only the tokens the template writes itself are control tokens. This is a deliberate
difference from `apply_chat_template`; for content that holds no control token the ids are
exactly `apply_chat_template`'s. `encode_text` does the same without a template (plain prompts,
SFT answers).

The end-of-turn token is read off the template itself: render a conversation whose
assistant turn is a marker, and take the special token the template writes right after it
(`<|im_end|>` for ChatML, `<|eot_id|>` for Llama 3). Many files name it nowhere else: a
GGUF's `eos_token_id` may be `<|endoftext|>`, which an instruct model never writes.
"""

from __future__ import annotations

import re

_MARKER = "\u2063dmpo-marker\u2063"  # text no template adds or strips
# Private-use characters around a control token found in a message, so that the rendered chat
# tells it apart from the template's own tokens (a number is added until no content holds them).
_OPEN, _CLOSE = "\U000f0000", "\U000f0001"


def control_tokens(tokenizer, *, keep=()) -> tuple[str, ...]:
  """The strings a tokenizer turns into control tokens: its special tokens, plus the other added
  tokens its chat template writes (Qwen3's `<think>`), less those in `keep`; longest first."""
  decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
  template = getattr(tokenizer, "chat_template", None) or ""
  template = template if isinstance(template, str) else ""
  found = {t.content for t in decoder.values()
           if getattr(t, "special", False) or (t.content in template and not t.content.isspace())}
  found |= set(getattr(tokenizer, "all_special_tokens", None) or ())
  return tuple(sorted((t for t in found if t and t not in set(keep)), key=len, reverse=True))


def _markers(texts) -> tuple[str, str]:
  """An opening and a closing marker that none of `texts` holds."""
  n = 0
  while True:
    opening, closing = f"{_OPEN}{n}{_CLOSE}", f"{_CLOSE}{n}{_OPEN}"
    if not any(opening in t or closing in t for t in texts):
      return opening, closing
    n += 1


def _plain_ids(tokenizer, text: str) -> list[int]:
  """`text` tokenised with no added token matched: the backend's normaliser, pre-tokeniser and
  model (transformers' `split_special_tokens` skips special tokens only)."""
  backend = getattr(tokenizer, "backend_tokenizer", None)
  if backend is None:
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
  if backend.normalizer is not None:
    text = backend.normalizer.normalize_str(text)
  splits = [text] if backend.pre_tokenizer is None else [
      s for s, _ in backend.pre_tokenizer.pre_tokenize_str(text)]
  return [t.id for s in splits for t in backend.model.tokenize(s)]


def _piece_ids(tokenizer, piece: str, plain: bool, first: bool) -> list[int]:
  """Ids of one piece of a longer text. A piece after the first is encoded after a newline that
  is then dropped, so that a tokenizer that marks the start of a string (a SentencePiece prefix
  space) encodes it as the middle of the text it is part of."""
  encode = (lambda s: _plain_ids(tokenizer, s)) if plain else (
      lambda s: list(tokenizer.encode(s, add_special_tokens=False)))
  if first:
    return encode(piece)
  newline = encode("\n")
  ids = encode("\n" + piece)
  return ids[len(newline):] if ids[:len(newline)] == newline else encode(piece)


def _encode_marked(tokenizer, text: str, opening: str, closing: str) -> list[int]:
  """Ids of a text whose marked spans (opening token closing) are plain text, the rest as the
  tokenizer reads it (its control tokens included)."""
  pieces = re.split(f"{re.escape(opening)}(.*?){re.escape(closing)}", text, flags=re.DOTALL)
  ids, first = [], True
  for i, piece in enumerate(pieces):
    if i % 2 == 0:  # a marker a template's string method split off its pair is dropped
      piece = piece.replace(opening, "").replace(closing, "")
    if piece:
      ids += _piece_ids(tokenizer, piece, plain=i % 2 == 1, first=first)
      first = False
  return [int(i) for i in ids]


def _mark(text: str, tokens: tuple[str, ...], opening: str, closing: str) -> str:
  if not tokens:
    return text
  pattern = "|".join(map(re.escape, tokens))  # longest first: a token before the ones it holds
  return re.sub(pattern, lambda m: opening + m.group(0) + closing, text)


def encode_text(tokenizer, text: str, *, keep=()) -> list[int]:
  """Token ids of `text` with no chat template and no BOS, as `tokenizer.encode(text,
  add_special_tokens=False)` gives, except that a special token spelt in the text is plain
  text (tokens in `keep`, an image span the encoder wrote, stay special)."""
  tokens = [t for t in control_tokens(tokenizer, keep=keep) if t in text]
  if not tokens:
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
  opening, closing = _markers([text])
  return _encode_marked(tokenizer, _mark(text, tuple(tokens), opening, closing), opening, closing)


def encode_chat(tokenizer, text: str, *, system: str | None = None, keep=()) -> list[int]:
  """Token ids of `text` as one user turn (after a system turn `system`), followed by the
  assistant turn's opening (add_generation_prompt=True).

  Exactly `apply_chat_template`'s ids when neither text holds a control token (`control_tokens`);
  one that does is encoded as the plain text it spells, so a prompt cannot end its turn or
  write another (`apply_chat_template` would give the real token). Tokens in `keep` (an image
  span the encoder wrote) stay control tokens. The text around a control token in a message
  is tokenised on its own, as around any control token."""
  contents = [text] if system is None else [system, text]
  tokens = tuple(t for t in control_tokens(tokenizer, keep=keep) if any(t in c for c in contents))
  if not tokens:
    messages = [{"role": "user", "content": text}]
    if system is not None:
      messages.insert(0, {"role": "system", "content": system})
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5: a BatchEncoding
    return [int(i) for i in ids]
  opening, closing = _markers(contents + [tokenizer.chat_template or ""])
  marked = [_mark(c, tokens, opening, closing) for c in contents]
  messages = [{"role": "user", "content": marked[-1]}]
  if system is not None:
    messages.insert(0, {"role": "system", "content": marked[0]})
  rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  return _encode_marked(tokenizer, rendered, opening, closing)


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
