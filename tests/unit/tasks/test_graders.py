"""Graders: a hand-checked table of responses, time limits on hostile input, exact/regex, config."""

import json
import pathlib
import threading
import time

import pytest

from tests.support import FIXTURES
from rlscale.config.sections import task as task_config
from rlscale.tasks import graders, verifiers
from rlscale.tasks.base import INVALID, TIMEOUT, Score

pytest.importorskip("math_verify")

TABLE = [json.loads(line) for line in
         (pathlib.Path(FIXTURES) / "graded_responses.jsonl").open()]
LIMIT_S = 1.0  # task.grader_timeout_s of the timing tests
MARGIN_S = 1.0  # what a check past its limit may take beyond it: a kill and a pipe round trip
HOSTILE = [
    "\\boxed{9^{9^{9^{9}}}}", "\\boxed{10^{10^{10}}!}", "\\boxed{9^{9^{9}}}",
    "\\boxed{(x+y+z+1)^{60}}", "\\boxed{\\sum_{n=1}^{10^{12}} n^{n}}",
    "\\boxed{" + "+".join(f"x^{{{k}}}" for k in range(120)) + "}",  # 857 characters, under the cap
    "\\boxed{" + "1+" * 50_000 + "1}",  # a 100k-character expression: over the cap, never parsed
    "\\boxed{" + "{" * 400 + "1" + "}" * 400 + "}",  # deep nesting
    "The answer is " + "(" * 300 + "2" + ")" * 300,
]


def make(grader="math", **fields):
  cfg = task_config()
  cfg.grader = grader
  cfg.update(fields)
  return graders.make(cfg)


def warm(grader):
  """A check that needs the worker, so that a timed check after it starts from a ready one."""
  assert grader("\\boxed{\\frac{3}{4}}", "0.75") == Score(1.0, True)


@pytest.mark.parametrize("row", TABLE, ids=[f"{i}:{r['why'][:40]}" for i, r in enumerate(TABLE)])
def test_hand_checked_table(row):
  grader = make(row["grader"], grader_regex=row.get("grader_regex", ""))
  s = grader(row["response"], row["reference"])
  assert s == Score(row["expected_reward"], row["expected_reward"] == 1.0), row["why"]


def test_table_covers_what_it_should():
  assert len(TABLE) >= 30 and sum(r["grader"] == "math" for r in TABLE) >= 30
  assert {r["expected_reward"] for r in TABLE} == {0.0, 1.0}


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_answers_score_zero_within_the_limit_in_the_main_thread(text):
  grader = make(grader_timeout_s=LIMIT_S)
  warm(grader)
  start = time.monotonic()
  s = grader(text, "7")
  assert s == Score(0.0, False) and s.failure in ("", TIMEOUT, INVALID)  # INVALID: over the cap
  assert time.monotonic() - start < LIMIT_S + MARGIN_S


def test_hostile_answers_score_zero_within_the_limit_in_other_threads():
  grader = make(grader_timeout_s=LIMIT_S)
  warm(grader)
  results = []

  def check(text):
    start = time.monotonic()
    results.append((grader(text, "7"), time.monotonic() - start))
  for text in HOSTILE[:3]:
    t = threading.Thread(target=check, args=(text,))
    t.start()
    t.join(timeout=60)
    warm(grader)
  assert [s for s, _ in results] == [Score(0.0, False)] * 3
  assert max(e for _, e in results) < LIMIT_S + MARGIN_S, results


def test_a_hung_worker_is_killed_and_later_checks_go_on(monkeypatch):
  """With the worker's own timer set past the deadline, only the kill can end the check."""
  grader = make(grader_timeout_s=LIMIT_S)
  warm(grader)
  monkeypatch.setattr(graders, "SOFT_SHARE", 100.0)
  pids = {w.proc.pid for w in graders._pool().workers if w.proc is not None}
  start = time.monotonic()
  s = grader("\\boxed{9^{9^{9}}+1}", "2")
  assert s == Score(0.0, False) and s.failure == TIMEOUT
  assert time.monotonic() - start < LIMIT_S + MARGIN_S
  after = {w.proc.pid for w in graders._pool().workers if w.proc is not None}
  assert after != pids  # the hung process was replaced
  start = time.monotonic()
  assert grader("\\boxed{(x+1)^2}", "x^2+2x+1") == Score(1.0, True)  # a fresh worker answers
  assert time.monotonic() - start < graders.STARTUP_S


def test_a_worker_that_cannot_start_scores_zero_and_says_so(monkeypatch, caplog):
  monkeypatch.setattr(graders, "_POOL", None)  # a pool of its own, restored afterwards
  monkeypatch.setattr(graders, "_WARNED", False)
  monkeypatch.setattr(graders.sys, "executable", "/bin/false")
  grader = make()
  start = time.monotonic()
  s = grader("\\boxed{\\frac12}", "0.5")
  assert s == Score(0.0, False) and s.failure == TIMEOUT
  assert time.monotonic() - start < 10
  assert "did not start" in caplog.text
  graders._pool().close()


def test_concurrent_callers_get_their_own_answers():
  grader = make()
  pairs = [(f"\\boxed{{\\frac{{{k}}}{{7}}}}", f"{k}/7" if k % 2 else f"{k + 1}/7")
           for k in range(40)]
  results = [None] * len(pairs)

  def run(i):
    results[i] = grader(*pairs[i]).reward
  threads = [threading.Thread(target=run, args=(i,)) for i in range(len(pairs))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert results == [float(k % 2) for k in range(40)]


def test_a_batch_of_ordinary_checks_takes_seconds():
  """1024 distinct responses, half GSM8K-like integers, half LaTeX answers math-verify parses."""
  grader = make()
  warm(grader)
  rows = []
  for k in range(512):
    rows.append((f"She has {k} + 3 = {k + 3} apples.\n#### {k + 3}", str(k + 3 + k % 2)))
    rows.append((f"So $x = \\boxed{{\\dfrac{{{k}}}{{{k + 1}}}}}$.", f"{k}/{k + 1 + k % 2}"))
  start = time.monotonic()
  rewards = [grader(r, a).reward for r, a in rows]
  elapsed = time.monotonic() - start
  assert rewards == [float(k % 2 == 0) for k in range(512) for _ in (0, 1)]
  assert elapsed < 60, f"{elapsed:.1f}s for 1024 checks"  # about 5 s on one busy CPU core


def test_exact_grader():
  grader = make("exact")
  assert grader("Final answer: New  York.", "new york") == Score(1.0, True)
  assert grader("\\boxed{Paris}", "Paris") == Score(1.0, True)
  assert grader("I think it is Paris", "Paris") == Score(0.0, False)  # no box, no anchor: all text
  assert grader("The answer is 1,000", "1000") == Score(0.0, False)  # text, not numbers
  assert grader("", "") == Score(0.0, False)  # an empty answer never matches


def test_regex_grader():
  grader = make("regex", grader_regex=r"\[\[(\w+)\]\]")
  assert grader("maybe [[cat]] ... no: [[Dog]].", "dog") == Score(1.0, True)
  assert grader("maybe [[dog]] ... no: [[cat]].", "dog") == Score(0.0, False)
  assert grader("no brackets at all: dog", "dog") == Score(0.0, False)
  whole = make("regex", grader_regex=r"\d+ apples")
  assert whole("I ate 3 apples, then 4 apples", "4 apples") == Score(1.0, True)


# Patterns that backtrack for long on a response without a match: with Python's re, (a+)+$
# against 30 a's and a b ran for minutes, deaf to Ctrl-C (the regex module answers it at once;
# 5,000 a's defeat it too).
CATASTROPHIC = [(r"(a+)+$", "a" * 5000 + "b"), (r"(x+x+)+y", "x" * 5000),
                (r"(\w|\d)+$", "1" * 5000 + "!"), (r"(a|aa)+$", "a" * 5000 + "b")]


@pytest.mark.parametrize("pattern, response", CATASTROPHIC, ids=[p for p, _ in CATASTROPHIC])
def test_a_catastrophic_regex_stops_at_the_limit_as_a_timeout(pattern, response):
  """The regex module's limit counts this process's CPU time: held to it, and to a wall-clock
  bound far under the minutes such a search took."""
  limit = 0.5
  grader = make("regex", grader_regex=pattern, grader_timeout_s=limit)
  cpu, wall = time.process_time(), time.monotonic()
  s = grader(response, "a")
  assert s == Score(0.0, False) and s.failure == TIMEOUT
  assert time.process_time() - cpu < limit + 0.5
  assert time.monotonic() - wall < 30 * limit


def test_the_regex_limit_holds_in_other_threads_and_later_checks_go_on():
  grader = make("regex", grader_regex=r"=(\d+)|(?:x+x+)+y", grader_timeout_s=0.5)
  results = []
  t = threading.Thread(target=lambda: results.append(grader("x" * 5000, "7")))
  t.start()
  t.join(timeout=60)
  assert results[0].failure == TIMEOUT
  assert grader("3+4=7", "7") == Score(1.0, True) and grader("3+4=7", "7").failure == ""
  assert make("regex", grader_regex=r"(a+)+$")("a" * 30 + "b", "a").failure == ""  # a verdict


def test_regex_grader_reads_python_re_syntax():
  grader = make("regex", grader_regex=r"(?P<ans>\d+)(?=\s*$)")
  assert grader("it is 12\n", "12") == Score(1.0, True)
  assert make("regex", grader_regex=r"(?i)ANSWER:\s*(\w+)")("answer: Cat", "cat").correct


@pytest.mark.parametrize("name", ["numeric", "exact"])
def test_a_check_that_outlasts_the_limit_on_the_wall_clock_is_a_timeout(name, monkeypatch):
  """numeric and exact scan in linear time; should one still take longer, it scores 0, counted."""
  grader = make(name, grader_timeout_s=0.5)
  assert grader("\\boxed{7}", "7") == Score(1.0, True)
  slow = verifiers.extract_answer if name == "exact" else verifiers.final_answer

  def sleepy(*args, **kwargs):
    time.sleep(1.0)
    return slow(*args, **kwargs)
  monkeypatch.setattr(verifiers, "extract_answer" if name == "exact" else "final_answer", sleepy)
  s = grader("\\boxed{7}", "7")
  assert s == Score(0.0, False) and s.failure == TIMEOUT


def test_numeric_grader_is_the_old_verifier():
  grader = make("numeric")
  for response, ref in [("So 1,000 it is", "1000"), ("x \\boxed{3/4}", "0.75"), ("no", "5"),
                        ("\\boxed{\\frac{1}{2}}", "0.5"), ("a 7 b 8", "8")]:
    old = verifiers.same_answer(verifiers.final_answer(response), ref)
    assert grader(response, ref) == Score(float(old), old)


@pytest.mark.parametrize("fields, message", [
    (dict(grader="sympy"), "task.grader='sympy'"),
    (dict(grader="regex", grader_regex="(unclosed"), "task.grader_regex='(unclosed'"),
    (dict(grader="regex", grader_regex=""), "task.grader_regex is empty"),
    (dict(grader="math", grader_timeout_s=0.0), "task.grader_timeout_s=0.0"),
    (dict(grader="regex", grader_regex="(x)", grader_timeout_s=-1.0), "task.grader_timeout_s=-1.0"),
    (dict(grader="exact", grader_timeout_s=float("inf")), "task.grader_timeout_s=inf"),
    (dict(grader="numeric", grader_timeout_s="2"), "task.grader_timeout_s='2'"),
    (dict(grader="regex", grader_regex="(x)", grader_timeout_s=True), "task.grader_timeout_s=True"),
])
def test_bad_config_is_refused_naming_the_field(fields, message):
  cfg = {**task_config(), **fields}  # a plain mapping: a typed ConfigDict refuses a str here
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("'", "'")):
    graders.make(cfg)


def test_math_without_math_verify_is_refused(monkeypatch):
  real = graders.importlib.util.find_spec
  monkeypatch.setattr(graders.importlib.util, "find_spec",
                      lambda name, *a: None if name == "math_verify" else real(name, *a))
  with pytest.raises(ValueError, match="task.grader='math' needs the math-verify package"):
    make("math")


@pytest.mark.parametrize("name", graders.NAMES)
def test_graders_never_raise(name):
  grader = make(name, grader_regex="(x)")
  cases = [(None, "1"), ("1", None), (b"1", "1"), ("x" * (10**6 + 1), "x"), ("#### ", "#### ")]
  if name != "numeric":  # the old checker matches an empty box with an empty reference
    cases += [("\\boxed{}", ""), ("\\boxed{\\}", "}")]
  for response, reference in cases:
    s = grader(response, reference)
    assert s == Score(0.0, False)
    assert s.failure == (INVALID if not isinstance(response, str) or reference is None
                         or len(response) > graders.MAX_RESPONSE_CHARS else "")


@pytest.mark.parametrize("text, expected", [
    ("a \\boxed{\\frac{1}{\\sqrt{2}}} b", "\\frac{1}{\\sqrt{2}}"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
    ("\\boxed{1} then \\fbox{2}", "2"),
    ("$\\boxed 5$", "5"),
    ("\\boxed{1} then \\boxed{2", None),
    ("no box", None),
])
def test_last_boxed(text, expected):
  assert verifiers.last_boxed(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("Final Answer: The final answer is $5$. I hope it is correct.", "5"),
    ("**Final Answer:** 18 dollars", "18 dollars"),
    ("The answer is:\n\n$$x^2$$", "x^2"),
    ("The answer is 4.\nCheck: 2+2 = 4, done", "4"),
    ("<think>maybe 3</think><answer> 42 </answer>", "42"),
    ("It costs $1,000.", "1000"),
    ("pages 10-12", "12"),
    ("nothing here", None),
])
def test_extract_answer(text, expected):
  assert verifiers.extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("1 000", "1000"), ("1\\,000", "1000"), ("\\$18", "18"), ("5 cm", "5"), ("50 percent", "50%"),
    ("2 pi", "2 pi"), ("5 x", "5 x"), ("1,2", "1,2"), ("3.5 apples per day", "3.5"),
])
def test_canonical_number(text, expected):
  assert verifiers.canonical_number(text) == expected


def test_plain_equal_decides_only_what_it_can():
  assert verifiers.plain_equal("007", "7") is True
  assert verifiers.plain_equal("3", "4") is False
  assert verifiers.plain_equal("1/2", "0.5") is True
  assert verifiers.plain_equal("0.333333", "1/3") is None  # math-verify rounds; it decides
  assert verifiers.plain_equal("1,2", "12") is None  # a pair, not twelve


def test_extraction_is_linear_on_long_text():
  """At the response cap; "answer" and a million spaces took hours (15 s at 20,000) when the
  anchor's pattern could split the spaces around its optional stars in many ways."""
  for text in ("<answer>" * 100_000, " " * 1_000_000, "answer: " * 100_000, "{" * 500_000,
               "\\boxed{" * 100_000, "1," * 400_000, "answer" + " " * 999_990 + "x",
               "Final answer" + " " * 999_980 + "*" * 5 + "x", "answer **" + "*" * 999_990,
               "1" + " " * 999_998 + "x"):
    start = time.monotonic()
    verifiers.extract_answer(text)
    # About 0.5 s alone (5.2 s once with 4 test processes on 2 cores); a quadratic scan takes
    # minutes to hours, so 30 s tells the two apart on a loaded machine.
    assert time.monotonic() - start < 30.0
