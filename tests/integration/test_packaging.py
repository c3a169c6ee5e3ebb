"""A non-editable install holds every subpackage and the shipped configs, and runs from anywhere."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest
import setuptools

from tests.support import REPO
from rlscale.config import files as config_files


# Imported in the installed copy; a module whose optional dependency is absent is reported, not
# failed (both import theirs lazily today, so they import either way).
OPTIONAL = {"reasoning_gym": "reasoning", "tensorflow_datasets": "tfds"}

# Runs in a fresh interpreter on the unpacked wheel only (plus the venv's third-party packages).
CHECK_INSTALLED = r"""
import importlib, json, os, pkgutil, sys
import rlscale
from rlscale.config import files as config_files
site = sys.argv[1]
assert rlscale.__file__.startswith(site), rlscale.__file__
imported, skipped = [], {}
names = [m.name for m in pkgutil.walk_packages(rlscale.__path__, "rlscale.")]
names += ["rlscale.configs." + f[:-3] for f in sorted(os.listdir(os.path.join(site, "rlscale", "configs")))
          if f.endswith(".py")]
for name in ["rlscale"] + names:
  try:
    module = importlib.import_module(name)
  except ImportError as e:
    if e.name not in OPTIONAL:
      raise
    skipped[name] = e.name
    continue
  assert module.__file__.startswith(site), (name, module.__file__)
  imported.append(name)
cfg = config_files.load("configs/grpo.py:tiny")
sft = config_files.load(cfg.init.sft_config, config_files.find("configs/grpo.py")[0])
print(json.dumps(dict(imported=imported, skipped=skipped, cwd=os.getcwd(),
                      grpo=config_files.find("configs/grpo.py:tiny")[0],
                      pkg=config_files.find("rlscale.configs.ppo")[0],
                      kind=cfg.kind, steps=cfg.train.num_steps, sft_kind=sft.kind)))
""".replace("OPTIONAL", repr(set(OPTIONAL)))


def _package_dirs(root):
  for folder, dirs, _ in os.walk(root):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    yield folder


def test_every_folder_under_rlscale_is_a_package():
  root = os.path.join(REPO, "rlscale")
  folders = list(_package_dirs(root))
  missing = [f for f in folders if not os.path.isfile(os.path.join(f, "__init__.py"))]
  assert not missing, f"folders without __init__.py: {missing}"
  found = set(setuptools.find_packages(REPO, include=["rlscale", "rlscale.*"]))
  want = {os.path.relpath(f, REPO).replace(os.sep, ".") for f in folders}
  assert found == want


def test_the_editable_checkout_finds_its_configs_from_anywhere(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert config_files.packaged_dirs() == [os.path.join(REPO, "configs")]
  out = subprocess.run([sys.executable, "-m", "rlscale", "--config=configs/nope.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2  # a missing config: one line, no traceback
  assert out.stderr.strip().splitlines() == [
      f"error: --config: config file 'configs/nope.py' not found; looked in 'configs/nope.py', "
      f"{os.path.join(REPO, 'configs', 'nope.py')!r} (current directory {str(tmp_path)!r})"]


def _build_wheel(tmp_path):
  """The wheel of a copy of the checkout (the build writes build/ and egg-info beside setup.py)."""
  src = _mkdir(tmp_path / "src")
  for name in ("setup.py", "README.md"):
    shutil.copy(os.path.join(REPO, name), src / name)
  for name in ("rlscale", "configs"):
    shutil.copytree(os.path.join(REPO, name), src / name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "--no-index", "-q", "-w", str(tmp_path / "dist"), str(src)],
                 check=True, capture_output=True, timeout=300)
  (wheel,) = (tmp_path / "dist").glob("rlscale-*.whl")
  return wheel


def _mkdir(path):
  path.mkdir(parents=True)
  return path


def _installed_python(site, cwd, *args, timeout=300):
  """python -S -P: no .pth files (so not the editable install) and not the cwd on sys.path."""
  third_party = sysconfig.get_paths()["purelib"]
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "PYTHON"))}
  env.update(PYTHONPATH=f"{site}{os.pathsep}{third_party}", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-S", "-P", *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=timeout)


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_runs_a_config_from_anywhere(tmp_path):
  wheel = _build_wheel(tmp_path)
  site = tmp_path / "site"
  with zipfile.ZipFile(wheel) as z:
    z.extractall(site)
    names = set(z.namelist())
  for folder in _package_dirs(os.path.join(REPO, "rlscale")):
    for f in os.listdir(folder):
      if f.endswith(".py"):
        assert os.path.relpath(os.path.join(folder, f), REPO) in names
  for f in os.listdir(os.path.join(REPO, "configs")):
    if f.endswith(".py"):
      assert f"rlscale/configs/{f}" in names  # one copy in the checkout, shipped in the wheel
  (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
  assert "rlscale = rlscale.run.main:run" in (site / entry_points).read_text()

  elsewhere = _mkdir(tmp_path / "elsewhere")
  out = _installed_python(str(site), elsewhere, "-c", CHECK_INSTALLED, str(site))
  assert out.returncode == 0, out.stderr[-4000:]
  got = json.loads(out.stdout.strip().splitlines()[-1])
  want = set(_modules_of_checkout())
  assert want <= set(got["imported"]) | set(got["skipped"]), want - set(got["imported"])
  for name, dep in got["skipped"].items():
    print(f"not imported: {name} (optional dependency {dep} is not installed)")
  assert got["grpo"] == str(site / "rlscale" / "configs" / "grpo.py")
  assert got["pkg"] == str(site / "rlscale" / "configs" / "ppo.py")
  assert (got["kind"], got["sft_kind"], got["cwd"]) == ("grpo", "sft", str(elsewhere))

  # The command line of an installed user: a shipped config, run from a directory of their own.
  run = _installed_python(str(site), elsewhere, "-m", "rlscale", "--config=configs/sft.py:tiny",
                          "--config.train.num_steps=1", "--workdir=run", timeout=600)
  assert run.returncode == 0, run.stderr[-4000:]
  assert os.path.isfile(elsewhere / "run" / "policy" / "COMPLETE")
  with open(elsewhere / "run" / "metrics.jsonl") as f:
    assert [json.loads(line)["step"] for line in f] == [1]


def _modules_of_checkout():
  for folder in _package_dirs(os.path.join(REPO, "rlscale")):
    package = os.path.relpath(folder, REPO).replace(os.sep, ".")
    yield package
    for f in os.listdir(folder):
      if f.endswith(".py") and f != "__init__.py":
        yield f"{package}.{f[:-3]}"
  for f in os.listdir(os.path.join(REPO, "configs")):
    if f.endswith(".py"):
      yield f"rlscale.configs.{f[:-3]}"
