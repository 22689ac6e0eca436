"""MM-NP-Bench on the host: image prompts of the NP tasks, their render cache, and small VLMs.

An image prompt is the task's prompt text in an image style (`tasks.IMAGE_STYLES`: the
instance drawn by `Task.render`, plus an instruction that is the same for every
instance of the task) turned into what a Qwen2.5-VL policy reads: token ids whose
image span holds one image-pad token per merged patch, and the image processor's
`{"pixel_values": [patches, C], "image_grid_thw": [1, 3]}`. Rendering and
preprocessing are cached per instance (`ImageCache`, an LRU keyed by task and
instance) so a held-out set is drawn once, not once per evaluation.

The blank-image control (`ImagePromptEncoder(..., blank=True)`) gives the same
prompts with a white image of the same size: the same ids and grid, no instance.
A policy that scores as well on it does not read the image.

`models.build.build_vlm` makes the from-scratch Qwen2.5-VL of a config (a tiny vision
tower and the text model's sizes) with an image processor and tokenizer of its own, so a
from-scratch run needs no hub files.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import time

from dmpo_jax.models import build as model_build
from dmpo_jax.data import pipeline
from dmpo_jax import tasks as tasks_lib
from dmpo_jax.data import transcripts

PERCEPTION_CUE = "\nInstance: "  # the perception prompt's last words, after the image and task word
MARKERS = model_build.VISION_MARKERS  # around the image span, when the tokenizer has them


def instance_key(key: str, q: dict) -> str:
  """A content key of (task, instance): equal for equal instances, whatever their identity."""
  try:
    text = json.dumps(q, sort_keys=True, default=str)
  except TypeError:  # mixed key types cannot be sorted
    text = repr(q)
  return key + "/" + hashlib.sha1(text.encode()).hexdigest()


class ImageCache:
  """LRU of preprocessed renders: (task, instance, blank) -> the processor's image dict.

  `ms_per_instance` is the mean wall time of one miss (render + preprocessing)."""

  def __init__(self, processor, size: int, capacity: int = 4096):
    if not isinstance(size, int) or size < 128:
      raise ValueError(f"config.image.size={size!r}: renders need an int >= 128 pixels")
    self.processor, self.size, self.capacity = processor, size, capacity
    self._items: collections.OrderedDict = collections.OrderedDict()
    self.hits = self.misses = 0
    self.seconds = 0.0

  def get(self, key: str, q: dict, blank: bool = False) -> dict:
    k = ("blank", self.size) if blank else instance_key(key, q)
    hit = self._items.get(k)
    if hit is not None:
      self.hits += 1
      self._items.move_to_end(k)
      return hit
    t0 = time.perf_counter()
    if blank:
      from PIL import Image
      image = Image.new("RGB", (self.size, self.size), "white")
    else:
      image = tasks_lib.get(key).render(q, self.size)
    out = self.processor.images([image])
    self.seconds += time.perf_counter() - t0
    self.misses += 1
    self._items[k] = out
    if len(self._items) > self.capacity:
      self._items.popitem(last=False)
    return out

  @property
  def ms_per_instance(self) -> float:
    return 1000.0 * self.seconds / max(self.misses, 1)


class ImagePromptEncoder(pipeline.PromptEncoder):
  """A PromptEncoder for image styles: `encode` gives ids with the image span expanded to
  the image's merged patches, `images` the image dict of the same (task, instance).

  processor: a `VLProcessor` (tokenizer + image processor); blank: the blank-image control;
  swap: {instance_key: another instance of the same task} whose image replaces the
  instance's (the shuffled-image control, `shuffled_control`)."""

  def __init__(self, processor, style: str, max_prompt_len: int, chat_template: bool = False, *,
               cache: ImageCache, blank: bool = False, swap: dict | None = None):
    if style not in tasks_lib.IMAGE_STYLES:
      raise ValueError(f"config.prompt_style={style!r} is no image style; choose from "
                       f"{tasks_lib.IMAGE_STYLES}")
    self.processor, self.cache, self.blank, self.swap = processor, cache, blank, swap
    tok = processor.tokenizer
    super().__init__(tok, "compact", max_prompt_len, chat_template)  # checks the base style
    self.style = style
    vocab = tok.get_vocab()
    self.markers = MARKERS if all(m in vocab for m in MARKERS) else ("", "")
    self.kept_tokens = tuple(m for m in self.markers if m) + (processor.image_token,)  # the image span

  def images(self, key: str, q: dict) -> dict:
    """{"pixel_values": [patches, C] float32, "image_grid_thw": [1, 3]} of the prompt's image."""
    if self.swap is not None:
      other = self.swap.get(instance_key(key, q))
      if other is None:
        raise ValueError(f"the shuffled-image control has no other instance for this {key} "
                         "instance (it swaps among the instances it was made for)")
      q = other
    return self.cache.get(key, q, self.blank)

  def prompt_text(self, key: str, q: dict) -> str:
    """The prompt with its image span expanded (one image-pad token per merged patch)."""
    return self.expand(key, q, tasks_lib.get(key).prompt(q, self.style))

  def expand(self, key: str, q: dict, text: str) -> str:
    """`text` with its image placeholder replaced by the image span of (key, q)."""
    n = self.processor.num_image_tokens(self.images(key, q)["image_grid_thw"])[0]
    span = self.markers[0] + self.processor.image_token * n + self.markers[1]
    return text.replace(tasks_lib.IMAGE, span)

  def perception_ids(self, key: str, q: dict) -> list[int]:
    """The perception stage's prompt: the image, the task's word, then PERCEPTION_CUE; the
    answer is the instance's transcript (data/transcripts.py)."""
    word = transcripts.text(key, q).split(None, 1)[0]
    return self.encode_text(key, self.expand(key, q, f"{tasks_lib.IMAGE}{word}{PERCEPTION_CUE}"))

  def transcript_ids(self, key: str, q: dict, max_len: int) -> list[int]:
    """The perception stage's target: the transcript, then the end token; cut to max_len and
    counted in truncated["answer"] (sft_truncated)."""
    ids = self.tok.encode(transcripts.text(key, q), add_special_tokens=False) + [self.end]
    if len(ids) > max_len:
      if "transcript" not in self._warned:
        self._warned.add("transcript")
        print(f"warning: a transcript of {key} has {len(ids)} tokens > config.perception."
              f"max_new_tokens={max_len}; it is cut", flush=True)
      self.truncated["answer"] += 1  # logged with the SFT answers' cuts (sft_truncated)
      ids = ids[:max_len]
    return ids

  def batch_images(self, items) -> list[dict]:
    """The image dicts of [(task key, instance)] in order."""
    return [self.images(k, q) for k, q in items]

  def blank_control(self) -> "ImagePromptEncoder":
    """The same encoder with every image replaced by a blank one of the same size."""
    return ImagePromptEncoder(self.processor, self.style, self.max_len, self.chat, cache=self.cache,
                              blank=True)

  def shuffled_control(self, items) -> "ImagePromptEncoder":
    """The same encoder where each of [(task key, instance)] is shown the image of the next
    instance of its task in `items` (cyclically): a drawing like the ones trained on, of
    another instance. Unlike the blank image it is in distribution, so a policy that scores
    the same on it does not use the instance it is shown."""
    by_task: dict[str, list] = {}
    for key, q in items:
      by_task.setdefault(key, []).append(q)
    swap = {}
    for key, qs in by_task.items():
      ids = [instance_key(key, q) for q in qs]
      if len(set(ids)) < 2:
        raise ValueError(f"the shuffled-image control needs two different {key} instances, "
                         f"got {len(set(ids))}")
      for i, q in enumerate(qs):
        j = next(j for j in range(1, len(qs) + 1) if ids[(i + j) % len(qs)] != ids[i])
        swap[ids[i]] = qs[(i + j) % len(qs)]
    return ImagePromptEncoder(self.processor, self.style, self.max_len, self.chat, cache=self.cache,
                              swap=swap)


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
  """A run's prompts (training/specs.py: encoder_spec): config.prompt_style, chat_template and
  model.max_prompt_len; for an image style config.image's render size and cache."""
  style: str
  max_len: int
  chat: bool
  image_size: int = 0   # pixels (image styles)
  image_cache: int = 0  # rendered instances kept


def make_encoder(spec: EncoderSpec, processor) -> ImagePromptEncoder:
  """The run's image-prompt encoder (config.prompt_style, config.image.size)."""
  cache = ImageCache(processor, spec.image_size, spec.image_cache)
  return ImagePromptEncoder(processor, spec.style, spec.max_len, spec.chat, cache=cache)


def make_run_encoder(spec: EncoderSpec, tok, processor):
  """A training run's prompt encoder: image prompts for an image style (which needs a
  vision-language model), else text prompts with the model's tokenizer."""
  if spec.style in tasks_lib.IMAGE_STYLES:
    if processor is None:
      raise ValueError(f"config.prompt_style={spec.style!r} needs a vision-language model: "
                       "config.model.vision (from scratch) or a Qwen2.5-VL folder in config.model.init")
    return make_encoder(spec, processor)
  tokenizer = processor.tokenizer if processor is not None else tok
  return pipeline.PromptEncoder(tokenizer, spec.style, spec.max_len, spec.chat)


def image_inputs(vl_cfg, encoder, items, prompt_tokens, prompt_mask, patch_budget: int):
  """`qwen2_5_vl.prompt_images` of padded prompts [Bp, P]: each item's image for an image
  encoder, None (text only) for a text one; every prompt padded to `patch_budget` patches."""
  from dmpo_jax.models import qwen2_5_vl
  images = (encoder.batch_images(items) if isinstance(encoder, ImagePromptEncoder)
            else [None] * len(items))
  return qwen2_5_vl.prompt_images(vl_cfg, prompt_tokens, prompt_mask, images, patch_budget)


MODALITIES = ("image", "blank", "text")  # the default set
CONTROLS = MODALITIES + ("shuffled",)     # every modality (shuffled: another instance's image)
TEXT_STYLE = {"image": "compact", "npbench_image": "npbench"}  # the same prompt, instance in text


def default_modalities(encoder) -> tuple[str, ...]:
  return MODALITIES if isinstance(encoder, ImagePromptEncoder) else ("text",)


def modality_encoder(encoder, modality: str, items=None):
  """The encoder of one modality of `encoder`'s prompts: "image" (the instance drawn),
  "blank" (a white image of the same size: the control), "shuffled" (the image of another
  of `items`' instances of the same task: the in-distribution control) or "text" (the
  instance written out in the matching text style)."""
  if modality not in CONTROLS:
    raise ValueError(f"config.eval.modalities: unknown modality {modality!r}; choose from {CONTROLS}")
  image = isinstance(encoder, ImagePromptEncoder)
  if modality == "text":
    if not image:
      return encoder
    return pipeline.PromptEncoder(encoder.tok, TEXT_STYLE[encoder.style], 10**9, encoder.chat)
  if not image:
    raise ValueError(f"config.eval.modalities: {modality!r} needs image prompts "
                     f"(config.prompt_style in {tasks_lib.IMAGE_STYLES})")
  if modality == "shuffled":
    return encoder.shuffled_control(items)
  return encoder.blank_control() if modality == "blank" else encoder


def evaluate_modalities(run_eval, encoder, items, modalities, images_fn,
                        prompt_len: int | None = None) -> dict:
  """Score the same instances in each modality. run_eval(encoder, prompt_len, images) is one
  `evaluation.evaluate`; images_fn(items, prompt_tokens, prompt_mask, encoder) the image
  inputs. Image prompts are padded to `prompt_len` (None: their longest, rounded up to 16),
  text prompts to their own longest. Returns the first modality's results plus
  "modalities": {name: per_task, categories, overall} of each."""
  modalities = tuple(modalities)
  if not modalities:
    raise ValueError("config.eval.modalities is empty")
  results = {}
  for m in modalities:
    enc = modality_encoder(encoder, m, items)
    plen = prompt_len
    if m == "text" or plen is None:
      plen = -(-max(len(enc.encode(k, q)) for k, q in items) // 16) * 16
    results[m] = run_eval(enc, plen, lambda chunk, pt, pm, e=enc: images_fn(chunk, pt, pm, e))
  out = dict(results[modalities[0]])
  out["modality"] = modalities[0]
  out["modalities"] = {m: {k: r[k] for k in ("per_task", "categories", "overall")}
                       for m, r in results.items()}
  return out


class Prefetch:
  """Renders the next step's instances on a worker thread while the device runs this step
  (training instances are fresh at every step, so they miss the cache otherwise).

  `warm(items_fn)` submits items_fn() -> [(task key, instance)] and their images; `wait()`
  returns when it is done. The stages wait before they build a batch, so the cache is
  never used by two threads at once. A no-op for text prompts. Use it as a context manager:
  leaving the block waits for the last render and stops the thread (after an exception, it
  only stops the thread, so a render error cannot hide the exception)."""

  def __init__(self, encoder):
    self.encoder = encoder if isinstance(encoder, ImagePromptEncoder) else None
    self._pool = self._pending = None

  def warm(self, items_fn) -> None:
    if self.encoder is None:
      return
    self.wait()
    if self._pool is None:
      from concurrent.futures import ThreadPoolExecutor
      self._pool = ThreadPoolExecutor(1, thread_name_prefix="render")
    self._pending = self._pool.submit(lambda: [self.encoder.images(k, q) for k, q in items_fn()])

  def wait(self) -> None:
    if self._pending is not None:
      pending, self._pending = self._pending, None
      pending.result()  # a render error surfaces here, in the training thread

  def close(self) -> None:
    try:
      self.wait()
    finally:
      if self._pool is not None:
        self._pool.shutdown()
        self._pool = None

  def __enter__(self) -> "Prefetch":
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is None:
      self.close()
    else:
      self._pending = None
      if self._pool is not None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None
