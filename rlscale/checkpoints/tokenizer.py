"""The tokenizer of a Hugging Face checkpoint: tokenizer.json, its chat template and special ids.

A prompt is rendered as transformers renders it, so that its token ids equal
`AutoTokenizer.from_pretrained(folder).apply_chat_template(..., tokenize=True)`: the same template
file wins, the same sandboxed Jinja environment (whitespace options, `raise_exception`,
`strftime_now`, `tojson` with json.dumps's options, loop controls, `{% generation %}`), the same
variables (the named special tokens, `tools`, `documents`) and the same clean-up of the messages
(keys whose value is None dropped; reasoning under each name templates read it by).
tests/unit/checkpoints/test_chat_templates.py holds us to that on the templates Qwen2.5, Qwen3 and Llama 3.x ship.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
from typing import Any, Mapping, Sequence

from rlscale.checkpoints.safetensors_io import CheckpointError

# The named special tokens transformers hands a chat template (when the tokenizer sets them).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
# Names a message's reasoning comes under; templates read `reasoning_content` (gpt-oss `thinking`).
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
_TEMPLATE_FILE = "chat_template.jinja"
_TEMPLATE_DIR = "additional_chat_templates"  # more named templates, one .jinja each


def _read_json(path: str) -> dict[str, Any]:
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      out = json.load(f)
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(out, dict):
    raise CheckpointError(f"{path}: holds a {type(out).__name__}, not a JSON object")
  return out


def _read_text(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def _token_text(t: Any) -> str | None:
  return t.get("content") if isinstance(t, dict) else t


def _special_tokens(folder: str, cfg: dict[str, Any]) -> dict[str, str]:
  """The named special tokens: tokenizer_config.json's, then special_tokens_map.json's (the older
  place) for the names the config leaves out."""
  legacy = _read_json(os.path.join(folder, "special_tokens_map.json"))
  out = {}
  for name in SPECIAL_TOKEN_NAMES:
    text = _token_text(cfg.get(name))
    text = _token_text(legacy.get(name)) if text is None else text
    if text is not None:
      if not isinstance(text, str):
        raise CheckpointError(f"{folder}/tokenizer_config.json: {name} is {text!r}, not a string")
      out[name] = text
  return out


def _chat_templates(folder: str, cfg: dict[str, Any]) -> str | dict[str, str] | None:
  """The folder's chat template, or its named templates, where transformers looks for them:
  chat_template.jinja and additional_chat_templates/*.jinja win over tokenizer_config.json's
  "chat_template" (a string, or a list of {"name", "template"})."""
  found = {}
  if os.path.exists(os.path.join(folder, _TEMPLATE_FILE)):
    found["default"] = _read_text(os.path.join(folder, _TEMPLATE_FILE))
  extra = os.path.join(folder, _TEMPLATE_DIR)
  if os.path.isdir(extra):
    for name in sorted(os.listdir(extra)):
      if name.endswith(".jinja"):
        found[name[:-len(".jinja")]] = _read_text(os.path.join(extra, name))
  if found:
    return found["default"] if list(found) == ["default"] else found
  t = cfg.get("chat_template")
  where = f"{folder}/tokenizer_config.json: chat_template"
  if isinstance(t, list):
    if not all(isinstance(d, dict) and isinstance(d.get("name"), str)
               and isinstance(d.get("template"), str) for d in t):
      raise CheckpointError(f"{where} is a list whose entries are not {{'name', 'template'}}")
    return {d["name"]: d["template"] for d in t}
  if t is not None and not isinstance(t, str):
    raise CheckpointError(f"{where} is a {type(t).__name__}, not a string or a list")
  return t


def _eos_ids(folder: str, gen: dict[str, Any], eos_token: str | None, tok) -> tuple[int, ...]:
  """The model's stop tokens: generation_config.json's eos_token_id (an int or a list, what
  `generate` stops on), else the id of tokenizer_config.json's eos_token."""
  eos = gen.get("eos_token_id")
  if eos is None:
    eos_id = tok.token_to_id(eos_token) if eos_token is not None else None
    if eos_token is not None and eos_id is None:
      raise CheckpointError(f"{folder}/tokenizer_config.json: eos_token {eos_token!r} is not a "
                            "token of tokenizer.json")
    return () if eos_id is None else (eos_id,)
  ids = eos if isinstance(eos, list) else [eos]
  vocab = tok.get_vocab_size(with_added_tokens=True)
  if not all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < vocab for e in ids):
    raise CheckpointError(f"{folder}/generation_config.json: eos_token_id {eos!r} is not token "
                          f"ids in [0, {vocab})")
  return tuple(ids)


class HFTokenizer:
  """Text <-> ids with a checkpoint's tokenizer.json, through the `tokenizers` library."""

  def __init__(self, folder: str):
    import tokenizers
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.exists(path):
      raise CheckpointError(f"{folder}: no tokenizer.json")
    try:
      self._tok = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # the library raises a bare Exception on malformed files
      raise CheckpointError(f"{path}: cannot be read by tokenizers ({e})") from None
    cfg = _read_json(os.path.join(folder, "tokenizer_config.json"))
    gen = _read_json(os.path.join(folder, "generation_config.json"))
    self.chat_template: str | dict[str, str] | None = _chat_templates(folder, cfg)
    self.special_tokens: dict[str, str] = _special_tokens(folder, cfg)
    self.bos_token = self.special_tokens.get("bos_token")
    self.eos_token = self.special_tokens.get("eos_token")
    self.bos_id: int | None = self._tok.token_to_id(self.bos_token) if self.bos_token else None
    self.eos_ids: tuple[int, ...] = _eos_ids(folder, gen, self.eos_token, self._tok)
    # The one stop token that ends a turn (what a demonstration should end with): the
    # eos_token's id where the model stops on it (Llama 3.1: <|eot_id|>, not eos_ids[0]
    # <|end_of_text|>), else the first stop id.
    eos_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
    self.eos_id: int | None = (eos_id if eos_id in self.eos_ids else
                               self.eos_ids[0] if self.eos_ids else None)
    pad = self.special_tokens.get("pad_token")
    pad_id = self._tok.token_to_id(pad) if pad is not None else None
    self.pad_id: int = pad_id if pad_id is not None else (self.eos_ids[0] if self.eos_ids else 0)

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                          add_generation_prompt: bool = True, tools: list | None = None,
                          documents: list | None = None, chat_template: str | None = None,
                          **kwargs) -> str:
    """The prompt text for `messages`, rendered as transformers renders it.

    Further keywords (`enable_thinking`, `date_string`, ...) reach the template as variables, as
    do the named special tokens (a keyword of the same name wins). `chat_template` names one of
    several templates, or is a template's text.
    """
    template = self._template(chat_template, tools)
    variables = {**self.special_tokens, **kwargs}
    return render_chat(template, _chat_messages(messages), tools=tools, documents=documents,
                       add_generation_prompt=add_generation_prompt, **variables)

  def _template(self, name: str | None, tools: list | None) -> str:
    """The template to render: as transformers' get_chat_template picks among named ones."""
    t = self.chat_template
    if isinstance(t, dict):
      if name is not None:
        return t.get(name, name)
      if tools is not None and "tool_use" in t:
        return t["tool_use"]
      if "default" not in t:
        raise ValueError(f"this tokenizer has chat templates {sorted(t)} and no 'default': pass "
                         "chat_template= one of them")
      return t["default"]
    if name is not None:
      return name
    if not t:
      raise ValueError("this tokenizer has no chat template")
    return t


def _plain(value: Any, where: str) -> Any:
  """`value` rebuilt from JSON types (str, int, float, bool, None, dict, list, tuple), so the
  template sees no object whose methods the sandbox does not know to be harmless."""
  if value is None or type(value) in (str, int, float, bool):
    return value
  for base in (bool, str, int, float):  # subclasses (enums, numpy scalars) back to the base type
    if isinstance(value, base):
      return base(value)
  if isinstance(value, Mapping):
    return {_plain(k, where): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    items = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return items if isinstance(value, list) else tuple(items)
  item = getattr(value, "item", None)  # numpy scalars
  if callable(item) and getattr(value, "shape", None) == ():
    return _plain(item(), where)
  raise ValueError(f"chat template input {where} is a {type(value).__name__}; give JSON types "
                   "(str, int, float, bool, None, dict, list)")


def _chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The messages as transformers hands them to a template: dicts of JSON types without the keys
  whose value is None, a message's reasoning under every name templates read it by."""
  if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
    raise ValueError(f"messages must be a list of dicts, got a {type(messages).__name__}")
  if not messages:
    raise ValueError("messages is empty: a chat template needs at least one message")
  out = []
  for i, m in enumerate(messages):
    if not isinstance(m, Mapping):
      raise ValueError(f"messages[{i}] is a {type(m).__name__}, not a dict with role and content")
    m = {k: v for k, v in _plain(m, f"messages[{i}]").items() if v is not None}
    reasoning = next((m[k] for k in _REASONING_KEYS if k in m), None)
    if reasoning is not None:
      m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    out.append(m)
  return out


def render_chat(template: str, messages: list[dict[str, Any]], **variables) -> str:
  """`template` rendered with `messages` and `variables` in the sandbox; a template's refusal
  (`raise_exception`) or error is a ValueError that says so."""
  from jinja2.exceptions import TemplateError
  compiled = _compile(template)
  try:
    return compiled.render(messages=messages, **_plain(variables, "variables"))
  except (TemplateError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError) as e:
    # A template's own error (None + str, a missing key) is the messages' fault, not a crash.
    raise ValueError(f"chat template: {type(e).__name__}: {e}") from None


@functools.lru_cache(maxsize=32)
def _compile(template: str):
  from jinja2.exceptions import TemplateSyntaxError
  try:
    return _environment().from_string(template)
  except TemplateSyntaxError as e:
    raise ValueError(f"chat template does not parse: line {e.lineno}: {e.message}") from None


def _now() -> datetime.datetime:
  return datetime.datetime.now()  # a seam: tests fix the date strftime_now renders


def _strftime_now(fmt: str) -> str:
  """Today's date or time in `fmt`: Llama 3.2's template puts today's date in the system turn."""
  return _now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
  """json.dumps with its options: Jinja's own tojson escapes <, >, & and ' for HTML, which would
  change the tool schemas a template writes into the prompt."""
  return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)


def _raise_exception(message: str):
  from jinja2.exceptions import TemplateError
  raise TemplateError(message)


@functools.lru_cache(maxsize=1)
def _environment():
  """The sandbox chat templates run in: immutable (a template cannot change the messages it is
  given), trim_blocks and lstrip_blocks, with break/continue and transformers' globals.

  What a template can reach: its variables (JSON types, `_plain`), these globals and Jinja's
  filters; no loader, so `include`, `import` and `extends` reach no file; no name for os, its
  environment or open (an undefined name renders empty, as in transformers). Reading an
  attribute the sandbox holds unsafe (`__class__`, `__globals__`, a list's `append`) is refused
  with a SecurityError, where Jinja's own sandbox renders it empty and refuses only its use.
  """
  from jinja2.exceptions import SecurityError
  from jinja2.ext import loopcontrols
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  class Sandbox(ImmutableSandboxedEnvironment):
    def unsafe_undefined(self, obj, attribute):
      raise SecurityError(f"a chat template may not read {attribute!r} of a "
                          f"{type(obj).__name__}")

  env = Sandbox(trim_blocks=True, lstrip_blocks=True,
                extensions=[loopcontrols, _generation_tag()])
  env.filters["tojson"] = _tojson
  env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                     namespace=_safe_namespace())
  return env


def _generation_tag():
  """`{% generation %}...{% endgeneration %}`: transformers' marker of the assistant's text (for
  its loss masks); here it renders what it encloses, in a scope of its own as there."""
  from jinja2 import nodes
  from jinja2.ext import Extension

  class GenerationTag(Extension):
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.CallBlock(self.call_method("_enclosed"), [], [], body).set_lineno(lineno)

    def _enclosed(self, caller):
      return caller()

  return GenerationTag


def _safe_namespace():
  """Jinja's namespace() that refuses names starting with '_', which lead to Python internals."""
  from jinja2.exceptions import SecurityError
  from jinja2.utils import Namespace

  def check(name):
    if isinstance(name, str) and name.startswith("_"):
      raise SecurityError(f"a chat template may not set {name!r} on a namespace")

  class SafeNamespace(Namespace):
    def __init__(*args, **kwargs):
      self, attrs = args[0], dict(*args[1:], **kwargs)
      for name in attrs:
        check(name)
      Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
      check(name)
      Namespace.__setitem__(self, name, value)

  return SafeNamespace
