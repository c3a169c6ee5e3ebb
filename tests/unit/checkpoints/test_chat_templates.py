"""Chat templates as real checkpoints ship them (tests/support/fixtures/chat_templates), rendered by
HFTokenizer and by transformers on the same folder: the same text and the same token ids; the
checkpoints' own stop tokens, and a decode that ends a row on each of them.

Each folder holds a small BPE trained on the spot with the family's special tokens, and the
special tokens and stop ids that the family's checkpoints set.
"""

import datetime
import json
import os
from collections.abc import Mapping

import jax
import numpy as np
import pytest
from flax import nnx

from tests.support import FIXTURES
from rlscale import models
from rlscale.checkpoints import tokenizer as tokmod
from rlscale.checkpoints.safetensors_io import CheckpointError
from rlscale.checkpoints.tokenizer import HFTokenizer
from rlscale.sampling import Sampler, SamplingParams, generate

pytestmark = pytest.mark.hf
pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEMPLATES = os.path.join(FIXTURES, "chat_templates")
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen's tool and thinking markers are added tokens that are not "special" (decode keeps them).
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
              "</think>"]
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
                 "<|finetune_right_pad_id|>"]
# tokenizer_config.json's special tokens as the checkpoints set them.
QWEN_CONFIG = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "unk_token": None, "tokenizer_class": "Qwen2Tokenizer"}
LLAMA_CONFIG = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                "tokenizer_class": "PreTrainedTokenizerFast"}
FAMILIES = {  # template file, special and added tokens, config, generation_config's eos_token_id
    "qwen2.5": ("qwen2_5_instruct.jinja", QWEN_SPECIAL, QWEN_ADDED[:2], QWEN_CONFIG,
                ["<|im_end|>", "<|endoftext|>"]),  # Qwen2.5-*-Instruct: [151645, 151643]
    "qwen3": ("qwen3.jinja", QWEN_SPECIAL, QWEN_ADDED, QWEN_CONFIG,
              ["<|im_end|>", "<|endoftext|>"]),  # Qwen3-*: [151645, 151643]
    "llama3.1": ("llama3_1_instruct.jinja", LLAMA_SPECIAL, [], LLAMA_CONFIG,
                 ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]),  # [128001, 128008, 128009]
    "llama3.2": ("llama3_2_instruct.jinja", LLAMA_SPECIAL, [], LLAMA_CONFIG,
                 ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]),
    "llama3": ("llama3_instruct.jinja", LLAMA_SPECIAL, [], LLAMA_CONFIG,
               ["<|end_of_text|>", "<|eot_id|>"]),  # Meta-Llama-3-8B-Instruct: [128001, 128009]
}
# The pre-tokenizer split of the real tokenizer.json files (then byte-level BPE); transformers'
# Qwen2Tokenizer class puts Qwen's (with an NFC normalizer) in place of whatever the file holds.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA_SPLIT = QWEN_SPLIT.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
CORPUS = ["What is 12 + 30? The answer is 42.", "Compute 7 * 6 and explain your reasoning.",
          "You are a helpful assistant. Answer briefly.", "Add two numbers with the add tool.",
          "Cutting Knowledge Date: December 2023. Today Date: 26 Jul 2024."] * 20


def _write_folder(folder, family):
  """tokenizer.json (a small trained BPE plus the family's tokens), tokenizer_config.json with
  the shipped template, generation_config.json with the checkpoints' stop tokens."""
  import tokenizers
  from tokenizers import AddedToken, decoders, pre_tokenizers, processors, trainers
  template, special, added, config, eos = FAMILIES[family]
  from tokenizers import Regex, normalizers
  qwen = config is QWEN_CONFIG
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.normalizer = normalizers.NFC() if qwen else None
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN_SPLIT if qwen else LLAMA_SPLIT), "isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
      vocab_size=320, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
  if config["bos_token"]:  # Llama 3 prepends BOS when asked for special tokens
    bos = config["bos_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
  os.makedirs(folder, exist_ok=True)
  tok.save(os.path.join(folder, "tokenizer.json"))
  with open(os.path.join(TEMPLATES, template), encoding="utf-8") as f:
    text = f.read()
  with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
    json.dump({**config, "chat_template": text}, f)
  with open(os.path.join(folder, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [tok.token_to_id(t) for t in eos]}, f)
  return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("chat_templates")
  return {f: _write_folder(str(root / f), f) for f in FAMILIES}


@pytest.fixture(scope="module")
def pair(folders):
  """(ours, transformers') tokenizer of a family, loaded once."""
  cache = {}

  def get(family):
    if family not in cache:
      cache[family] = (HFTokenizer(folders[family]),
                       transformers.AutoTokenizer.from_pretrained(folders[family]))
    return cache[family]

  return get


@pytest.fixture
def fixed_today(monkeypatch):
  """strftime_now on both sides sees one fixed moment (Llama 3.2 writes today's date)."""
  from transformers.utils import chat_template_utils
  moment = datetime.datetime(2025, 3, 9, 12, 30)

  class Fixed(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
      return moment

  monkeypatch.setattr(tokmod, "_now", lambda: moment)
  monkeypatch.setattr(chat_template_utils, "datetime", Fixed)
  return moment


def _ids(out):
  """transformers' ids: newer versions return a BatchEncoding (a mapping) rather than a list."""
  return list(out["input_ids"] if isinstance(out, Mapping) else out)


def _both(ours, theirs, messages, **kw):
  """(our text, our ids, their text, their ids) with a generation prompt."""
  text = ours.apply_chat_template(messages, add_generation_prompt=True, **kw)
  ids = ours.encode(text, add_special_tokens=False)
  their_text = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                          **kw)
  their_ids = _ids(theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                              **kw))
  return text, ids, their_text, their_ids


def _assert_same(ours, theirs, family, messages, **kw):
  text, ids, their_text, their_ids = _both(ours, theirs, messages, **kw)
  assert text == their_text
  assert ids == their_ids
  _, special, added, _, _ = FAMILIES[family]
  for t in special + added:  # every marker in the text is its one id, none split into pieces
    assert ids.count(ours._tok.token_to_id(t)) == text.count(t), t
  return text


USER = [{"role": "user", "content": "What is 12 + 30?"}]
SYSTEM_USER = [{"role": "system", "content": "Answer briefly."}] + USER
MULTI_TURN = SYSTEM_USER + [{"role": "assistant", "content": "The answer is 42."},
                            {"role": "user", "content": "And 7 * 6?"}]
# Keys whose value is None are dropped, as transformers drops them: Llama 3.1 would otherwise
# take `'tool_calls' in message` for a tool call and fail on None's length.
NONE_VALUES = SYSTEM_USER + [
    {"role": "assistant", "content": "The answer is 42.", "tool_calls": None},
    {"role": "user", "content": "And 7 * 6?", "name": None}]
CONVERSATIONS = {"user": USER, "system_user": SYSTEM_USER, "multi_turn": MULTI_TURN,
                 "none_values": NONE_VALUES}


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_rendered_ids_match_transformers(pair, family, conversation, fixed_today):
  ours, theirs = pair(family)
  _assert_same(ours, theirs, family, CONVERSATIONS[conversation])


def test_what_the_shipped_templates_write(pair, fixed_today):
  """The parts of the prompts the families are known for, written out by hand."""
  qwen25 = pair("qwen2.5")[0].apply_chat_template(USER)
  assert qwen25 == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                    "assistant.<|im_end|>\n<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n"
                    "<|im_start|>assistant\n")
  assert pair("qwen3")[0].apply_chat_template(USER) == (
      "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n")
  head = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
          "December 2023\nToday Date: {}\n\nAnswer briefly.<|eot_id|><|start_header_id|>user"
          "<|end_header_id|>\n\nWhat is 12 + 30?<|eot_id|><|start_header_id|>assistant"
          "<|end_header_id|>\n\n")
  assert pair("llama3.1")[0].apply_chat_template(SYSTEM_USER) == head.format("26 Jul 2024")
  assert pair("llama3.2")[0].apply_chat_template(SYSTEM_USER) == head.format("09 Mar 2025")
  assert pair("llama3.2")[0].apply_chat_template(SYSTEM_USER, date_string="1 Jan 2026") == (
      head.format("1 Jan 2026"))


@pytest.mark.parametrize("thinking", [True, False, None])
@pytest.mark.parametrize("conversation", ["user", "multi_turn"])
def test_qwen3_enable_thinking(pair, thinking, conversation):
  ours, theirs = pair("qwen3")
  kw = {} if thinking is None else {"enable_thinking": thinking}
  text = _assert_same(ours, theirs, "qwen3", CONVERSATIONS[conversation], **kw)
  empty_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
  assert text.endswith(empty_think) == (thinking is False)


REASONING_TURNS = [
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "<think>\n12 + 30 = 42\n</think>\n\nThe answer is 42."},
    {"role": "user", "content": "And 7 * 6?"},
    {"role": "assistant", "content": "42 again.", "reasoning_content": "7 * 6 = 42"},
]


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("upto", [2, 4])
def test_qwen3_reasoning_in_the_history(pair, thinking, upto, key):
  """Earlier turns' <think> blocks are dropped, the last turn's kept (from content or from the
  reasoning, under either name); without a generation prompt as a training target is rendered."""
  ours, theirs = pair("qwen3")
  messages = REASONING_TURNS[:upto]
  if key != "reasoning_content" and upto == 4:
    last = dict(messages[3])
    last[key] = last.pop("reasoning_content")
    messages = messages[:3] + [last]
  text = _assert_same(ours, theirs, "qwen3", messages + [{"role": "user", "content": "Why?"}],
                      enable_thinking=thinking)
  assert "12 + 30 = 42" not in text
  last = ours.apply_chat_template(messages, add_generation_prompt=False, enable_thinking=thinking)
  assert last == theirs.apply_chat_template(messages, tokenize=False, enable_thinking=thinking)
  assert ("<think>\n7 * 6 = 42\n</think>\n\n42 again." in last) == (upto == 4)


ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers: a < b & c — «exact»",
    "parameters": {"type": "object", "required": ["a", "b"],
                   "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}
TOOL_TURNS = USER + [
    {"role": "assistant", "content": None,
     "tool_calls": [{"type": "function", "function": {"name": "add",
                                                      "arguments": {"a": 12, "b": 30}}}]},
    {"role": "tool", "content": "42"}]


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "llama3.1", "llama3.2"])
@pytest.mark.parametrize("conversation", ["user", "system_user", "tool_turns"])
def test_tools(pair, family, conversation, fixed_today):
  """Tool schemas go through tojson (Llama: indent=4, non-ASCII kept, nothing HTML-escaped);
  an assistant's tool call and the tool's answer are written as each family writes them."""
  ours, theirs = pair(family)
  messages = TOOL_TURNS if conversation == "tool_turns" else CONVERSATIONS[conversation]
  text = _assert_same(ours, theirs, family, messages, tools=[ADD_TOOL])
  assert "a < b & c — «exact»" in text


def test_llama_builtin_tools_and_tools_in_the_system_turn(pair, fixed_today):
  ours, theirs = pair("llama3.1")
  _assert_same(ours, theirs, "llama3.1", SYSTEM_USER, tools=[ADD_TOOL],
               builtin_tools=["brave_search", "wolfram_alpha"], tools_in_user_message=False)


def test_template_refusals_are_value_errors(pair, fixed_today):
  ours, theirs = pair("llama3.1")
  only_system = [{"role": "system", "content": "Answer briefly."}]
  with pytest.raises(ValueError, match="no first user message"):
    ours.apply_chat_template(only_system, tools=[ADD_TOOL])
  with pytest.raises(Exception, match="no first user message"):  # transformers: a TemplateError
    theirs.apply_chat_template(only_system, tools=[ADD_TOOL], tokenize=False)
  with pytest.raises(ValueError, match=r"messages\[1\] is a str"):
    ours.apply_chat_template([USER[0], "hello"])
  with pytest.raises(ValueError, match="empty"):
    ours.apply_chat_template([])
  with pytest.raises(ValueError, match="chat template: TypeError"):  # Qwen2.5 adds str and int
    pair("qwen2.5")[0].apply_chat_template([{"role": "user", "content": 3}])


RENDERER_CASES = {  # what our environment must do as transformers' does
    "tojson_options": "{{ messages[0] | tojson(indent=2, sort_keys=True, separators=(',', ': ')) }}"
                      "{{ messages[0] | tojson(ensure_ascii=True) }}{{ messages[0] | tojson }}",
    "loop_controls": "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
                     "{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content }}|"
                     "{% endfor %}",
    "generation_tag": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
                      "{{ m.content }}{{ eos_token }}{% endgeneration %}{% else %}{{ m.content }}"
                      "{% endif %}{% endfor %}",
    "whitespace": "{% for m in messages %}\n  {% if m.role == 'user' %}\n{{ m.content }}\n"
                  "  {% endif %}\n{% endfor %}",
    "special_tokens_and_dict": "{{ bos_token }}{{ eos_token }}{{ pad_token }}"
                               "{{ dict(a=1)['a'] }}{{ bos_token is defined }}",
    "strftime_now": "{{ strftime_now('%Y-%m-%d %H:%M') }}",
}


@pytest.mark.parametrize("case", list(RENDERER_CASES))
@pytest.mark.parametrize("family", ["qwen2.5", "llama3.1"])
def test_renderer_matches_transformers_environment(pair, family, case, fixed_today):
  ours, theirs = pair(family)
  messages = [{"role": "system", "content": "Ünïcode <b> & 'quotes'"}] + MULTI_TURN[1:]
  template = RENDERER_CASES[case]
  text = ours.apply_chat_template(messages, chat_template=template)
  assert text == theirs.apply_chat_template(messages, chat_template=template, tokenize=False,
                                            add_generation_prompt=True)
  assert text  # each case writes something


def test_strftime_now_is_todays_date(pair):
  before = datetime.date.today().strftime("%d %b %Y")
  text = pair("llama3.2")[0].apply_chat_template(USER)
  after = datetime.date.today().strftime("%d %b %Y")
  assert f"Today Date: {before}\n" in text or f"Today Date: {after}\n" in text


def test_the_sandbox_holds(pair):
  """Templates cannot change their inputs, set private names, or reach Python internals."""
  ours = pair("qwen2.5")[0]
  for template in ["{{ messages.append(1) }}", "{{ messages[0].update(role='x') }}",
                   "{% set ns = namespace() %}{% set ns._x = 1 %}{{ ns._x }}",
                   "{{ namespace(_x=1) }}", "{{ ''.__class__.__mro__ }}"]:
    with pytest.raises(ValueError, match="chat template"):
      ours.apply_chat_template(USER, chat_template=template)
  with pytest.raises(ValueError, match="does not parse"):
    ours.apply_chat_template(USER, chat_template="{% for m in messages %}")


# What a template may try, to reach Python objects, files or the process's environment. Jinja's
# own sandbox rendered the first read of an unsafe attribute as empty text (`messages.__class__`
# -> ''); ours refuses it.
REACH_PYTHON = [
    "{{ messages.__class__ }}", "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ raise_exception.__globals__ }}", "{{ strftime_now.__globals__['os'] }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ cycler.__init__.__globals__.os.environ }}", "{{ namespace.__init__.__globals__ }}",
    "{{ joiner.__init__.__globals__ }}", "{{ dict.__base__.__subclasses__() }}",
    "{{ ''|attr('__class__') }}", "{{ messages|map(attribute='__class__')|list }}",
    "{{ '{0.__class__}'.format(messages) }}", "{{ messages[0].items.__self__ }}",
    "{{ self.__dict__ }}", "{{ self._TemplateReference__context.environment }}",
    "{{ messages[0].content.__len__() }}", "{{ messages.pop() }}",
]
REACH_FILES = ["{% include '/etc/passwd' %}", "{% import '/etc/passwd' as p %}",
               "{% extends '/etc/passwd' %}", "{% from '/etc/hostname' import x %}",
               "{{ open('/etc/passwd').read() }}"]
REACH_ENVIRONMENT = ["{{ os.environ }}", "{{ getenv('RLSCALE_TEMPLATE_SECRET') }}",
                     "{{ request.environ }}", "{{ environ['RLSCALE_TEMPLATE_SECRET'] }}"]


@pytest.mark.parametrize("template", REACH_PYTHON + REACH_FILES + REACH_ENVIRONMENT)
def test_templates_that_reach_out_are_refused(pair, template, monkeypatch):
  """Refused as one ValueError naming the chat template; nothing of the environment shows."""
  monkeypatch.setenv("RLSCALE_TEMPLATE_SECRET", "do-not-print")
  ours = pair("qwen2.5")[0]
  with pytest.raises(ValueError, match=r"^chat template: (SecurityError|TypeError: no loader|"
                                       r"UndefinedError)") as e:
    ours.apply_chat_template(USER, chat_template=template)
  assert "do-not-print" not in str(e.value)


def test_names_a_template_is_not_given_reach_nothing(pair, monkeypatch):
  """An undefined name renders empty, as in transformers (templates test `x is defined`); no
  name leads to os, its environment or the builtins."""
  monkeypatch.setenv("RLSCALE_TEMPLATE_SECRET", "do-not-print")
  ours = pair("qwen2.5")[0]
  text = ours.apply_chat_template(USER, chat_template="{{ environ }}{{ config }}{{ __builtins__ }}"
                                                     "{{ RLSCALE_TEMPLATE_SECRET }}{{ self }}")
  assert text == "<TemplateReference None>"


def test_template_file_wins_and_named_templates(folders, tmp_path):
  """chat_template.jinja wins over tokenizer_config.json; with several named templates,
  tool_use is picked when tools are given, default otherwise."""
  import shutil
  for layout in ("file", "named"):
    folder = tmp_path / layout
    shutil.copytree(folders["qwen2.5"], folder)
    (folder / "chat_template.jinja").write_text("FILE {{ messages[0].content }}")
    if layout == "named":
      named = folder / "additional_chat_templates"
      named.mkdir()
      (named / "tool_use.jinja").write_text("TOOLS {{ tools|length }}")
    ours, theirs = HFTokenizer(str(folder)), transformers.AutoTokenizer.from_pretrained(str(folder))
    for tools in (None, [ADD_TOOL]):
      text = ours.apply_chat_template(USER, tools=tools)
      assert text == theirs.apply_chat_template(USER, tools=tools, tokenize=False,
                                                add_generation_prompt=True)
      assert text == ("TOOLS 1" if layout == "named" and tools else "FILE What is 12 + 30?")


# --- stop tokens ---

@pytest.mark.parametrize("family", list(FAMILIES))
def test_eos_ids_are_the_checkpoints_stop_tokens(pair, folders, family):
  ours, _ = pair(family)
  want = tuple(ours._tok.token_to_id(t) for t in FAMILIES[family][4])
  assert ours.eos_ids == want
  assert list(want) == transformers.GenerationConfig.from_pretrained(folders[family]).eos_token_id
  bos = FAMILIES[family][3]["bos_token"]
  assert ours.bos_id == (ours._tok.token_to_id(bos) if bos else None)
  turn_end = "<|im_end|>" if family.startswith("qwen") else "<|eot_id|>"
  assert ours.eos_id == ours._tok.token_to_id(turn_end)  # llama3.1: not eos_ids[0]


@pytest.mark.parametrize("family,fallback", [("qwen3", "<|im_end|>"), ("llama3.1", "<|eot_id|>")])
def test_eos_ids_fall_back_to_the_eos_token(folders, tmp_path, family, fallback):
  import shutil
  folder = tmp_path / family
  shutil.copytree(folders[family], folder)
  gen = folder / "generation_config.json"
  gen.unlink()
  tok = HFTokenizer(str(folder))
  assert tok.eos_ids == (tok._tok.token_to_id(fallback),)
  gen.write_text(json.dumps({"eos_token_id": 5}))
  assert HFTokenizer(str(folder)).eos_ids == (5,)
  for bad in ("<|im_end|>", [5, 10_000], True):
    gen.write_text(json.dumps({"eos_token_id": bad}))
    with pytest.raises(CheckpointError, match="generation_config.json: eos_token_id"):
      HFTokenizer(str(folder))


DECODE_FAMILIES = ["qwen2.5", "llama3.1"]


@pytest.fixture(scope="module")
def near_uniform_policy(pair, tiny_cfg, mesh1, rules):
  """A tiny random model whose head is scaled down to near-zero logits, so that it samples over
  the whole vocabulary (padded past the tokenizers', as real checkpoints' embeddings are)."""
  vocab = max(pair(f)[0].vocab_size for f in DECODE_FAMILIES)
  cfg = tiny_cfg.replace(vocab_size=vocab, d_model=32, mlp_dim=64, num_layers=1, head_dim=16)
  model = models.create_sharded(models.CausalLM, cfg, mesh1, rules, jax.random.key(0))
  model.model.final_norm[...] = model.model.final_norm[...] * 0.01
  return nnx.split(model)


@pytest.mark.slow  # over 10 s on 2 cores; .ci/run runs it
@pytest.mark.parametrize("family", DECODE_FAMILIES)
def test_decode_stops_a_row_at_each_stop_token(pair, family, near_uniform_policy, mesh1):
  """Each row ends at the first of the checkpoint's stop tokens it emits, and every stop token
  ends some row; the same run without stop tokens says where each row meets its first one."""
  tok = pair(family)[0]
  graphdef, state = near_uniform_policy
  prompt = tok.encode(tok.apply_chat_template(USER, date_string="26 Jul 2024"))
  rows, n = 64, 64
  tokens = np.tile(np.asarray(prompt, np.int32), (rows, 1))
  mask = np.ones(tokens.shape, bool)

  def run(eos_ids):
    p = SamplingParams(max_new_tokens=n, eos_ids=eos_ids, pad_id=tok.pad_id, decode_chunk=n)
    return generate(Sampler(graphdef, p, mesh1), state, tokens, mask, jax.random.key(3))

  free, out = np.asarray(run(()).tokens), run(tok.eos_ids)
  toks, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  ended_on = set()
  for r in range(rows):
    hits = np.flatnonzero(np.isin(free[r], tok.eos_ids))
    want = hits[0] + 1 if hits.size else n  # the stop token is the response's last
    assert lengths[r] == want
    np.testing.assert_array_equal(toks[r, :want], free[r, :want])
    assert (toks[r, want:] == tok.pad_id).all()
    if hits.size:
      ended_on.add(int(toks[r, want - 1]))
  assert ended_on == set(tok.eos_ids)
