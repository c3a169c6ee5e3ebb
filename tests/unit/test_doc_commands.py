""".ci/doc_commands.py: it finds the commands of the README and docs/, and has a tiny rule for
each (the commands themselves run in .ci/run's step, not here)."""

import importlib.util
import os
import sys

from tests.support import REPO

_spec = importlib.util.spec_from_file_location(
    "doc_commands", os.path.join(REPO, ".ci", "doc_commands.py"))
dc = importlib.util.module_from_spec(_spec)
sys.modules["doc_commands"] = dc  # its dataclasses look their module up while it executes
_spec.loader.exec_module(dc)


def test_the_extractor_joins_lines_drops_comments_and_splits_chains(tmp_path):
  (tmp_path / "docs" / "sub").mkdir(parents=True)
  (tmp_path / "README.md").write_text(
      "text\n```bash\npython3 -m venv .venv && pip install -e . && python a.py --x=1\n```\n"
      "```python\nimport os  # not a shell block\n```\n")
  (tmp_path / "docs" / "sub" / "b.md").write_text(
      "```\n# a comment\npython b.py --y='a b' \\\n    --z=2   # a trailing comment\n\n```\n"
      "```sh\nrlscale --config=c.py\n```\n")
  got = [(c.where, c.argv) for c in dc.extract(str(tmp_path))]
  assert got == [("README.md:3", ["python3", "-m", "venv", ".venv"]),
                 ("README.md:3", ["pip", "install", "-e", "."]),
                 ("README.md:3", ["python", "a.py", "--x=1"]),
                 ("docs/sub/b.md:3", ["python", "b.py", "--y=a b", "--z=2"]),
                 ("docs/sub/b.md:8", ["rlscale", "--config=c.py"])]


def test_the_documented_commands_are_found():
  commands = dc.extract()
  texts = [c.text for c in commands]
  assert len(commands) > 30
  assert "python launch/main.py --config=configs/grpo.py" in texts  # the quickstart's, after &&
  assert any(c.where.startswith("docs/") for c in commands)
  assert not any(a.startswith("#") for c in commands for a in c.argv)
  math = next(c for c in commands if "--config.model.hf_checkpoint=" in c.text)
  assert math.argv[-1].startswith("--config.task.eval_files=")  # continuations joined


def test_every_documented_command_has_a_tiny_rule_and_every_rule_a_command():
  commands = dc.extract()
  missing = [f"{c.where}: {c.text}" for c in commands if dc.rule_for(c) is None]
  assert not missing, "no tiny rule in .ci/doc_commands.py RULES for:\n" + "\n".join(missing)
  used = {id(dc.rule_for(c)) for c in commands}
  unused = [r.pattern for r in dc.RULES if id(r) not in used]
  assert not unused, f"rules no documented command matches (remove them): {unused}"
  for c in commands:
    r = dc.rule_for(c)
    if not r.covered:
      tiny = r.tiny(c.argv, "/scratch")
      assert not [a for a in tiny if a.startswith("[")], (c.where, tiny)  # [--x] decided


def test_the_tiny_forms_keep_the_command_and_shrink_it():
  def tiny(text):
    c = dc.Command("x.md:1", text.split())
    return " ".join(dc.rule_for(c).tiny(c.argv, "/scratch"))
  assert tiny("python launch/main.py --config=configs/grpo.py:p=256,g=8 --workdir=runs/p256") == (
      "python launch/main.py --config=configs/grpo.py:p=256,g=8,tiny --workdir=runs/p256 "
      "--config.train.num_steps=1")
  assert tiny("rlscale --config=configs/ppo.py") == (
      "rlscale --config=configs/ppo.py:tiny --config.train.num_steps=1")
  assert "--only=" in tiny("python launch/sweep.py --config=configs/grpo.py "
                           "--sweep=batch_invariance --workdir=runs/bi --parallel=2")
  assert tiny("python analysis/scale.py RUN_DIR --chips 1") == (
      "python analysis/scale.py runs/p256 --chips 1")
