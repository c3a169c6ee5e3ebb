"""analysis/pass_at_k.py's inputs: each checked before a policy loads, one line naming it."""

import os
import shutil

import pytest

from tests.support import FIXTURES, REPO
from analysis import pass_at_k

CONFIG = os.path.join(REPO, "configs", "grpo.py:tiny")


@pytest.mark.parametrize("args, expect", [
    (["--k=0", "p"], "--k=0 must be >= 1"),
    ([f"--config={REPO}/configs/nope.py", "p"], "config file"),
    (["/nonexistent/policy"], "policy='/nonexistent/policy': /nonexistent/policy: no config.json"),
    (["damaged"], "6 tensor(s) of the wrong shape"),
])
def test_bad_input_is_one_line_naming_it(args, expect, tmp_path, capsys):
  damaged = tmp_path / "damaged"
  shutil.copytree(os.path.join(FIXTURES, "hf", "qwen3"), damaged)
  config = (damaged / "config.json").read_text()
  (damaged / "config.json").write_text(config.replace('"intermediate_size": 160',
                                                      '"intermediate_size": 96'))
  argv = [str(damaged) if a == "damaged" else a for a in args]
  if not any(a.startswith("--config") for a in argv):
    argv.append(f"--config={CONFIG}")
  with pytest.raises(SystemExit) as e:
    pass_at_k.main(argv)
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and expect in err[-1], err
