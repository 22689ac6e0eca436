"""A tensorflow-datasets builder for generated NP-Bench sets, without TensorFlow.

One config per task and level (``tsp_tiny``, ``gcp_d_easy``, ...). Files are
array_record, read back with ``as_data_source()`` (random access, no TF):

    b = NpBench(config="tsp_tiny", data_dir="data", num_train=1000, num_test=100)
    b.download_and_prepare()
    train = b.as_data_source()["train"]
    json.loads(train[0]["question"])

Train and test use disjoint seed ranges (test seeds start at 1_000_000).
"""

from __future__ import annotations

import json

import numpy as np
import tensorflow_datasets as tfds

from dmpo_jax import tasks as tasks_lib

TEST_SEED0 = 1_000_000


def config_name(task_key: str, level: str) -> str:
  return f"{task_key.lower().replace('-', '_')}_{level}"


class NpBenchConfig(tfds.core.BuilderConfig):

  def __init__(self, *, task_key: str, level: str, **kwargs):
    super().__init__(name=config_name(task_key, level),
                     description=f"{task_key} at level {level}", **kwargs)
    self.task_key, self.level = task_key, level


class NpBench(tfds.core.GeneratorBasedBuilder):
  """NP-Bench-format instances with their reference (ground-truth) values."""

  name = "np_bench"
  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [NpBenchConfig(task_key=k, level=lv)
                     for k in tasks_lib.names() for lv in tasks_lib.LEVELS]

  def __init__(self, *, num_train: int = 1000, num_test: int = 100, style: str = "compact",
               file_format: str = "array_record", **kwargs):
    self._num = {"train": int(num_train), "test": int(num_test)}
    self._style = style
    super().__init__(file_format=file_format, **kwargs)

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description="Generated NP-Bench instances (dmpo_jax.tasks).",
        features=tfds.features.FeaturesDict({
            "prompt": tfds.features.Text(),
            "question": tfds.features.Text(),   # JSON of NP-Bench's question dict
            "task_type": tfds.features.Text(),
            "level": tfds.features.Text(),
            "seed": np.int64,
            "ground_truth": np.float64,
        }))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(0, self._num["train"]),
            "test": self._generate_examples(TEST_SEED0, self._num["test"])}

  def _generate_examples(self, seed0: int, num: int):
    cfg = self.builder_config
    for i in range(num):
      r = tasks_lib.get(cfg.task_key).record(seed0 + i, cfg.level, style=self._style)
      yield seed0 + i, {"prompt": r["prompt"], "question": json.dumps(r["question"]),
                        "task_type": r["task_type"], "level": r["level"], "seed": r["seed"],
                        "ground_truth": float(r["ground_truth"])}
