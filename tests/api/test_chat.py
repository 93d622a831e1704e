"""Chat templates: built-ins against llama.cpp, HF-style Jinja from the file, the sandbox."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
import time

import jinja2.sandbox
import pytest

from edgeinfer import errors
from edgeinfer.chat import (
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    LLAMA2_TEMPLATE,
    LLAMA3_TEMPLATE,
    ChatTemplate,
    builtin_template,
)
from tests.api.conftest import QWEN2_STYLE_TEMPLATE, ScriptedSampler, load

CONVERSATIONS = {
    "one turn": [{"role": "user", "content": "Hello!"}],
    "system and turns": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    "whitespace and unicode": [
        {"role": "system", "content": "  Answer in French.\n"},
        {"role": "user", "content": "\n  Comment ça va ? 😀  "},
        {"role": "assistant", "content": " Très bien, merci.\n\n"},
        {"role": "user", "content": "日本語で？"},
    ],
    "ends with the assistant": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello, how can I help?"},
    ],
}


def llama_cpp_chat(name: str, messages: list[dict[str, str]], add_assistant: bool) -> str:
    """llama.cpp's own rendering for its built-in template ``name``."""
    import llama_cpp

    array = (llama_cpp.llama_chat_message * len(messages))()
    keep = []  # the C structs point into these bytes
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        array[i].role, array[i].content = role, content
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(
        name.encode(), array, len(messages), add_assistant, buf, len(buf)
    )
    assert 0 < n < len(buf), n
    return buf.raw[:n].decode()


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize(
    "name, source",
    [("gemma", GEMMA_TEMPLATE), ("llama3", LLAMA3_TEMPLATE), ("chatml", CHATML_TEMPLATE)],
)
@pytest.mark.parametrize("add_assistant", [True, False])
def test_builtin_templates_render_like_llama_cpp(name, source, conversation, add_assistant):
    messages = CONVERSATIONS[conversation]
    # llama.cpp's built-ins leave BOS to the tokenizer; ours write bos_token, here empty
    ours = ChatTemplate(source, name=name).render(messages, add_generation_prompt=add_assistant)
    assert ours == llama_cpp_chat(name, messages, add_assistant)


# Meta's Llama 2 chat template as published with the model (tokenizer_config.json).
OFFICIAL_LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

# Meta's Llama 3 Instruct template as published with the model.
OFFICIAL_LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def hf_render(source: str, messages, add_generation_prompt: bool = True, **variables) -> str:
    """How transformers' apply_chat_template renders: Jinja's immutable sandbox, trimmed
    blocks, and a raise_exception global."""

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    return env.from_string(source).render(
        messages=messages, add_generation_prompt=add_generation_prompt, **variables
    )


@pytest.mark.parametrize("conversation", ["one turn", "system and turns"])
def test_builtin_llama_templates_render_like_the_official_ones(conversation):
    messages = CONVERSATIONS[conversation]
    tokens = dict(bos_token="<s>", eos_token="</s>")
    llama2 = ChatTemplate(LLAMA2_TEMPLATE, **tokens).render(messages)
    assert llama2 == hf_render(OFFICIAL_LLAMA2, messages, **tokens)
    tokens = dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    for add in (True, False):
        llama3 = ChatTemplate(LLAMA3_TEMPLATE, **tokens).render(messages, add_generation_prompt=add)
        assert llama3 == hf_render(OFFICIAL_LLAMA3, messages, add, **tokens)


def test_official_templates_render_the_same_in_our_sandbox():
    for source, tokens in [
        (OFFICIAL_LLAMA2, dict(bos_token="<s>", eos_token="</s>")),
        (OFFICIAL_LLAMA3, dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")),
        (QWEN2_STYLE_TEMPLATE, {}),
    ]:
        for messages in CONVERSATIONS.values():
            ours = ChatTemplate(source, **tokens).render(messages)
            assert ours == hf_render(source, messages, **tokens)


# A template in the style of Llama 3.1's: tools as JSON, a date, raise_exception, namespaces.
TOOLS_TEMPLATE = textwrap.dedent(
    """\
    {{- bos_token }}
    {%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
    {%- if messages[0]['role'] == 'system' %}
        {%- set system_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {%- set system_message = "" %}
    {%- endif %}
    {{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
    {%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
    {{- "Today Date: " + date_string + "\\n\\n" }}
    {%- if tools is not none %}
        {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
    {%- endif %}
    {{- system_message }}{{- "<|eot_id|>" }}
    {%- set ns = namespace(turns=0) %}
    {%- for message in messages %}
        {%- if message.role not in ['user', 'assistant'] %}
            {{- raise_exception('unknown role ' ~ message.role) }}
        {%- endif %}
        {%- set ns.turns = ns.turns + 1 %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'
            + message['content'] | trim + '<|eot_id|>' }}
    {%- endfor %}
    {%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
    """  # noqa: E501 (a template is verbatim text: wrapping its lines changes it)
)


def test_tools_style_template():
    tools = [{"name": "get_weather", "parameters": {"city": {"type": "string"}}}]
    messages = CONVERSATIONS["system and turns"]
    ours = ChatTemplate(TOOLS_TEMPLATE, bos_token="<|begin_of_text|>").render(messages, tools=tools)
    assert ours == hf_render(TOOLS_TEMPLATE, messages, bos_token="<|begin_of_text|>", tools=tools)
    assert '"get_weather"' in ours and "Today Date: 26 Jul 2024" in ours
    with pytest.raises(errors.TemplateError, match="unknown role tool"):
        ChatTemplate(TOOLS_TEMPLATE).render([{"role": "tool", "content": "{}"}], tools=None)


def test_builtin_template_choice():
    assert builtin_template("gemma3", {"<start_of_turn>": 1, "<end_of_turn>": 2})[0] == "gemma"
    assert builtin_template("llama", {"<|start_header_id|>": 1, "<|eot_id|>": 2})[0] == "llama3"
    assert builtin_template("llama", {"<|im_start|>": 1, "<|im_end|>": 2})[0] == "chatml"
    assert builtin_template("qwen2", {})[0] == "chatml"
    assert builtin_template("llama", {"<s>": 1})[0] == "llama2"


@pytest.mark.parametrize(
    "arch, name",
    [("llama", "llama3"), ("qwen2", "chatml"), ("qwen3", "chatml"), ("gemma3", "gemma")],
)
def test_fixtures_without_a_template_get_their_family_builtin(fixture_model, arch, name):
    model = fixture_model(arch)
    assert "tokenizer.chat_template" not in model.metadata
    assert model.chat_template.name == name


def test_gemma_file_uses_the_gemma_builtin_with_one_bos(gemma, gemma_llama_cpp):
    assert gemma.chat_template.name == "gemma"
    messages = CONVERSATIONS["system and turns"]
    text = gemma.render_chat(messages)
    assert text == "<bos>" + llama_cpp_chat("gemma", messages, True)
    ids = gemma.chat_tokens(messages)
    assert ids.count(gemma.tokenizer.bos_id) == 1 and ids[0] == gemma.tokenizer.bos_id
    # what llama.cpp's chat mode feeds the model: its rendering, BOS added by the tokenizer
    ref = gemma_llama_cpp.tokenize(
        llama_cpp_chat("gemma", messages, True).encode(), add_bos=True, special=True
    )
    assert ids == ref


# --- a template stored in the file -----------------------------------------------------------


def test_template_from_gguf_metadata(qwen2_templated_path):
    with load(qwen2_templated_path) as model:
        assert model.metadata["tokenizer.chat_template"] == QWEN2_STYLE_TEMPLATE
        assert model.chat_template.name == "model"
        for messages in CONVERSATIONS.values():
            assert model.render_chat(messages) == hf_render(QWEN2_STYLE_TEMPLATE, messages)
        text = model.render_chat(CONVERSATIONS["one turn"])
        assert text == (
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
        )
        ids = model.chat_tokens(CONVERSATIONS["one turn"])
        start = model.tokenizer.vocab.token_to_id["<|im_start|>"]
        assert ids.count(start) == 3  # parsed as the special token, not spelled out
        assert ids == model.tokenize(text, parse_special=True)
        # a reply ends at <|im_end|>, the vocabulary's EOS
        end = model.tokenizer.vocab.token_to_id["<|im_end|>"]
        hi = model.tokenize("Hi!", add_special=False)
        reply = model.chat(CONVERSATIONS["one turn"], sampler=ScriptedSampler(hi + [end]))
        assert (reply.text, reply.finish_reason) == ("Hi!", "stop")


def test_hostile_template_in_a_file_fails_the_chat_not_the_model(fixture_models, tmp_path):
    from tests.api.conftest import _WithTemplate
    from tests.fixtures.models import FIXTURES, write_model
    from tests.fixtures.vocab import bpe_vocab

    path = write_model(
        tmp_path / "hostile.gguf", FIXTURES["qwen2"],
        _WithTemplate(bpe_vocab("qwen2"), "{{ ''.__class__.__mro__[1].__subclasses__() }}"),
    )  # fmt: skip
    with load(path) as model:
        with pytest.raises(errors.TemplateError):
            model.chat([{"role": "user", "content": "hi"}])
        assert model.generate("still works", max_tokens=2).stats.generated_tokens == 2


# --- messages --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        "hello",
        {"role": "user", "content": "hi"},
        [{"content": "no role"}],
        [{"role": 1, "content": "bad role"}],
        [{"role": "user", "content": None}],
        [{"role": "user", "content": ["a", "list"]}],
        ["not a dict"],
        None,
    ],
)
def test_malformed_messages(messages):
    with pytest.raises(errors.InvalidOptionError):
        ChatTemplate(CHATML_TEMPLATE).render(messages)


def test_raise_exception_becomes_a_template_error():
    with pytest.raises(errors.TemplateError, match="roles must alternate"):
        ChatTemplate(OFFICIAL_LLAMA2).render([{"role": "assistant", "content": "first"}])


@pytest.mark.parametrize(
    "source", ["{% for %}", "{{ unclosed", "{% if x %}", "{{ x | no_such_filter }}", "{% endfor %}"]
)
def test_templates_that_do_not_compile(source):
    with pytest.raises(errors.TemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


# --- the sandbox -----------------------------------------------------------------------------

# name -> template; each must end in a TemplateError within seconds and small memory
HOSTILE = {
    "class mro": "{{ ''.__class__.__mro__ }}",
    "subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "cycler globals": "{{ cycler.__init__.__globals__ }}",
    "joiner globals": "{{ joiner.__init__.__globals__['os'] }}",
    "namespace globals": "{{ namespace.__init__.__globals__ }}",
    "self globals": "{{ self.__init__.__globals__ }}",
    "format escape": "{{ '{0.__class__.__mro__}'.format('') }}",
    "format globals": "{{ '{0.__init__.__globals__}'.format(cycler) }}",
    "raise_exception globals": "{{ raise_exception.__globals__ }}",
    "class alone": "{{ ''.__class__ }}",
    "loop internals": "{% for m in messages %}{{ loop._after }}{% endfor %}",
    "mutating a list": "{% set l = [1] %}{{ l.append(2) }}",
    "mutating a dict": "{% set d = {} %}{{ d.update({'a': 1}) }}",
    "string times huge": "{{ 'a' * 10**10 }}",
    "string times variable": "{% set n = 100000 %}{{ 'a' * n * n }}",
    "list times huge": "{{ [1, 2] * 10**9 }}",
    "doubling with ~": "{% set ns = namespace(s='a') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "doubling with +": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "doubling with replace": "{% set ns = namespace(s='aa') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s|replace('a', 'aa') %}{% endfor %}{{ ns.s|length }}",
    "doubling lists": "{% set ns = namespace(l=['a']) %}{% for i in range(64) %}"
    "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
    "nesting lists": "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
    "{% set ns.l = ns.l + [ns.l] %}{% endfor %}{{ ns.l|length }}",
    "references to a big string": "{% set s = 'a' * 1000000 %}{% set l = [s] * 1000 %}{{ l }}",
    "joining references": "{% set s = 'a' * 1000000 %}{{ [s, s, s, s, s, s]|join('') }}",
    "percent width": "{{ '%03000000000d' % 1 }}",
    "percent fields": "{% set s = 'a' * 1000000 %}{{ ('%s' * 100000) % s }}",
    "format width": "{{ '{:>3000000000}'.format('a') }}",
    "format fields": "{% set s = 'a' * 1000000 %}{{ ('{0}' * 100000).format(s) }}",
    "center": "{{ 'a' | center(3000000000) }}",
    "zfill": "{{ 'a'.zfill(3000000000) }}",
    "expandtabs": "{{ ('\\t' * 1000000).expandtabs(1000000) }}",
    "indent": "{{ ('\\n' * 1000000) | indent(1000000) }}",
    "wordwrap": "{{ ('a' * 1000000) | wordwrap(1, true, 'xxxxxxxxxxxxxxxx') }}",
    "list of characters": "{{ ('你' * 3000000) | list | length }}",
    "sum of lists": "{{ ([[1]] * 100000) | sum(start=[]) }}",
    "power tower": "{% set ns = namespace(x=2) %}{% for i in range(100) %}"
    "{% set ns.x = ns.x ** 64 %}{% endfor %}{{ ns.x }}",
    "squaring": "{% set ns = namespace(x=3) %}{% for i in range(100) %}"
    "{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x }}",
    "huge range": "{{ range(10**9) | list | length }}",
    "lipsum": "{{ lipsum(n=100000, min=1000, max=1000) }}",
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}",
    "nested loops printing": "{% for i in range(100000) %}{% for j in range(100000) %}"
    "x{% endfor %}{% endfor %}",
    "macro buffer": "{% macro m() %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "xxxxxxxx{% endfor %}{% endfor %}{% endmacro %}{{ m() }}",
    "set block buffer": "{% set x %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "xxxxxxxx{% endfor %}{% endfor %}{% endset %}{{ x }}",
    "recursive macro": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "deep nesting": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "raise_exception": "{{ raise_exception('refused on purpose') }}",
    "division by zero": "{{ 1 // 0 }}",
}

_HOSTILE_RUNNER = """
import json, resource, sys, time
from edgeinfer import errors
from edgeinfer.chat import ChatTemplate
templates = json.loads(sys.stdin.read())
def hwm_kib():  # VmHWM: ru_maxrss would carry the forking parent's peak across exec
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
base = hwm_kib()
out = {}
for name, source in templates.items():
    t0 = time.perf_counter()
    try:
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
        result = "rendered"
    except errors.TemplateError as e:
        result = "TemplateError: " + str(e)
    except BaseException as e:
        result = "escaped: " + type(e).__name__ + ": " + str(e)[:200]
    out[name] = [result, time.perf_counter() - t0]
peak_mb = (hwm_kib() - base) / 1024
print(json.dumps({"results": out, "peak_growth_mb": peak_mb}))
"""


@pytest.mark.slow
def test_hostile_templates_fail_quickly_and_small():
    """Every hostile template ends in a TemplateError within seconds, and the process that
    rendered them all never grew by more than a few hundred MB (an address-space limit turns
    a runaway allocation into a failure here rather than into trouble for the machine)."""
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        + _HOSTILE_RUNNER
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(HOSTILE),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    for name, (result, seconds) in report["results"].items():
        assert result.startswith("TemplateError"), (name, result)
        assert "MemoryError" not in result, (name, result)
        assert seconds < 8, (name, seconds)
    assert report["peak_growth_mb"] < 400, report["peak_growth_mb"]
    print(f"\n{len(HOSTILE)} hostile templates in {time.perf_counter() - t0:.1f} s, "
          f"peak growth {report['peak_growth_mb']:.0f} MB")  # fmt: skip


@pytest.mark.parametrize("name", ["class mro", "cycler globals", "format escape",
                                  "mutating a list", "string times huge", "raise_exception",
                                  "deep nesting"])  # fmt: skip
def test_hostile_templates_in_process(name):
    t0 = time.perf_counter()
    with pytest.raises(errors.TemplateError):
        ChatTemplate(HOSTILE[name]).render([{"role": "user", "content": "hi"}])
    assert time.perf_counter() - t0 < 10  # hang guard


def test_the_sandbox_does_not_stop_ordinary_big_conversations():
    # 300 turns of 10 kB each: 3 MB of prompt, under the 4 MiB output cap
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "x" * 10_000}
        for i in range(300)
    ]
    for source in (GEMMA_TEMPLATE, CHATML_TEMPLATE, OFFICIAL_LLAMA3, QWEN2_STYLE_TEMPLATE):
        out = ChatTemplate(source).render(messages)
        assert out.count("x" * 10_000) == 300


def test_output_cap():
    messages = [{"role": "user", "content": "y" * (5 << 20)}]
    with pytest.raises(errors.TemplateError):
        ChatTemplate(CHATML_TEMPLATE).render(messages)
