"""The chat template sandbox under hostile templates: only TemplateError escapes, every value
is bounded before it is built, and the rendered prompt is capped (edgeinfer.chat)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from edgeinfer import errors
from edgeinfer.chat import CHATML_TEMPLATE, MAX_OUTPUT_CHARS, ChatTemplate

# seconds after which a render counts as hung: a guard, not a speed bar (which mechanism
# stopped a template is told by its message: a size check, or the watchdog's 'ran longer')
HANG = 60.0

HI = [{"role": "user", "content": "hi"}]

# --- nothing but TemplateError leaves the sandbox --------------------------------------------

# template -> the exception Python or Jinja raised inside the render before the fix
ESCAPES = {
    "{{ 'x'.encode('no-such-codec') }}": "LookupError",
    "{{ 'hello'|truncate(1) }}": "AssertionError",
    "{{ 'é'.encode('ascii', 'no-such-handler') }}": "LookupError",
    "{{ 'é'.encode().decode('ascii') }}": "UnicodeDecodeError",
    "{{ '{'.format() }}": "ValueError",
    "{{ (1e400).as_integer_ratio() }}": "OverflowError",
    "{{ range(2**63) }}": "OverflowError",
    "{{ '%(a)s' % 1 }}": "TypeError",
    "{{ 'a'.index('b') }}": "ValueError",
    "{{ (1).to_bytes(1, 'sideways') }}": "ValueError",
}


@pytest.mark.parametrize("source", ESCAPES)
def test_every_failure_inside_a_render_is_a_template_error(source):
    with pytest.raises(errors.TemplateError) as caught:
        ChatTemplate(source).render(HI)
    assert "\n" not in str(caught.value)


def test_constants_folded_at_compile_time_render_as_python_prints_them():
    # Jinja folds 'nan'|float + 1 into the name nan in the code it generates (NameError)
    assert ChatTemplate("{{ 'nan'|float + 1 }}").render(HI) == str(float("nan") + 1)
    assert ChatTemplate("{{ ['inf'|float, -('inf'|float)] }}").render(HI) == "[inf, -inf]"
    assert ChatTemplate("{{ ('nan'|float, 1.5) }}").render(HI) == "(nan, 1.5)"


def test_estimated_methods_work_inside_loops_and_blocks():
    # Jinja passes _loop_vars/_block_vars to calls made in a loop: the estimates once
    # refused every such call, and so failed real templates using content.split() in a loop
    import jinja2.sandbox

    source = (
        "{% for m in messages %}{% set parts = m.content.split('</think>') %}"
        "{{ parts[-1].replace('a', 'b').center(9) }}|{{ '{:>{}}'.format(m.role, 6) }}"
        "{% endfor %}"
    )
    messages = [{"role": "user", "content": "x</think>banana"}, {"role": "tool", "content": "a"}]
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    expected = env.from_string(source).render(messages=messages)
    assert ChatTemplate(source).render(messages) == expected


@pytest.mark.parametrize(
    "source", ["{% for %}", "{{ x | no_such_filter }}", "{{ " + "[" * 3000 + " }}", 5, None]
)
def test_every_failure_to_compile_is_a_one_line_template_error(source):
    with pytest.raises(errors.TemplateError) as caught:
        ChatTemplate(source)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 500


def test_messages_from_the_template_are_one_short_line():
    with pytest.raises(errors.TemplateError, match="first line second line") as caught:
        ChatTemplate("{{ raise_exception('first line\\nsecond line' + 'x' * 100000) }}").render(HI)
    assert len(str(caught.value)) < 500


def test_a_source_larger_than_any_chat_template_is_refused_before_compiling():
    t0 = time.perf_counter()
    with pytest.raises(errors.TemplateError, match="characters, more than"):
        ChatTemplate("{{ x }}" * 1_000_000)
    assert time.perf_counter() - t0 < HANG


# --- the cap on the rendered prompt ----------------------------------------------------------


def test_max_chars_refuses_a_longer_prompt_naming_both_lengths():
    messages = [{"role": "user", "content": "y" * 1000}]
    text = ChatTemplate(CHATML_TEMPLATE).render(messages)
    assert ChatTemplate(CHATML_TEMPLATE).render(messages, max_chars=len(text)) == text
    with pytest.raises(errors.TemplateError) as caught:
        ChatTemplate(CHATML_TEMPLATE).render(messages, max_chars=len(text) - 1)
    message = str(caught.value)
    assert f"the {len(text) - 1} allowed" in message
    rendered = int(message.split("at least ")[1].split()[0])
    assert len(text) - 1 < rendered <= len(text)


def test_max_chars_is_checked_while_rendering():
    endless = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    t0 = time.perf_counter()
    with pytest.raises(errors.TemplateError, match="more than the 1000 allowed"):
        ChatTemplate(endless).render(HI, max_chars=1000)
    assert time.perf_counter() - t0 < HANG


def test_max_chars_none_keeps_the_default_cap_and_larger_values_are_held_to_it():
    messages = [{"role": "user", "content": "y" * MAX_OUTPUT_CHARS}]
    for max_chars in (None, 10 * MAX_OUTPUT_CHARS):
        with pytest.raises(errors.TemplateError, match=f"the {MAX_OUTPUT_CHARS} allowed"):
            ChatTemplate(CHATML_TEMPLATE).render(messages, max_chars=max_chars)


@pytest.mark.parametrize("max_chars", [-1, 1.5, "100", True])
def test_max_chars_must_be_a_count(max_chars):
    with pytest.raises(errors.InvalidOptionError):
        ChatTemplate(CHATML_TEMPLATE).render(HI, max_chars=max_chars)


def test_render_refuses_extra_variables_it_sets_itself():
    with pytest.raises(errors.InvalidOptionError, match="bos_token"):
        ChatTemplate(CHATML_TEMPLATE).render(HI, bos_token="<s>")


# --- values are bounded before they are built ------------------------------------------------

BIG = "{% set s = 'a' * 4000000 %}"
# name -> template that asks for far more memory than the 256 MB a render may add
MEMORY_HOSTILE = {
    "translate": BIG + "{{ s.translate({97: 'b' * 4000}) }}",
    "translate, small input": "{{ ('a' * 1000).translate({97: 'b' * 1000000}) }}",
    "translate, list table": "{{ ('a' * 100000).translate(['x' * 30000] * 100) }}",
    "ljust with a wide fill": "{{ 'a'.ljust(4000000, '😀') ~ 'a'.rjust(4000000, '😀') }}",
    "many big values in one list": "{{ ["
    + ", ".join(["'a'.rjust(4000000, '😀')"] * 200)
    + "] | length }}",
    "center then replace": "{{ 'a'.center(4000000).replace(' ', '  ') }}",
    "zfill in a loop": "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
    "{% set ns.l = ns.l + [('%d' % i).zfill(4000000)] %}{% endfor %}",
    "nested format width": "{{ '{:>{}}'.format('a', '9' * 10) }}",
    "nested format width, joined digits": "{{ '{:{}{}}'.format('a', 999, 99999) }}",
    "nested format width in a list": "{{ '{0[0]:>{0[1]}}'.format(['a', 999999999]) }}",
    "format repr": BIG + "{{ '{!r}{!r}'.format(s.replace('a', '\\x00'), 1) }}",
    "percent repr": BIG + "{{ '%r' % s.replace('a', '\\x00') }}",
    "bytes percent width": "{{ '%0999999999d'.encode() % 1 }}",
    "bytes replace": "{{ ('a' * 1000000).encode().replace('a'.encode(), ('a' * 1000).encode()) }}",
    "encode unicode_escape": "{{ ('😀' * 1000000).encode('unicode_escape') }}",
    "encode namereplace": "{{ ('你' * 400000).encode('ascii', 'namereplace') }}",
    "split": "{{ ('a ' * 2000000).split() | length }}",
    "splitlines": "{{ ('ab\\n' * 1300000).splitlines() | length }}",
    "printing a list": BIG + "{{ [s.replace('a', '\\x00')] }}",
    "concatenating a list": BIG + "{{ [s.replace('a', '\\x00')] ~ '' }}",
    "namespace of references": BIG + "{{ namespace(a=s, b=s, c=s) }}",
    "string filter of a list": BIG + "{{ [s.replace('a', '\\x00')] | string }}",
    "upper of a list": BIG + "{{ [s.replace('a', '\\x00')] | upper }}",
    "tojson of deep nesting": "{% set ns = namespace(l=1) %}{% for i in range(400) %}"
    "{% set ns.l = [ns.l, ns.l] if i < 12 else [ns.l] %}{% endfor %}"
    "{{ ns.l | tojson(indent=100000) }}",
    "pprint of deep nesting": "{% set ns = namespace(l=1) %}{% for i in range(900) %}"
    "{% set ns.l = [ns.l, 'a' * 30000] %}{% endfor %}{{ ns.l | pprint }}",
    "batch with fill": "{{ [1] | batch(4000000, 0) | list }}",
    "slice with fill": "{{ [1] | slice(4000000, 0) | list }}",
    "join filter on characters": "{{ ('你' * 4000000) | join(',') }}",
    "join method on characters": "{{ ','.join('你' * 4000000) }}",
    "fromkeys": "{{ {}.fromkeys('你好' * 2000000) | length }}",
    "maketrans": "{{ ''.maketrans('a' * 4000000, 'b' * 4000000) }}",
    "escape": "{{ ('&' * 4000000) | e }}",
    "urlencode": "{{ ('你' * 1000000) | urlencode }}",
    "urlize target": "{{ ('a.com ' * 100000) | urlize(target='x' * 100000) }}",
    "xmlattr": BIG + "{{ {'a': s.replace('a', '&')} | xmlattr }}",
    "strftime": "{{ strftime_now('%c' * 2000000) }}",
    "indent by a string": "{{ ('\\n' * 1000000) | indent('x' * 100) }}",
    "folded concatenation": "{{ " + " ~ ".join(["'x'|center(4000000)"] * 60) + " }}",
    "concatenation in a loop": "{% set ns = namespace(s='') %}{% for i in range(100000) %}"
    "{% set ns.s = ns.s ~ ('x' * 100000) %}{% endfor %}",
}


def test_nothing_is_evaluated_at_compile_time():
    # Jinja folds constant expressions while compiling, with no sandbox checks on '~', and
    # writes the result into the generated code: 240 MB from a 1 kB macro nobody calls
    source = "{% macro m() %}{{ " + " ~ ".join(["'x'|center(4000000)"] * 60) + " }}{% endmacro %}"
    t0 = time.perf_counter()
    assert ChatTemplate(source + "done").render(HI) == "done"
    assert time.perf_counter() - t0 < HANG


_RUNNER = """
import json, resource, sys, time
# the address space this process has now, plus a margin: a runaway allocation fails here
with open("/proc/self/statm") as f:
    vm = int(f.read().split()[0]) * resource.getpagesize()
limit = vm + int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from edgeinfer import errors
from edgeinfer.chat import ChatTemplate
templates = json.loads(sys.stdin.read())
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
print(json.dumps(out))
"""


@pytest.mark.slow
def test_hostile_templates_are_refused_before_they_allocate():
    """Under an address-space limit of 768 MB above what the process holds, each template
    ends in a TemplateError from the size checks: not MemoryError, and not the watchdog's
    time limit (the memory watchdog samples, so it may catch a template that holds many
    values built one by one)."""
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(768 << 20)],
        input=json.dumps(MEMORY_HOSTILE),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name, (result, seconds) in json.loads(proc.stdout).items():
        assert result.startswith("TemplateError"), (name, result)
        assert "MemoryError" not in result and "ran longer" not in result, (name, result)
        assert seconds < HANG, (name, seconds)


LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxx{% endfor %}{% endfor %}"


@pytest.mark.parametrize(
    "source",
    [
        "{% macro m() %}" + LOOPS + "{% endmacro %}{{ m() }}",
        "{% set x %}" + LOOPS + "{% endset %}{{ x }}",
        "{% filter upper %}" + LOOPS + "{% endfilter %}",
        "{% macro m() %}{{ caller() }}{% endmacro %}{% call m() %}" + LOOPS + "{% endcall %}",
    ],
)
def test_buffered_output_is_bounded_as_it_grows(source):
    # Jinja collects these blocks in a list before joining it: that list is capped like any
    # value, so the block ends at the cap, long before the time limit or the memory watchdog
    t0 = time.perf_counter()
    with pytest.raises(errors.TemplateError, match="block of more than"):
        ChatTemplate(source).render(HI)
    assert time.perf_counter() - t0 < HANG


@pytest.mark.parametrize(
    "source, expected",
    [
        ("{{ 'ab'.translate({97: 'xy'}) }}", "xyb"),
        ("{{ '{:>{}}'.format('a', 3) }}", "  a"),
        ("{{ '%*d' % (3, 1) }}", "  1"),
        ("{{ 'a b  c'.split() }}", "['a', 'b', 'c']"),
        ("{{ 'é'.upper() ~ 'ΐ'.upper() }}", "É" + "ΐ".upper()),
        ("{{ [1, 2, 3, 4] | batch(3, 0) | list }}", "[[1, 2, 3], [4, 0, 0]]"),
        ("{{ ({'a': [1, {'b': 'c'}]}) | tojson(indent=2) }}",
         json.dumps({"a": [1, {"b": "c"}]}, indent=2)),
        ("{{ 'x'.encode('utf-8') }}", "b'x'"),
        ("{{ ['a'] ~ 'b' }}", "['a']b"),
        ("{{ 1.5 }}", "1.5"),
        ("{% macro m(a) %}<{{ a }}>{% endmacro %}{% set x %}{{ m(1) }}{{ m(2) }}{% endset %}"
         "{% filter replace('>', ']') %}{{ x }}{% endfilter %}", "<1]<2]"),
    ],
)  # fmt: skip
def test_ordinary_uses_of_the_bounded_operations_render_as_jinja_does(source, expected):
    import jinja2.sandbox

    reference = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(source).render()
    assert reference == expected
    assert ChatTemplate(source).render(HI) == expected
