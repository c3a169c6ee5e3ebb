"""DeepMind's math_dataset from a prepared TFDS data_dir, read with tfds.data_source.

Nothing is downloaded: prepare the dataset once (`tfds build math_dataset/...`) and point
task.data_dir at it. Random access through the ArrayRecord source needs no TensorFlow.
"""

from __future__ import annotations

from typing import Any, Mapping

from rlscale.tasks.base import Problem, Tokenizer
from rlscale.tasks.text import TextTask


def _text(x) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


class TfdsMath(TextTask):
  def __init__(self, cfg: Mapping[str, Any], tokenizer: Tokenizer):
    super().__init__(cfg, tokenizer)
    try:
      import tensorflow_datasets as tfds
    except ImportError:
      raise ImportError("task.name='tfds_math' needs tensorflow-datasets: "
                        "pip install 'rlscale[tfds]'") from None
    data_dir = cfg["data_dir"] or None
    self._train = tfds.data_source(cfg["tfds_name"], split="train", data_dir=data_dir,
                                   download=False)
    self._test = tfds.data_source(cfg["tfds_name"], split="test", data_dir=data_dir,
                                  download=False)
    self._train_size = len(self._train)

  @staticmethod
  def _problem(row) -> Problem:
    return Problem(_text(row["question"]), _text(row["answer"]).strip())

  def _train_item(self, i: int) -> Problem:
    return self._problem(self._train[i])

  def _eval_items(self) -> list[Problem]:
    n = min(len(self._test), 4 * self.num_eval)  # a margin for prompts that do not fit
    return [self._problem(self._test[i]) for i in range(n)]
