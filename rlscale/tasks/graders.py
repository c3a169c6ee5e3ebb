"""Graders: (response text, reference answer) -> Score, chosen by `task.grader`.

- math: the answer a response commits to (the last \\boxed{} or \\fbox{}, else an <answer> tag,
  else the anchored final-line answer such as "The answer is X", "Final answer: X", "#### X",
  else the last number of the last line; `verifiers.extract_answer`) compared with the
  reference by math-verify, the checker of verl, TRL and Open-R1: numeric equivalence
  (1/2 = 0.5 = \\frac{1}{2}, 1,000 = 1000, 50% = 0.5 as math-verify decides) and symbolic
  equivalence (x^2+2x+1 = (x+1)^2, sets, intervals). Both sides are parsed as verl parses the
  reference: the answer inside \\boxed{}, read by math-verify's LaTeX extraction. Its
  plain-expression extraction is left out: it runs sympy's parse_expr, which evaluates text,
  and on answers already extracted it changed no verdict we tried (1/2, 2*3, 6÷2, 10!, 50%).
  Plain numbers are first written as digits (`verifiers.canonical_number`: currency signs,
  thousands separators and unit words go).
- numeric: `verifiers.final_answer` + `verifiers.same_answer`, the checker of old runs.
- exact: the extracted answer (box, tag, anchored line, else the whole response) equals the
  reference after whitespace, case and trailing-period normalization.
- regex: the last match of `task.grader_regex` (its first group, else the whole match)
  compared as exact. The pattern is the user's; it runs in the caller under the `regex`
  module (Python re's syntax and matches), whose search stops at the time limit even inside
  a catastrophic backtrack, which re cannot (its C loop never yields to a signal handler).

Model text is parsed, never evaluated, and a grader never raises: any failure scores 0. A
response scored 0 without a verdict says why in `Score.failure`, which the step's metrics
count (rlscale/tasks/base.py): TIMEOUT for a check past the limit, INVALID for a response over
MAX_RESPONSE_CHARS, input that is no text, or a check that raised.

Time limit (`task.grader_timeout_s`), for every grader. numeric and exact, and math's answer
extraction in the caller, run only scans linear in the response's length
(tests/unit/tasks/test_graders.py times hostile shapes at the cap); a numeric or exact check
that still took longer on the wall clock scores 0 as a TIMEOUT.
regex: the `regex` module ends a search (the whole `finditer`) after the limit in this
process's CPU time, its clock, so a process whose other threads are busy stops it sooner and a
machine whose other processes are busy later on the wall clock; the wall-clock rule of numeric
and exact applies too. math: math-verify bounds its own work with signal.alarm: that
works only in the main thread (elsewhere it raises), counts whole seconds, and a handler runs
only between bytecodes, so a long C call (a big-integer power, a regex backtrack) outlasts it.
Sympy on `9^{9^{9}}` or `10^{10^{10}}!` ran past 20 s without it (we stopped it there). Here
every math-verify call runs in a persistent worker process instead (`_Worker`, started with
subprocess, so a JAX parent is never forked); the caller waits on the worker's pipe with a
deadline and, past it, kills the process and starts a fresh one, which imports in the background
while the caller returns 0 as a TIMEOUT (as it does when a worker dies or never starts). The
same path serves the main thread and any other, so the limit holds for both. Inside the worker
an interval timer (the worker's own main thread) interrupts a check at 80% of the limit, so
most slow checks answer 0 without costing a restart; the kill is the guarantee. The worker's
address space is capped (WORKER_MEMORY), so a runaway expression ends in a MemoryError there,
not in the host's OOM killer. Workers form a small pool (up to MAX_WORKERS, one per concurrent
caller; a caller waits for a free one), shared by all graders of the process.

Keeping the common case fast: responses over MAX_RESPONSE_CHARS and answers over
MAX_ANSWER_CHARS score 0 before any parsing; integers (all of GSM8K) are compared in the
caller without math-verify, as are plain numbers that are equal; the remaining pairs cost a
pipe round trip plus math-verify's time (about 4 ms on one CPU core) and are cached by
(reference, answer), since a group of responses to one prompt repeats answers (a check that ran
out of time is not cached). Waiting for a worker to start (about a
second, up to STARTUP_S) is not counted in a check's limit.
"""

from __future__ import annotations

import atexit
import collections
import functools
import importlib.util
import json
import logging
import os
import queue
import selectors
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Mapping

from rlscale.tasks import verifiers
from rlscale.tasks.base import INVALID, TIMEOUT, Score

NAMES = ("math", "numeric", "exact", "regex")
MAX_RESPONSE_CHARS = 1_000_000  # longer responses score 0 without being searched
MAX_ANSWER_CHARS = 1_000  # longer extracted answers (and references) score 0 unparsed
MAX_WORKERS = min(4, os.cpu_count() or 1)
STARTUP_S = 60.0  # a worker that is not ready within this is killed; the check scores 0
SOFT_SHARE = 0.8  # share of the limit after which the worker interrupts a check itself
WORKER_MEMORY = 2 << 30  # bytes of address space a worker may use
CACHE_SIZE = 8192  # (reference, answer) verdicts remembered

Grader = Callable[[str, str], Score]
_log = logging.getLogger(__name__)


def make(cfg: Mapping[str, Any]) -> Grader:
  """The grader named by `cfg.grader`; a bad name, pattern or time limit is refused here, naming
  the field."""
  name = cfg["grader"]
  if name not in NAMES:
    raise ValueError(f"task.grader={name!r}; known: {NAMES}")
  timeout_s = _time_limit(cfg["grader_timeout_s"])
  if name == "math":
    if importlib.util.find_spec("math_verify") is None:
      raise ValueError("task.grader='math' needs the math-verify package (pip install -e .)")
    _pool().prestart()
    return _guarded(lambda response, reference: _math(response, reference, timeout_s))
  if name == "numeric":
    return _guarded(lambda response, reference: verifiers.same_answer(
        verifiers.final_answer(response), reference), timeout_s)
  if name == "exact":
    return _guarded(_exact, timeout_s)
  compiled = _pattern(cfg["grader_regex"])
  return _guarded(lambda response, reference: _regex(compiled, response, reference, timeout_s),
                  timeout_s)


def _time_limit(value: Any) -> float:
  """task.grader_timeout_s as seconds, refused unless a finite number > 0."""
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  if not (ok and 0 < value < float("inf")):
    raise ValueError(f"task.grader_timeout_s={value!r} must be a number of seconds > 0")
  return float(value)


def _pattern(pattern: Any):
  """task.grader_regex compiled by the `regex` module (the syntax and matches of Python's re,
  plus a time limit per search), refused when empty or not a regular expression."""
  if not pattern:
    raise ValueError("task.grader_regex is empty; task.grader='regex' needs a pattern")
  try:
    import regex
  except ImportError:
    raise ValueError("task.grader='regex' needs the regex package (pip install -e .)") from None
  try:
    return regex.compile(pattern, regex.VERSION0)
  except (regex.error, ValueError, TypeError) as e:
    raise ValueError(f"task.grader_regex={pattern!r} is not a regular expression: {e}") from e


def _guarded(check: Callable[[str, str], bool | None], timeout_s: float | None = None) -> Grader:
  """A grader from a check that answers True, False or None (out of time): reward 1.0 or 0.0.
  Scored 0 with a failure: TIMEOUT for None or, given `timeout_s`, for a check that took longer
  on the wall clock; INVALID for a response or reference that is no text, a response over
  MAX_RESPONSE_CHARS, or a check that raises."""
  def grader(response: str, reference: str) -> Score:
    if (not isinstance(response, str) or not isinstance(reference, str)
        or len(response) > MAX_RESPONSE_CHARS):
      return Score(0.0, False, INVALID)
    start = time.monotonic()
    try:
      ok = check(response, reference)
    except Exception:  # a grader bug or pathological text must not end a run
      return Score(0.0, False, INVALID)
    if ok is None or (timeout_s is not None and time.monotonic() - start > timeout_s):
      return Score(0.0, False, TIMEOUT)
    return Score(1.0, True) if ok else Score(0.0, False)
  return grader


def _exact(response: str, reference: str) -> bool:
  answer = verifiers.extract_answer(response, last_number=False)
  return _same_text(answer, verifiers.reference_answer(reference))


def _regex(pattern, response: str, reference: str, timeout_s: float) -> bool | None:
  """The last match (its first group, else the whole match) equals the reference as text; None
  when the search outlasts `timeout_s` (the regex module's clock: this process's CPU time)."""
  last = None
  try:
    for last in pattern.finditer(response, timeout=timeout_s):
      pass
  except TimeoutError:
    return None
  if last is None:
    return False
  found = last.group(1) if pattern.groups else last.group(0)
  return _same_text(found, verifiers.reference_answer(reference))


def _same_text(answer: str | None, reference: str) -> bool:
  if answer is None:
    return False
  a, b = verifiers.normalize_text(answer), verifiers.normalize_text(reference)
  return bool(a) and a == b


def _math(response: str, reference: str, timeout_s: float) -> bool | None:
  """math-verify's verdict on the response's answer, bounded by `timeout_s`; None when the
  worker ran out of time."""
  answer = verifiers.extract_answer(response)
  gold = verifiers.reference_answer(reference)
  if not answer or not gold or max(len(answer), len(gold)) > MAX_ANSWER_CHARS:
    return False
  answer, gold = verifiers.canonical_number(answer), verifiers.canonical_number(gold)
  plain = verifiers.plain_equal(answer, gold)
  if plain is not None:
    return plain
  key = (gold, answer)
  with _CACHE_LOCK:
    if key in _CACHE:
      _CACHE.move_to_end(key)
      return _CACHE[key]
  ok = _pool().check(gold, answer, timeout_s)
  if ok is None:  # out of time (or a dead worker): 0 now, but not remembered, since a loaded
    return None  # machine can time out a check that an idle one answers
  with _CACHE_LOCK:
    _CACHE[key] = ok
    while len(_CACHE) > CACHE_SIZE:
      _CACHE.popitem(last=False)
  return ok


_CACHE: collections.OrderedDict[tuple[str, str], bool] = collections.OrderedDict()
_CACHE_LOCK = threading.Lock()


# --- the worker processes ---
_WARNED = False  # whether a worker's failure to start was logged


class _Dead(Exception):
  """The worker missed its deadline, died, or broke the protocol."""


class _Worker:
  """One math-verify process, used by one thread at a time (the pool hands it out)."""

  def __init__(self):
    self.proc: subprocess.Popen | None = None
    self.ready = False
    self.buffer = b""
    self.selector: selectors.BaseSelector | None = None

  def start(self) -> None:
    # The child imports rlscale as this process did: installed, or from the same PYTHONPATH or
    # working directory, which it inherits.
    self.proc = subprocess.Popen(
        [sys.executable, "-c", "from rlscale.tasks.graders import serve; serve()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        bufsize=0, close_fds=True)
    self.ready, self.buffer = False, b""
    self.selector = selectors.DefaultSelector()
    self.selector.register(self.proc.stdout, selectors.EVENT_READ)

  def stop(self) -> None:
    if self.proc is None:
      return
    try:
      self.proc.kill()
      self.proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
      pass
    for f in (self.proc.stdin, self.proc.stdout):
      try:
        f.close()
      except OSError:
        pass
    self.selector.close()
    self.proc = self.selector = None

  def check(self, gold: str, answer: str, timeout_s: float) -> bool | None:
    """The worker's verdict, None when it ran out of time; past `timeout_s` (or on any
    failure) the process is replaced."""
    try:
      if self.proc is None or self.proc.poll() is not None:
        self.stop()
        self.start()
      if not self.ready:
        self._await_ready()
      message = json.dumps([gold, answer, SOFT_SHARE * timeout_s]).encode() + b"\n"
      self._write(message)
      reply = self._line(time.monotonic() + timeout_s)
      if reply not in (b"0", b"1", b"t"):
        raise _Dead(f"reply {reply!r}")
      return None if reply == b"t" else reply == b"1"
    except (_Dead, OSError, ValueError) as e:
      _log.debug("grader worker replaced: %s", e)
      self.stop()
      self.start()  # imports while the caller goes on
      return None

  def _await_ready(self) -> None:
    try:
      if self._line(time.monotonic() + STARTUP_S) == b"ready":
        self.ready = True
        return
    except _Dead:
      pass
    global _WARNED
    if not _WARNED:  # every math check scores 0 until a worker starts: say so once
      _log.warning("a math grader worker did not start (%s -c ...): checks score 0",
                   sys.executable)
      _WARNED = True
    raise _Dead("not ready")

  def _write(self, data: bytes) -> None:
    fd = self.proc.stdin.fileno()
    while data:
      data = data[os.write(fd, data):]

  def _line(self, deadline: float) -> bytes:
    fd = self.proc.stdout.fileno()
    while b"\n" not in self.buffer:
      left = deadline - time.monotonic()
      if left <= 0 or not self.selector.select(left):
        raise _Dead("deadline passed")
      chunk = os.read(fd, 4096)
      if not chunk:
        raise _Dead("worker exited")
      self.buffer += chunk
    line, self.buffer = self.buffer.split(b"\n", 1)
    return line.strip()


class _Pool:
  """Up to MAX_WORKERS workers, created on demand; a caller takes a free one or waits."""

  def __init__(self):
    self.pid = os.getpid()
    self.free: queue.LifoQueue[_Worker] = queue.LifoQueue()  # the warmest first
    self.workers: list[_Worker] = []
    self.lock = threading.Lock()

  def _take(self) -> _Worker:
    try:
      return self.free.get_nowait()
    except queue.Empty:
      pass
    with self.lock:
      if len(self.workers) < MAX_WORKERS:
        self.workers.append(_Worker())
        return self.workers[-1]
    return self.free.get()

  def prestart(self) -> None:
    """Start one worker now so that its imports overlap the caller's setup."""
    w = self._take()
    try:
      if w.proc is None:
        w.start()
    finally:
      self.free.put(w)

  def check(self, gold: str, answer: str, timeout_s: float) -> bool | None:
    w = self._take()
    try:
      return w.check(gold, answer, timeout_s)
    finally:
      self.free.put(w)

  def close(self) -> None:
    for w in self.workers:
      w.stop()


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> _Pool:
  """The process's pool; a forked child builds its own rather than share its parent's pipes."""
  global _POOL
  with _POOL_LOCK:
    if _POOL is None or _POOL.pid != os.getpid():
      _POOL = _Pool()
    return _POOL


def _close_pool() -> None:
  if _POOL is not None and _POOL.pid == os.getpid():
    _POOL.close()


atexit.register(_close_pool)


# --- inside a worker process ---
class _SoftTimeout(BaseException):
  """Raised by the worker's interval timer: a BaseException, so that no `except Exception` in
  math-verify or sympy swallows it."""


def serve() -> None:
  """A worker's loop: [reference, answer, soft limit] as one JSON line in, '1', '0' or 't'
  (out of time) out."""
  import resource
  import signal
  protocol = os.fdopen(os.dup(1), "w")
  os.dup2(2, 1)  # what the libraries print goes to stderr, never into the protocol
  sys.stdout = sys.stderr
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle
  try:
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
  except (ValueError, OSError):
    pass
  _exit_with_parent()
  equal = _math_verify_equal()
  for gold, answer in _WARM_UP:  # sympy's lazy imports, before the first timed check
    equal(gold, answer)
  protocol.write("ready\n")
  protocol.flush()

  def interrupt(signum, frame):
    raise _SoftTimeout()
  signal.signal(signal.SIGALRM, interrupt)
  for line in sys.stdin:
    protocol.write({True: "1\n", False: "0\n", None: "t\n"}[_one(equal, line)])
    protocol.flush()


_WARM_UP = (("\\frac{1}{2}", "0.5"), ("(x+1)^2", "x^2+2x+1"), ("[0,1)", "\\{1,2\\}"),
            ("\\sqrt{2}/2", "50\\%"))


def _one(equal: Callable[[str, str], bool], line: str) -> bool | None:
  """One request; None when the soft timer fires, False on a MemoryError or anything else."""
  import signal
  try:
    try:
      gold, answer, soft_s = json.loads(line)
      signal.setitimer(signal.ITIMER_REAL, max(float(soft_s), 1e-3))
      return bool(equal(gold, answer))
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
  except _SoftTimeout:
    return None
  except BaseException:
    return False


def _math_verify_equal() -> Callable[[str, str], bool]:
  """math-verify's equivalence of two answers, each read as the content of a \\boxed{} (LaTeX
  first, plain expressions as fallback), with its own signal timeouts off (`serve` has one)."""
  from math_verify import LatexExtractionConfig, parse, verify
  logging.disable(logging.CRITICAL)  # its timeout-disabled and no-match warnings
  targets = (LatexExtractionConfig(boxed_match_priority=0),)

  @functools.lru_cache(maxsize=1024)  # a reference is read once per group of responses
  def read(text: str) -> tuple:
    return tuple(parse("\\boxed{" + text + "}", targets, parsing_timeout=None))

  def equal(gold: str, answer: str) -> bool:
    g, a = list(read(gold)), list(read(answer))
    return bool(g) and bool(a) and verify(g, a, timeout_seconds=None)
  return equal


def _exit_with_parent() -> None:
  """Exit when the parent is gone (its pipe's EOF does not reach a worker in a long check)."""
  parent = os.getppid()

  def watch():
    while os.getppid() == parent:
      time.sleep(1.0)
    os._exit(0)
  threading.Thread(target=watch, daemon=True).start()
