"""task.name='files': prompts and references from JSONL, Parquet and save_to_disk folders."""

import json
import os
import re
import shutil
import socket

import ml_collections
import numpy as np
import pytest

from tests.support import REPO, FIXTURES
from rlscale import tasks
from rlscale.config import migrate
from rlscale.config import files as config_files
from rlscale.config.errors import ConfigError
from rlscale.checkpoints import safetensors_io
from rlscale.checkpoints.tokenizer import HFTokenizer
from rlscale.config.sections import task as task_config
from rlscale.data import gsm8k_style
from rlscale.data.gsm8k_style import make as gsm8k_make
from rlscale.tasks import files
from rlscale.tasks.base import Problem
from tests.support.tiny_tokenizer import make_tokenizer_folder

# 40 rows under field names of our own: half GSM8K-style, half MATH-style with nested braces.
ROWS = ([{"problem": f"Tom has {i} apples and buys {i + 3} more. How many now?",
          "solution": f"Tom has {i}+{i + 3} = <<{i}+{i + 3}={2 * i + 3}>>{2 * i + 3}.\n"
                      f"#### {2 * i + 3}"} for i in range(20)]
        + [{"problem": f"Compute {i}/{i + 1} + 0.", "solution":
            f"The sum is $\\boxed{{\\frac{{{i}}}{{{i + 1}}}}}$."} for i in range(1, 21)])
REFS = {r["problem"]: files.reference_answer(r["solution"]) for r in ROWS}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return HFTokenizer(make_tokenizer_folder(str(tmp_path_factory.mktemp("tok"))))


def _jsonl(path, rows):
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return str(path)


def _parquet(path, rows):
  import pyarrow as pa
  import pyarrow.parquet as pq
  pq.write_table(pa.Table.from_pylist(rows), str(path))
  return str(path)


def _saved(path, rows):
  import datasets
  datasets.Dataset.from_list(rows).save_to_disk(str(path))
  return str(path)


def _cfg(train, **kw):
  cfg = task_config("files")
  cfg.train_files, cfg.prompt_field, cfg.answer_field = train, "problem", "solution"
  cfg.num_eval, cfg.max_prompt_len, cfg.eval_fraction = 100, 128, 0.25
  for k, v in kw.items():
    cfg[k] = v
  return cfg


def _seen(problems):
  return [(p.question, p.answer, p.meta["solution"]) for p in problems]


def test_jsonl_parquet_and_a_saved_folder_give_the_same_problems_offline(tmp_path, tokenizer,
                                                                         monkeypatch):
  def no_network(*args, **kwargs):
    raise AssertionError("the files task tried the network")
  monkeypatch.setattr(socket.socket, "connect", no_network)
  monkeypatch.setattr(socket, "create_connection", no_network)
  made = [tasks.make(_cfg(f(tmp_path / name, ROWS)), tokenizer)
          for f, name in ((_jsonl, "a.jsonl"), (_parquet, "a.parquet"), (_saved, "saved"))]
  first = made[0]
  assert first.data_report["train"] == {"files": [str(tmp_path / "a.jsonl")], "rows": 40,
                                        "held_out": 10, "empty_answer": 0, "also_held_out": 0,
                                        "too_long": 0, "used": 30}
  for task in made[1:]:
    assert _seen(task.problems(0, 45)) == _seen(first.problems(0, 45))
    assert _seen(task.eval_problems()) == _seen(first.eval_problems())
  for p in first.problems(0, 30) + first.eval_problems():
    assert p.answer == REFS[p.question] and p.meta["row"] == int(p.meta["row"])
    # The demonstration commits to the reference (today's verifier reads unnested boxes only;
    # graders with nested LaTeX come with tasks/graders.py).
    assert files.last_boxed(first.demonstration(p)) == p.answer
    if "####" in p.meta["solution"]:
      assert first.verify(first.demonstration(p), p).correct


def test_references_and_demonstrations():
  ref, demo = files.reference_answer, files.demonstration_text
  gsm = "She earns 12*6 = <<12*6=72>>72 dollars.\n#### 72"
  assert ref(gsm) == "72" and ref("a #### 1\nthen #### 1,000 ") == "1,000"
  math = "So $x = \\boxed{\\frac{1}{2}}$, not \\boxed{3}; finally \\boxed{\\sqrt{x^{2}} + 1}."
  assert ref(math) == "\\sqrt{x^{2}} + 1"
  assert ref("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}" and ref("\\boxed {7}") == "7"
  assert ref("unbalanced \\boxed{\\frac{1}{2}") == "unbalanced \\boxed{\\frac{1}{2}"
  assert ref("  42\n") == "42"
  assert demo(gsm, "72") == "She earns 12*6 = 72 dollars.\nThe final answer is \\boxed{72}."
  assert demo("#### 5", "5") == "The final answer is \\boxed{5}."
  assert demo(math, ref(math)) == math
  assert demo("42", "42") == "\\boxed{42}"


def test_numeric_answer_cells_are_read_as_numbers(tmp_path, tokenizer):
  rows = [{"q": f"What is {i} + {i}?", "a": 2 * i} for i in range(8)]
  rows += [{"q": "Half of 5?", "a": 2.5}, {"q": "Ten?", "a": 10.0}]
  task = tasks.make(_cfg(_jsonl(tmp_path / "n.jsonl", rows), prompt_field="q", answer_field="a"),
                    tokenizer)
  answers = {p.question: p.answer for p in task.problems(0, 10) + task.eval_problems()}
  assert answers["Half of 5?"] == "2.5" and answers["Ten?"] == "10"
  assert answers.get("What is 3 + 3?", "6") == "6"
  assert task.demonstration(task.problem(0)) == f"\\boxed{{{task.problem(0).answer}}}"


def test_seeded_order_and_disjoint_rows_per_process(tmp_path, tokenizer):
  path = _jsonl(tmp_path / "a.jsonl", ROWS)
  task = tasks.make(_cfg(path), tokenizer)
  same = tasks.make(_cfg(path), tokenizer)
  other = tasks.make(_cfg(path, seed=1), tokenizer)
  epoch = [p.question for p in task.problems(0, 30)]
  assert epoch == [p.question for p in same.problems(0, 30)]
  assert epoch != [p.question for p in other.problems(0, 30)]
  assert len(set(epoch)) == 30  # one epoch: every training row once
  assert epoch != sorted(epoch, key=lambda q: [r["problem"] for r in ROWS].index(q))  # shuffled
  assert [p.question for p in task.problems(30, 30)] != epoch  # the next epoch reshuffles
  assert set(p.question for p in task.problems(30, 30)) == set(epoch)
  # Two processes, each its own task object and its own rows of the one global stream.
  a = [p.question for p in tasks.make(_cfg(path), tokenizer).problems(0, 12)]
  b = [p.question for p in tasks.make(_cfg(path), tokenizer).problems(12, 12)]
  assert not set(a) & set(b) and a + b == epoch[:24]


def test_held_out_rows_never_reach_training(tmp_path, tokenizer):
  path = _jsonl(tmp_path / "a.jsonl", ROWS)
  task = tasks.make(_cfg(path), tokenizer)
  train = {p.question for p in task.problems(0, 90)}
  held = {p.question for p in task.eval_problems()}
  assert len(train) == 30 and len(held) == 10 and not train & held
  assert train | held == set(REFS)
  capped = tasks.make(_cfg(path, num_eval=4), tokenizer)
  assert len(capped.eval_problems()) == 4 and {p.question for p in capped.eval_problems()} < held
  assert {p.question for p in capped.problems(0, 30)} == train  # the cap frees no held-out row
  other = {p.question for p in tasks.make(_cfg(path, seed=5), tokenizer).eval_problems()}
  assert other != held and len(other) == 10

  test = _jsonl(tmp_path / "test.jsonl", ROWS[:6])
  task = tasks.make(_cfg(path, eval_files=test), tokenizer)  # eval_files wins over the fraction
  assert [p.question for p in task.eval_problems()] == [r["problem"] for r in ROWS[:6]]
  # The training files hold the held-out rows too: they are not trained on, and counted.
  assert {p.question for p in task.problems(0, 40)} == set(REFS) - {r["problem"] for r in ROWS[:6]}
  assert task.data_report["train"]["also_held_out"] == 6
  assert task.data_report["train"]["used"] == 34
  assert task.data_report["eval"]["files"] == [test]
  with pytest.raises(ConfigError, match=r"task.eval_files is empty and task.eval_fraction=0"):
    tasks.make(_cfg(path, eval_fraction=0.0), tokenizer)
  with pytest.raises(ConfigError, match=r"task.eval_fraction=1.0 must be a number in \[0, 1\)"):
    tasks.make(_cfg(path, eval_fraction=1.0), tokenizer)


def test_prompts_held_out_are_never_trained_on_even_as_duplicates(tmp_path, tokenizer):
  """Duplicate rows on both sides of an eval_fraction split, and a copy in eval_files that
  differs in case and spacing: the training copies are skipped and counted."""
  rows = ROWS + [dict(r) for r in ROWS[:10]]  # ten rows twice
  task = tasks.make(_cfg(_jsonl(tmp_path / "dup.jsonl", rows), eval_fraction=0.5), tokenizer)
  held = {files._normal(p.question) for p in task.eval_problems()}
  trained = {files._normal(p.question) for p in task.problems(0, 100)}
  assert held and trained and not held & trained
  report = task.data_report["train"]
  assert report["also_held_out"] > 0
  assert report["used"] == report["rows"] - report["held_out"] - report["also_held_out"]
  test = _jsonl(tmp_path / "test.jsonl", [{"problem": "  tom HAS 3 apples and buys 6 more.  "
                                           "How many now?", "solution": "#### 9"}])
  task = tasks.make(_cfg(_jsonl(tmp_path / "a.jsonl", ROWS), eval_files=test), tokenizer)
  assert task.data_report["train"]["also_held_out"] == 1
  assert ROWS[3]["problem"] not in {p.question for p in task.problems(0, 39)}


def test_references_whose_answer_is_empty_are_skipped_and_counted(tmp_path, tokenizer):
  empty = [{"problem": "Nothing after the marks?", "solution": "Work. #### "},
           {"problem": "An empty box?", "solution": "So $\\boxed{}$."},
           {"problem": "A box of spaces?", "solution": "\\boxed{  }"}]
  task = tasks.make(_cfg(_jsonl(tmp_path / "e.jsonl", ROWS + empty), eval_fraction=0.5),
                    tokenizer)
  report = task.data_report
  assert report["train"]["empty_answer"] + report["eval"]["empty_answer"] == 3
  served = task.problems(0, 60) + task.eval_problems()
  assert all(p.answer for p in served)
  assert not {p.question for p in served} & {r["problem"] for r in empty}
  with pytest.raises(ConfigError, match="no training row is left: every one has an empty "
                     "reference"):
    tasks.make(_cfg(_jsonl(tmp_path / "all.jsonl", empty * 4),
                    eval_files=_jsonl(tmp_path / "t.jsonl", ROWS[:4])), tokenizer)


def test_overlong_prompts_are_skipped_and_counted_never_cut(tmp_path, tokenizer):
  long = [{"problem": "What is " + " + ".join(["1"] * (40 + i)) + "?", "solution": "#### 9"}
          for i in range(6)]
  rows = ROWS[:20] + long
  task = tasks.make(_cfg(_jsonl(tmp_path / "a.jsonl", rows), eval_fraction=0.5), tokenizer)
  lengths = {r["problem"]: len(task.prompt_ids(Problem(r["problem"], ""))) for r in rows}
  assert max(lengths[r["problem"]] for r in ROWS[:20]) <= 128 < min(
      lengths[r["problem"]] for r in long)
  report = task.data_report
  assert report["train"]["rows"] == 26 and report["train"]["held_out"] == 13
  assert report["train"]["too_long"] + report["eval"]["too_long"] == 6
  assert report["train"]["used"] == 13 - report["train"]["too_long"]
  assert len(task.eval_problems()) == 13 - report["eval"]["too_long"]
  served = task.problems(0, 50) + task.eval_problems()
  assert {p.question for p in served} <= {r["problem"] for r in ROWS[:20]}  # whole, never cut
  with pytest.raises(ConfigError,
                     match=r"task.max_prompt_len=20: none of the \d+ (held-out|training)"):
    tasks.make(_cfg(_jsonl(tmp_path / "a.jsonl", rows), max_prompt_len=20), tokenizer)


class _BatchTokenizer:
  """The test tokenizer with an encode_batch, counting its calls."""

  def __init__(self, inner):
    self.inner, self.batches = inner, []

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def encode_batch(self, texts, add_special_tokens=False):
    self.batches.append(len(texts))
    return [self.inner.encode(t, add_special_tokens=add_special_tokens) for t in texts]


def test_prompts_are_measured_in_one_batch_when_the_tokenizer_can(tmp_path, tokenizer):
  wrapped = _BatchTokenizer(tokenizer)
  task = tasks.make(_cfg(_jsonl(tmp_path / "a.jsonl", ROWS)), wrapped)
  assert wrapped.batches == [40]  # every row once, the held-out ones included
  probs = [Problem(r["problem"], "") for r in ROWS[:5]]
  assert task.prompt_lengths(probs) == [len(task.prompt_ids(p)) for p in probs]


def _error(cfg, tokenizer):
  with pytest.raises(ConfigError) as e:
    tasks.make(cfg, tokenizer)
  return str(e.value)


def test_clear_errors_for_paths_fields_and_rows(tmp_path, tokenizer):
  good = _jsonl(tmp_path / "a.jsonl", ROWS)
  missing = str(tmp_path / "nope.jsonl")
  msg = _error(_cfg(missing), tokenizer)
  assert "task.train_files" in msg and missing in msg and "does not exist" in msg
  assert "matches no file" in _error(_cfg(str(tmp_path / "*.parquet")), tokenizer)
  (tmp_path / "a.csv").write_text("problem,solution\n1,2\n")
  msg = _error(_cfg(f"{good}, {tmp_path / 'a.csv'}"), tokenizer)
  assert "'.csv'" in msg and "a.csv" in msg and "unknown extension" in msg
  msg = _error(_cfg(good, prompt_field="question"), tokenizer)
  assert msg == (f"task.prompt_field='question' is not a column of {good!r}; "
                 f"its columns: ['problem', 'solution']")
  assert "task.answer_field='answer'" in _error(_cfg(good, answer_field="answer"), tokenizer)
  msg = _error(_cfg(good, eval_files=str(tmp_path / "test.parquet")), tokenizer)
  assert "task.eval_files" in msg and "test.parquet" in msg
  bad = ROWS[:5] + [{"problem": " ", "solution": "#### 1"}] + ROWS[5:8] + [
      {"problem": "ok?", "solution": None}]
  msg = _error(_cfg(_jsonl(tmp_path / "bad.jsonl", bad)), tokenizer)
  assert msg.startswith("task.prompt_field='problem': ") and "bad.jsonl' row 5" in msg
  msg = _error(_cfg(_jsonl(tmp_path / "bad.jsonl", ROWS[:5] + bad[-1:])), tokenizer)
  assert msg.startswith("task.answer_field='solution': ") and "row 5 holds None" in msg
  (tmp_path / "broken.jsonl").write_text('{"problem": "a", "solution": "1"}\n{"problem": \n')
  assert "cannot be read as json" in _error(_cfg(str(tmp_path / "broken.jsonl")), tokenizer)
  (tmp_path / "blank.jsonl").write_text("\n\n  \n")
  assert "blank.jsonl' holds no rows (only blank lines)" in _error(
      _cfg(str(tmp_path / "blank.jsonl")), tokenizer)
  rows = "".join(json.dumps(r) + "\n\n" for r in ROWS[:6])  # blank lines between rows: fine
  (tmp_path / "gaps.jsonl").write_text(rows)
  gaps = tasks.make(_cfg(str(tmp_path / "gaps.jsonl")), tokenizer)
  assert gaps.data_report["train"]["rows"] == 6
  raw = rows.encode().replace(b"apples", b"appl\xffes", 1)  # row 0: not UTF-8
  (tmp_path / "latin.jsonl").write_bytes(raw)
  msg = _error(_cfg(str(tmp_path / "latin.jsonl")), tokenizer)
  assert msg.startswith("task.prompt_field='problem': ")
  assert "latin.jsonl' row 0 is not valid UTF-8" in msg
  (tmp_path / "empty.jsonl").write_text("")
  assert "empty.jsonl' is empty" in _error(_cfg(str(tmp_path / "empty.jsonl")), tokenizer)
  import datasets
  datasets.DatasetDict(train=datasets.Dataset.from_list(ROWS)).save_to_disk(str(tmp_path / "dd"))
  assert "holds several splits ['train']" in _error(_cfg(str(tmp_path / "dd")), tokenizer)


def test_config_validation_checks_the_files_task(tmp_path):
  """Through the resolve step, as a run would: the paths are checked before any data is read
  (the tokenizer is not read either); a good config is then built, reading its rows."""
  from rlscale.resolve.resolved import validate
  folder = tmp_path / "hf"
  shutil.copytree(os.path.join(FIXTURES, "hf", "qwen3"), folder)
  (folder / "tokenizer.json").write_text("{}")  # not a tokenizer: read only once paths are good
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  cfg.model.hf_checkpoint = cfg.init.hf_checkpoint = str(folder)
  cfg.task.name, cfg.task.train_files = "files", str(tmp_path / "train-*.jsonl")
  with pytest.raises(ConfigError) as e:
    validate(cfg)
  assert "task.train_files: the pattern" in str(e.value)
  assert "task.eval_files is empty and task.eval_fraction=0" in str(e.value)
  _jsonl(tmp_path / "train-0.jsonl", ROWS)
  cfg.task.eval_fraction = 0.1
  with pytest.raises(ConfigError, match="tokenizer.json: cannot be read by tokenizers"):
    validate(cfg)  # the paths are good: the task is built, with the folder's tokenizer
  shutil.copy(os.path.join(make_tokenizer_folder(str(tmp_path / "tok")), "tokenizer.json"), folder)
  with pytest.raises(ConfigError, match="task.prompt_field='question' is not a column"):
    validate(cfg)  # the rows are read: their columns are problem and solution
  cfg.task.prompt_field, cfg.task.answer_field = "problem", "solution"
  with pytest.raises(ConfigError, match=r"model.vocab_size=256 is smaller than the task's "
                     r"vocabulary \(300\)"):
    validate(cfg)  # the fixture's model has fewer ids than this tokenizer
  hf_config = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps(dict(hf_config, vocab_size=320)))
  with pytest.raises(ConfigError, match=r"model.embed_tokens.weight is \[256, 64\], config.json "
                     r"implies \[320, 64\]"):
    validate(cfg)  # the weights' headers are read too: they hold 256 rows
  weights = safetensors_io.SafetensorsFolder(str(folder))
  tensors = {n: np.array(weights.get(n)) for n in weights.keys()}
  embed = tensors["model.embed_tokens.weight"]
  tensors["model.embed_tokens.weight"] = np.concatenate([embed, np.zeros((64, 64), embed.dtype)])
  safetensors_io.write(str(folder / "model.safetensors"), tensors)
  validate(cfg)


def test_system_prompt_instruction_and_thinking_reach_the_prompt(tmp_path):
  tok = HFTokenizer(make_tokenizer_folder(str(tmp_path / "tok")))
  tok.chat_template = (
      "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}[assistant]"
      "{% if enable_thinking is defined %}think={{ enable_thinking }}{% endif %}")
  path = _jsonl(tmp_path / "a.jsonl", ROWS)
  p = Problem("  What is 2 + 2? ", "4")
  text = tasks.make(_cfg(path), tok).prompt_text(p)
  assert text == "[user]What is 2 + 2?\nPut the final answer in \\boxed{}.[assistant]"
  task = tasks.make(_cfg(path, system_prompt="Be brief.", instruction="End with #### N.",
                         enable_thinking=False), tok)
  assert task.prompt_text(p) == ("[system]Be brief.[user]What is 2 + 2?\nEnd with #### N."
                                 "[assistant]think=False")
  assert tasks.make(_cfg(path, instruction="", enable_thinking=True), tok).prompt_text(p) == (
      "[user]What is 2 + 2?[assistant]think=True")
  tok.chat_template = None  # a base model: the plain form, the system prompt first
  assert task.prompt_text(p) == "Be brief.\nQuestion: What is 2 + 2?\nEnd with #### N.\nAnswer:"
  old = {k: v for k, v in _cfg(path).items()
         if k not in ("system_prompt", "instruction", "enable_thinking")}  # an older config
  old = migrate.migrate(ml_collections.ConfigDict({"task": old})).task  # as at load
  assert files.FileTask(old, tok).prompt_text(p) == (
      "Question: What is 2 + 2?\nPut the final answer in \\boxed{}.\nAnswer:")


_STEP = re.compile(r"<<(\d+)([-+*/])(\d+)=(\d+)>>")


def test_the_committed_gsm8k_style_set(tokenizer):
  with open(gsm8k_style.TRAIN) as f:
    train = [json.loads(line) for line in f]
  with open(gsm8k_style.TEST) as f:
    test = [json.loads(line) for line in f]
  assert (train, test) == gsm8k_make.generate()  # the files are what make.py writes
  assert len(train) == 64 and len(test) == 24
  assert len({r["question"] for r in train + test}) == 88
  ops = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.floor_divide}
  for r in train + test:
    steps = _STEP.findall(r["answer"])
    assert steps and r["answer"].count("<<") == len(steps)
    for a, op, b, c in steps:  # every annotation is right, parsed (not evaluated)
      assert ops[op](int(a), int(b)) == int(c) and (op != "/" or int(a) % int(b) == 0)
    assert r["answer"].endswith(f"\n#### {steps[-1][3]}")
  cfg = task_config("files")
  cfg.train_files, cfg.eval_files = gsm8k_style.TRAIN, gsm8k_style.TEST
  task = tasks.make(cfg, tokenizer)
  assert task.data_report["train"]["used"] == 64 and len(task.eval_problems()) == 24
  for p in task.problems(0, 8):
    assert task.verify(task.demonstration(p), p).correct
    assert "<<" not in task.demonstration(p)
