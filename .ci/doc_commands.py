#!/usr/bin/env python3
"""Every shell command the README and docs/ show a user, run at a tiny size (issue 44).

    python .ci/doc_commands.py              # run them all: one line each, exit 1 if any fails
    python .ci/doc_commands.py --list       # each documented command and its tiny form only
    python .ci/doc_commands.py --only=REGEX --keep   # some of them; keep the scratch and logs

.ci/run runs it with the python of a fresh venv holding only `pip install -e .` first on PATH:
`python` and `rlscale` in the commands are that install's. Standard library
only, so that it runs before (and without) the package.

- extract(): the command lines of the fenced shell blocks (```bash, ```sh, unlabeled) of
  README.md and docs/**/*.md, README first: continuations joined, comments dropped, `a && b`
  split into a and b.
- RULES: each command's tiny form, the first rule whose pattern matches. A command that no rule
  matches fails ("no tiny rule"), so that a new documented command cannot go untested. A rule
  edits the command as a user would to make it small (the tests' `:tiny` configs, one or two
  steps, a few sweep points, the benchmarks' smallest sizes) and keeps the rest: its flags,
  paths and order. Later commands read what earlier ones wrote (`analysis/report.py runs/bi`
  after the sweep into runs/bi), as in the docs.
- Each runs in a scratch folder (launch/, analysis/, benchmarks/ and configs/ linked, docs/
  copied: `--out=docs/...` never writes into the checkout), on the CPU, with a timeout, two at
  a time (--jobs); one waits for the earlier commands that name a run folder it names (runs/bi:
  the sweep before its report). A command whose tiny form is an earlier one's is not run again.
  One line each, in the docs' order: PASS, FAIL, XFAIL (a known failure, its fix named; a pass
  then fails), COVERED (run elsewhere: the install, the test suite), seconds, CPU seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")
LINKED = ("launch", "analysis", "benchmarks", "configs")  # read-only: linked into the scratch
ELSEWHERE = "elsewhere"  # a folder of the scratch without configs/: installed scripts run there
TIMEOUT_S = 600  # a hang, not a slow machine: a command takes 5-300 s on 2 cores


# --- extraction ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Command:
  where: str  # "README.md:54"
  argv: list[str]

  @property
  def text(self) -> str:  # what the rules' patterns search
    return " ".join(self.argv)


def doc_files(repo: str = REPO) -> list[str]:
  docs = sorted(glob.glob(os.path.join(repo, "docs", "**", "*.md"), recursive=True))
  return [os.path.join(repo, "README.md")] + docs


def extract(repo: str = REPO) -> list[Command]:
  """Every command of the docs' shell blocks, in order."""
  out = []
  for path in doc_files(repo):
    name = os.path.relpath(path, repo)
    with open(path) as f:
      lines = f.read().split("\n")
    block, pending, start = None, "", 0
    for i, line in enumerate(lines, 1):
      fence = re.match(r"\s*```\s*(\S*)", line)
      if fence:
        block = None if block is not None else fence.group(1).lower()
        continue
      if block not in SHELL_BLOCKS:
        continue
      if not pending:
        start = i
      pending += line.strip()
      if pending.endswith("\\"):  # a continuation
        pending = pending[:-1] + " "
        continue
      for argv in split_chain(shlex.split(pending, comments=True)):
        out.append(Command(f"{name}:{start}", argv))
      pending = ""
  return out


def split_chain(tokens: list[str]) -> list[list[str]]:
  """`a && b && c` as [a, b, c]."""
  parts, part = [], []
  for t in tokens + ["&&"]:
    if t == "&&":
      if part:
        parts.append(part)
      part = []
    else:
      part.append(t)
  return parts


# --- the tiny forms -----------------------------------------------------------------------------

# Edits: functions (argv, scratch) -> argv.

def flag(name: str, value: str | None = None):
  """Sets --name=value (in the place of the command's own), or adds --name."""
  new = f"--{name}" if value is None else f"--{name}={value}"
  def edit(argv, root):
    if not any(a.split("=", 1)[0] == f"--{name}" for a in argv):
      return argv + [new]
    return [new if a.split("=", 1)[0] == f"--{name}" else a for a in argv]
  return edit


def config_arg(arg: str, name: str = "config"):
  """`--config=FILE[:a,b]` as `--config=FILE:a,b,ARG`: the variant comes last, so that the
  tests' sizes win over the command's own (its flags still apply after)."""
  def edit(argv, root):
    return [a + ("," if ":" in a else ":") + arg if a.startswith(f"--{name}=") else a
            for a in argv]
  return edit


def sub(old: str, new: str):
  """Replaces `old` by `new` in every argument ({scratch}: the scratch folder)."""
  return lambda argv, root: [a.replace(old, new.replace("{scratch}", root)) for a in argv]


def swap(old: str, new: str):
  """An argument that is exactly `old` (a placeholder: RUN_DIR) as `new`."""
  return lambda argv, root: [new if a == old else a for a in argv]


def found(name: str, pattern: str):
  """--name=VALUE as the first path in the scratch matching `pattern` (glob), e.g. a run of a
  sweep whose point names depend on the tiny sizes."""
  def edit(argv, root):
    hits = sorted(glob.glob(os.path.join(root, pattern)))
    value = os.path.relpath(hits[0], root) if hits else pattern
    return flag(name, value)(argv, root)
  return edit


def optional(name: str):
  """The documented optional `[--name]`, given."""
  return lambda argv, root: [f"--{name}" if a == f"[--{name}]" else a for a in argv]


def add(*args: str):
  return lambda argv, root: argv + list(args)


def tiny_run(steps: int):
  """A run of launch/main.py, `python -m rlscale` or `rlscale`: the config's `:tiny` variant
  (the tests' model and batch), `steps` steps."""
  return [config_arg("tiny"), flag("config.train.num_steps", str(steps))]


# The benchmarks' smallest shapes, as tests/integration/test_benchmarks.py runs them.
TINY_MODEL = ("--layers=2", "--d_model=64", "--mlp_dim=128", "--vocab=64", "--prompt_len=8",
              "--new_tokens=8")
TINY_STEP = ("--prompts=4", "--group=4", *TINY_MODEL, "--matmul=128")
# The probe's smallest: one branch point, 3 batches and 3 seeds (the fewest it takes), one rate.
TINY_PROBE = [flag("at", "4"), flag("batches", "4,8,12"), flag("seeds", "3"), flag("rates", "1"),
              flag("responses", "36"), flag("evals", "2")]
# The sweeps' points that run: a few of the tiny sweep's (the others are the same program).
BI_POINTS = "p=[48],lr_scaling=sqrt,seed=0$"  # P = 4, 8 of the tiny batch_invariance
DS_POINTS = "p=[12],seed=0$"  # dynamic sampling on and off at P = 1, 2
STALE_POINTS = "^max_staleness=[01],(off_policy_correction=(none|tis),)?p=1,.*seed=100$"
# The committed examples' names for what the tiny forms make.
RUN_A, RUN_B = "runs/bi/p=4,lr_scaling=sqrt,seed=0", "runs/bi/p=8,lr_scaling=sqrt,seed=0"


@dataclasses.dataclass
class Rule:
  pattern: str  # a regex searched in the command, its arguments joined by spaces
  edits: tuple = ()  # functions (argv, scratch) -> argv, in order
  why: str = ""  # what the tiny form changes, in words (--list)
  covered: str = ""  # not run here: where it is run instead
  refused: str = ""  # exit status 2 with this regex in the output passes: a designed refusal
  known: str = ""  # a known failure, its fix: XFAIL; a pass then fails (remove the entry)
  devices: int = 1  # CPU devices (--xla_force_host_platform_device_count)
  cwd: str = ""  # relative to the scratch folder
  needs: tuple = ()  # fixtures made first: "checkpoint", "data"
  timeout: int = TIMEOUT_S

  def tiny(self, argv: list[str], scratch: str) -> list[str]:
    for edit in self.edits:
      argv = edit(argv, scratch)
    return argv


def rule(pattern, *edits, **kw) -> Rule:
  return Rule(pattern, tuple(e for group in edits
                             for e in (group if isinstance(group, list) else [group])), **kw)


MAIN = r"^(python launch/main\.py|python -m rlscale|rlscale) "
RULES = [
    # The README's install: what .ci/run does before this script, and its test suite.
    rule(r"^python3 -m venv \.venv$", covered=".ci/run: the fresh venv this runs in"),
    rule(r"^\. \.venv/bin/activate$", covered=".ci/run: this venv's python first on PATH"),
    rule(r"^pip install -e \.$", covered=".ci/run: `pip install -e .` into the fresh venv"),
    rule(r"^pip install -e \.\[test\]$", covered=".ci/run: its first venv (test extras)"),
    rule(r"^pytest$", covered=".ci/run: its pytest step runs the whole suite"),
    # Runs.
    rule(MAIN + r".*--config\.train\.total_responses=.*--config\.train\.keep_period=",
         tiny_run(4), flag("config.train.total_responses", "32"),
         flag("config.train.eval_every_responses", "16"), flag("config.train.checkpoint_every", "4"),
         flag("config.train.keep_period", "4"), flag("config.optim.b1", "0"),
         flag("config.rl.microbatch", "auto"),
         why="32 responses (4 steps of the tiny P = 2 x G = 4, micro-batches the plan's), its "
             "step 4 kept for the probe; Adam's b1 = 0 as below"),
    rule(MAIN + r".*--config\.train\.keep_period=", tiny_run(4), flag("config.optim.b1", "0"),
         why="4 steps, its step 4 kept for the probe; Adam's b1 = 0: the probe's branches must "
             "run 1 / (1 - b1) steps of the largest batch (3x with the parent's moments)"),
    rule(MAIN + r".*--config\.mesh\.roles=split", tiny_run(1), devices=8,
         why="8 CPU devices: 4 sample, 4 train"),
    rule(MAIN + r".*--config\.rollout\.max_staleness=", tiny_run(2),
         why="2 steps: the second generated during the first's update"),
    rule(MAIN + r".*--config\.model\.hf_checkpoint=/models/", tiny_run(1),
         sub("=/models/", "={scratch}/models/"), sub("=/data/", "={scratch}/data/"),
         needs=("checkpoint", "data"),
         why="a random Qwen2-family checkpoint of the tests' size (tests/support/policy_folder"
             ".py) and the shipped GSM8K-style prompts, at the paths the command names"),
    rule(r"^rlscale ", tiny_run(1), cwd=ELSEWHERE, why="from a folder without configs/"),
    rule(MAIN, tiny_run(1)),
    # Sweeps, studies, probes. A dry run is run as documented; Slurm's with real nodes and GPUs
    # is a dry run only.
    rule(r"launch/sweep\.py .*--launcher=slurm", optional("dry_run"),
         why="its [--dry_run]: no Slurm cluster here (tests/e2e/test_slurm_real.py runs one)"),
    rule(r"launch/sweep\.py .*--launcher=xm",
         covered="needs the xm extra (pip install 'rlscale[xm]', ~600 MB), which docs/sweeps.md "
                 "installs first; .ci/run's pytest venv has it: tests/unit/sweep/test_xm.py"),
    rule(r"launch/sweep\.py .*--dry_run"),
    rule(r"launch/sweep\.py .*--sweep=batch_invariance", config_arg("tiny"),
         flag("only", BI_POINTS), why="2 points of the tiny sweep"),
    rule(r"launch/sweep\.py .*--sweep=staleness", config_arg("tiny"), flag("only", STALE_POINTS),
         why="3 points of the tiny sweep: k = 0, and k = 1 without and with tis, at P = 1"),
    rule(r"launch/sweep\.py .*--sweep=dynamic_sampling", config_arg("tiny"),
         flag("only", DS_POINTS), why="4 points of the tiny sweep"),
    rule(r"launch/study\.py ", config_arg("tiny", name="study"), timeout=900,
         why="the study's tiny variant: every stage, 2 verdict seeds"),
    rule(r"launch/cbs_probe\.py .*--rates_from=", TINY_PROBE, flag("batches", "4,8,16"),
         flag("evals", "3"),
         why="as below, at B = 4, 8, 16 (P = 1, 2, 4 of G = 4: P the study chose a rate for)"),
    rule(r"launch/cbs_probe\.py ", TINY_PROBE,
         why="the run's kept step 4; B = 4, 8, 12 (G = 4), one rate, 3 seeds (the fewest "
             "allowed), 36 responses (48: whole steps of each B)"),
    # Analysis of what the commands above wrote.
    rule(r"analysis/advise\.py \S+/probe ", refused=r"cannot recommend: ",
         why="a tiny run reaches no target: a one-line refusal (exit 2) is the advisor's "
             "answer to it"),
    rule(r"analysis/advise\.py docs/study ", found("run", "runs/study/grpo/p=2,*seed=100"),
         why="calibrated on the tiny study's run of the same P and seed"),
    rule(r"analysis/report\.py runs/a runs/b ", swap("runs/a", RUN_A), swap("runs/b", RUN_B),
         why="two runs of the sweep for runs/a and runs/b"),
    rule(r"analysis/report\.py "),
    rule(r"analysis/compare_runs\.py ", sub("p=64,", "p=8,"),
         why="P = 8 for P = 64: a batch of the tiny sweep's"),
    rule(r"analysis/scale\.py RUN_DIR ", swap("RUN_DIR", "runs/p256"),
         why="RUN_DIR: a run of the README's"),
    # Benchmarks, at their smallest.
    rule(r"benchmarks/decode\.py", add(*TINY_MODEL, "--repeats=2", "--bandwidth_mb=8")),
    rule(r"benchmarks/rl_step\.py", add(*TINY_STEP, "--steps=2")),
    rule(r"benchmarks/profile_step\.py", add(*TINY_STEP, "--top=5")),
]


def rule_for(c: Command) -> Rule | None:
  return next((r for r in RULES if re.search(r.pattern, c.text)), None)


# --- running ------------------------------------------------------------------------------------

def scratch_folder() -> str:
  root = tempfile.mkdtemp(prefix="rlscale-doc-commands-")
  for name in LINKED:
    os.symlink(os.path.join(REPO, name), os.path.join(root, name))
  shutil.copytree(os.path.join(REPO, "docs"), os.path.join(root, "docs"))
  os.makedirs(os.path.join(root, ELSEWHERE))
  os.makedirs(os.path.join(root, "logs"))
  return root


def make_fixture(name: str, root: str, env: dict) -> None:
  """What a command names under /models or /data, made in the scratch (nothing downloaded)."""
  if name == "data":  # the GSM8K-style prompts the package ships, as /data/gsm8k/
    folder = os.path.join(root, "data", "gsm8k")
    os.makedirs(folder, exist_ok=True)
    for f in ("train.jsonl", "test.jsonl"):
      shutil.copy(os.path.join(REPO, "rlscale", "data", "gsm8k_style", f), folder)
  elif name == "checkpoint":  # a Qwen2-family folder with random weights, of the tests' size
    folder = os.path.join(root, "models", "Qwen2.5-0.5B-Instruct")
    subprocess.run(["python", "-m", "tests.support.policy_folder", folder, "num_layers=2",
                    "d_model=64", "num_heads=2", "num_kv_heads=1", "head_dim=32",
                    "mlp_dim=128"], cwd=REPO, env=env, check=True, capture_output=True)


def environment(root: str, devices: int) -> dict:
  # XLA's LLVM at -O0: the tiny programs compile in ~30% less CPU time and run as fast.
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} "
                       "--xla_backend_optimization_level=0",
             # One compilation cache for every command: the tiny programs recur.
             JAX_COMPILATION_CACHE_DIR=os.path.join(root, "xla_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  env.pop("PYTHONPATH", None)  # the install's packages, not the checkout's by accident
  # The install ran with --no-compile: the first import compiles each module once, for all the
  # processes (~100: sweep points, branches). Without .pyc files each compiles jax & co. again
  # (~5 s of CPU).
  env.pop("PYTHONDONTWRITEBYTECODE", None)
  return env


@dataclasses.dataclass(eq=False)
class Job:
  """A documented command: its rule, tiny form, the earlier jobs it waits for, its outcome."""
  i: int
  command: Command
  rule: Rule | None
  tiny: list[str] | None = None  # None: not run
  after: list = dataclasses.field(default_factory=list)
  same_as: Job | None = None  # an earlier job of the same tiny form: its outcome is this one's
  status: str = ""  # PASS, FAIL, XFAIL, COVERED; "" while pending
  note: str = ""
  wall: float = 0.0
  cpu: float = 0.0
  proc: subprocess.Popen | None = None
  t0: float = 0.0
  log: str = ""


def folders(argv: list[str]) -> set[str]:
  """The run folders a command names: `bi` for runs/bi and --reference=runs/bi/p=8,..."""
  return {m.group(1) for a in argv for m in re.finditer(r"(?:^|=)runs/([^/,]+)", a)}


def plan(commands: list[Command], root: str) -> list[Job]:
  """A job per command. One waits for the earlier ones that name a run folder it names (it
  reads what they write, or writes where they do), as the docs run them in order."""
  jobs, first = [], {}
  for i, c in enumerate(commands):
    j = Job(i, c, rule_for(c))
    if j.rule is None:
      j.status, j.note = "FAIL", f"no tiny rule for: {c.text} (add one to RULES in {__file__})"
    elif j.rule.covered:
      j.status, j.note = "COVERED", j.rule.covered
    else:
      j.tiny = j.rule.tiny(c.argv, root)
      j.same_as = first.setdefault(shlex.join(j.tiny), j)
      j.same_as = None if j.same_as is j else j.same_as
      j.after = [k for k in jobs if k.tiny and folders(k.tiny) & folders(j.tiny)]
      if any(a.startswith("[") for a in j.tiny):
        j.status, j.note = "FAIL", "an optional [argument] that no rule decides"
    jobs.append(j)
  return jobs


def start(j: Job, root: str) -> bool:
  """Starts j's process; False (j failed) when its fixtures cannot be made."""
  j.tiny = j.rule.tiny(j.command.argv, root)  # again: found() sees what the earlier ones wrote
  env = environment(root, j.rule.devices)
  try:
    for name in j.rule.needs:
      make_fixture(name, root, env)
  except subprocess.CalledProcessError as e:
    j.status, j.note = "FAIL", f"making its {name}: {e.stderr.decode()[-300:]}"
    return False
  j.log = os.path.join(root, "logs", f"{j.i:02d}.log")
  with open(j.log, "w") as f:
    f.write(f"# {j.command.where}: {j.command.text}\n# tiny: {shlex.join(j.tiny)}\n")
    f.flush()
    j.t0 = time.time()
    j.proc = subprocess.Popen(j.tiny, cwd=os.path.join(root, j.rule.cwd), env=env, stdout=f,
                              stderr=subprocess.STDOUT, start_new_session=True)
  return True


def finished(j: Job) -> bool:
  """Whether j's process has ended (killed, with what it started, past its timeout); if so,
  its outcome."""
  pid, status, usage = os.wait4(j.proc.pid, os.WNOHANG)
  late = time.time() - j.t0 > j.rule.timeout
  if not pid and not late:
    return False
  if not pid:
    os.killpg(j.proc.pid, signal.SIGKILL)  # its own session: the sweep's points too
    pid, status, usage = os.wait4(j.proc.pid, 0)
  j.proc.returncode = rc = os.waitstatus_to_exitcode(status)
  j.wall, j.cpu = time.time() - j.t0, usage.ru_utime + usage.ru_stime
  with open(j.log) as f:
    output = f.read()
  r = j.rule
  if late:
    rc, j.note = "timeout", f"killed after {r.timeout} s"
  elif rc == 2 and r.refused and re.search(r.refused, output):
    rc, j.note = 0, "refused as designed: " + re.search(f"{r.refused}.*", output).group(0)
  elif rc:
    j.note = f"exit {rc}: " + " | ".join(output.strip().split("\n")[-3:])
  if r.known:
    j.status, j.note = ("FAIL", f"passes now: remove its known failure ({r.known})") if rc == 0 \
        else ("XFAIL", f"{r.known}; {j.note}")
  else:
    j.status = "PASS" if rc == 0 else "FAIL"
  return True


def run_all(jobs: list[Job], root: str, workers: int, report) -> None:
  """Runs the jobs, `workers` at a time, each once those it waits for are done; report(job)
  once each is done, in order."""
  pending, running, shown = [j for j in jobs if not j.status], [], 0
  try:
    while pending or running or shown < len(jobs):
      for j in list(pending):
        if len(running) < workers and all(k.status for k in j.after + [j.same_as] if k):
          pending.remove(j)
          if j.same_as:
            j.status = j.same_as.status
            j.note = f"the same tiny form as {j.same_as.command.where}: not run again"
          elif start(j, root):
            running.append(j)
      running = [j for j in running if not finished(j)]
      while shown < len(jobs) and jobs[shown].status:
        report(jobs[shown])
        shown += 1
      time.sleep(0.2)
  finally:
    for j in running:
      os.killpg(j.proc.pid, signal.SIGKILL)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--list", action="store_true", help="print each command's tiny form; run none")
  ap.add_argument("--only", help="only the commands matching this regex")
  ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
  ap.add_argument("--jobs", type=int, default=2, help="commands at once (default: CI's 2 cores)")
  a = ap.parse_args(argv)
  commands = [c for c in extract() if not a.only or re.search(a.only, c.text)]
  root = "{scratch}" if a.list else scratch_folder()
  print(f"{len(commands)} documented commands; scratch {root}", flush=True)
  jobs = plan(commands, root)

  def report(j: Job) -> None:
    status = j.status or "-"
    print(f"{status:7} {j.wall:4.0f}s {j.cpu:4.0f}s cpu  {j.command.where}  "
          f"{shlex.join(j.command.argv)}", flush=True)
    if j.tiny and j.tiny != j.command.argv:
      print(f"{'':24}tiny: {shlex.join(j.tiny)}", flush=True)
    if j.note or (a.list and j.rule and j.rule.why):
      print(f"{'':24}{j.note or j.rule.why}", flush=True)

  t0 = time.time()
  if a.list:
    for j in jobs:
      report(j)
    return 0
  run_all(jobs, root, a.jobs, report)
  failed = sum(j.status == "FAIL" for j in jobs)
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  print(f"{len(jobs) - failed} of {len(jobs)} passed or covered, {failed} failed; {a.jobs} at "
        f"a time: {time.time() - t0:.0f} s, {usage.ru_utime + usage.ru_stime:.0f} s of CPU"
        + (f"; logs in {root}/logs" if a.keep else ""))
  if not a.keep:
    shutil.rmtree(root, ignore_errors=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
