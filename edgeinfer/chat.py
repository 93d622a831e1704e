"""Chat templates: the model's own Jinja template, rendered in a sandbox, or a built-in one.

A template comes from the model file, which is untrusted: it renders in Jinja's immutable
sandbox (no attribute access to Python internals, no file system, no imports), with caps
on the size of what it builds, and every failure becomes a :class:`TemplateError`.
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import math
import operator
import os
import re
import string
import sys
import threading
import time
import warnings
from collections.abc import Callable, ItemsView, KeysView, Mapping, Sequence, ValuesView
from typing import Any

import jinja2
import jinja2.compiler
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils

from edgeinfer import errors
from edgeinfer.models import ARCHITECTURES

MAX_OUTPUT_CHARS = 4 << 20  # a rendered prompt larger than this is an attack, not a chat
MAX_VALUE_SIZE = MAX_OUTPUT_CHARS  # cap on any string or list a template builds (see _size)
MAX_SOURCE_CHARS = 1 << 20  # real chat templates are a few kB; compiling costs ~100x this
MAX_INT_BITS = 1 << 14  # cap on the integers a template computes
ELEMENT_COST = 8  # what an element weighs in a container, besides itself (its pointer)
BIG_VALUE = 1 << 18  # values estimated larger than this are weighed against the memory budget
MESSAGE_CHARS = 300  # longest text an error message keeps from an exception or a template
RENDER_SECONDS = 5.0  # a template still rendering after this is stopped (nested loops)
RENDER_MEMORY = 256 << 20  # bytes a render may add to the process before it is stopped

# Built-in templates for files without one. Each renders like the family's official one.
GEMMA_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(system='') -%}
{%- for m in messages -%}
{%- if m['role'] == 'system' -%}{%- set ns.system = ns.system + (m['content'] | trim) -%}
{%- else -%}
{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}
<start_of_turn>{{ role }}
{% if ns.system and role != 'model' %}{{ ns.system }}

{% set ns.system = '' %}{% endif %}{{ m['content'] | trim }}<end_of_turn>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<start_of_turn>model
{% endif -%}"""

LLAMA3_TEMPLATE = """{{ bos_token }}
{%- for m in messages -%}
<|start_header_id|>{{ m['role'] }}<|end_header_id|>

{{ m['content'] | trim }}<|eot_id|>
{%- endfor -%}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif -%}"""

CHATML_TEMPLATE = """
{%- for m in messages -%}
<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""

LLAMA2_TEMPLATE = """
{%- set ns = namespace(system='') -%}
{%- for m in messages -%}
{%- if m['role'] == 'system' -%}{%- set ns.system = '<<SYS>>\n' + m['content'] + '\n<</SYS>>\n\n' -%}
{%- elif m['role'] == 'user' -%}{{ bos_token + '[INST] ' + (ns.system + m['content']) | trim + ' [/INST]' }}
{%- set ns.system = '' -%}
{%- else -%}{{ ' ' + m['content'] | trim + ' ' + eos_token }}
{%- endif -%}
{%- endfor -%}"""  # noqa: E501 (a template is verbatim text: wrapping its lines changes it)


# a plain transcript, for base models (no chat template, not instruction-tuned): they
# continue a dialogue written as text far better than one in special tokens they never
# learned; a reply ends where the model starts the user's next turn (TRANSCRIPT_TURN)
TRANSCRIPT_PREAMBLE = "A conversation between a user and a helpful, knowledgeable assistant."
TRANSCRIPT_TEMPLATE = """
{%- set ns = namespace(system='PREAMBLE') -%}
{%- for m in messages if m['role'] == 'system' -%}{%- set ns.system = m['content'] | trim -%}{%- endfor -%}
{{ ns.system }}

{% for m in messages if m['role'] != 'system' -%}
{{ 'User' if m['role'] == 'user' else 'Assistant' }}: {{ m['content'] | trim }}
{% endfor -%}
{%- if add_generation_prompt %}Assistant:{% endif -%}""".replace("PREAMBLE", TRANSCRIPT_PREAMBLE)  # noqa: E501
TRANSCRIPT_TURN = "\nUser:"

# name -> (template, the special tokens whose presence in a vocabulary selects it), in the
# order they are tried; an architecture names its own (edgeinfer.models) for the other files
BUILTIN_TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemma": (GEMMA_TEMPLATE, ("<start_of_turn>", "<end_of_turn>")),
    "llama3": (LLAMA3_TEMPLATE, ("<|start_header_id|>", "<|eot_id|>")),
    "chatml": (CHATML_TEMPLATE, ("<|im_start|>", "<|im_end|>")),
    "llama2": (LLAMA2_TEMPLATE, ()),
    "transcript": (TRANSCRIPT_TEMPLATE, ()),
}
FALLBACK_TEMPLATE = "llama2"  # for an architecture the runtime does not know

# Python's compiler warns about odd constant expressions ('1[0]') in the code Jinja generates
# from a template; a hostile template could fill stderr with them
warnings.filterwarnings("ignore", category=SyntaxWarning, module="<template>")


def builtin_template(arch: str, vocab: set[str] | Mapping[str, int]) -> tuple[str, str]:
    """(name, template) of the built-in template that fits a model without one: the one whose
    special tokens the vocabulary has, else the architecture's own."""
    for name, (source, markers) in BUILTIN_TEMPLATES.items():
        if markers and all(token in vocab for token in markers):
            return name, source
    entry = ARCHITECTURES.get(arch)
    name = entry.chat_template if entry is not None else FALLBACK_TEMPLATE
    return name, BUILTIN_TEMPLATES[name][0]


class _Refused(jinja2.sandbox.SecurityError):
    pass


# --- what values weigh -----------------------------------------------------------------------


def _attrs(v: Any) -> dict[str, Any]:
    """The attributes a Jinja namespace() holds (it hides them from getattr)."""
    return object.__getattribute__(v, "_Namespace__attrs")


def _size(value: Any, limit: int) -> int:
    """What ``value`` weighs: characters of its strings, counting a string each time a
    container refers to it, plus ELEMENT_COST per element. Stops counting past ``limit``."""
    if type(value) in (str, bytes):  # most values: checked first, and at once
        return len(value)
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v)
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += ELEMENT_COST * len(v) + 1
            if total <= limit:
                stack.extend(v)
        elif isinstance(v, dict):
            total += 2 * ELEMENT_COST * len(v) + 1
            if total <= limit:
                stack.extend(v.keys())
                stack.extend(v.values())
        elif isinstance(v, int) and not isinstance(v, bool):
            if v.bit_length() > MAX_INT_BITS:
                return limit + 1
            total += 1
        elif isinstance(v, (float, bool, type(None))):
            total += 1
        elif isinstance(v, jinja2.utils.Namespace):
            total += 1
            stack.append(_attrs(v))
        elif isinstance(v, (KeysView, ValuesView, ItemsView)):
            total += 2 * ELEMENT_COST * len(v) + 1
            if total <= limit:
                stack.extend(v)
        else:
            total += 1
    return total


def _printed_size(value: Any, limit: int = MAX_VALUE_SIZE) -> int:
    """Upper bound on ``len(str(value))``: a container prints the repr of its elements, which
    is up to 10 characters per character of a string ('\\U0010ffff')."""
    if isinstance(value, str):
        return len(value)
    if type(value) in (float, bool, type(None)):
        return 64
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2 if v.isascii() and v.isprintable() else 10 * len(v) + 2
        elif isinstance(v, bytes):
            total += 4 * len(v) + 3
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 * len(v) + 16
            if total <= limit:
                stack.extend(v)
        elif isinstance(v, dict):
            total += 4 * len(v) + 16
            if total <= limit:
                stack.extend(v.items())
        elif isinstance(v, int) and not isinstance(v, bool):
            total += v.bit_length() // 3 + 2
        elif isinstance(v, (float, bool, type(None))):
            total += 64
        elif isinstance(v, jinja2.utils.Namespace):
            total += 16
            stack.append(_attrs(v))
        elif isinstance(v, (KeysView, ValuesView, ItemsView)):
            total += 4 * len(v) + 16
            if total <= limit:
                stack.extend(v)
        else:
            total += 64  # an object printed as <... at 0x...>
    return total


def _nested_text_size(value: Any, indent: Any, char_cost: int, limit: int) -> int:
    """Upper bound on JSON or pprint text of ``value``: ``char_cost`` per character (escapes)
    and, with an indent, one line per element indented by its depth."""
    if isinstance(indent, str):
        step = len(indent)
    elif isinstance(indent, int) and not isinstance(indent, bool):
        step = max(indent, 0)
    else:
        step = 0
    total, stack = 0, [(value, 0)]
    while stack and total <= limit:
        v, depth = stack.pop()
        total += step * depth + 4  # its line: the indent, quotes, separator, newline
        if isinstance(v, (str, bytes)):
            total += char_cost * len(v)
        elif isinstance(v, (list, tuple, set, frozenset, KeysView, ValuesView)):
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, (Mapping, ItemsView)):
            pairs = v.items() if isinstance(v, Mapping) else v
            stack.extend((x, depth + 1) for pair in pairs for x in pair)
        elif isinstance(v, jinja2.utils.Namespace):
            stack.append((_attrs(v), depth))
        elif isinstance(v, int) and not isinstance(v, bool):
            total += v.bit_length() // 3 + 2
        else:
            total += 64
    return total


def _check(value: Any) -> Any:
    """Refuses a value too large for a chat prompt; returns it otherwise."""
    if _size(value, MAX_VALUE_SIZE) > MAX_VALUE_SIZE:
        raise _Refused("a chat template built too large a value")
    return value


# (process memory when this thread's render began, bytes it may add), while one runs
_render_budget = threading.local()


def _expect(estimate: int, limit: int = MAX_VALUE_SIZE) -> None:
    """Refuses to build a value whose estimated size is past ``limit``, or whose bytes
    (up to 4 per unit) would take the render past its memory budget."""
    if estimate > limit:
        raise _Refused(f"a chat template asked for too large a value ({estimate} > {limit})")
    budget = getattr(_render_budget, "value", None)
    if budget is not None and estimate > BIG_VALUE:
        # the watcher thread samples memory every few ms; a loop of big values could outrun it
        start, allowed = budget
        rss = _rss_bytes()
        if rss is not None and rss - start + 4 * estimate > allowed:
            raise _Refused(f"a chat template would use more than {allowed >> 20} MB of memory")


def _check_ints(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Widths, counts and repetitions passed to any call stay below the value cap."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_VALUE_SIZE:
            raise _Refused(f"a chat template passed the number {v} to a function")


# --- upper bounds on what an operation builds, from its arguments ------------------------------

_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?([a-zA-Z%])")
_DIGITS = re.compile(r"\d+")
# every character str.split() and str.splitlines() break at
_WHITESPACE = "".join(c for c in map(chr, range(0x3001)) if c.isspace())
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"


def _number(digits: str) -> int:
    """The value of a run of digits in a format spec (past 12 digits: too large anyway)."""
    return int(digits) if len(digits) <= 12 else 10**12


def _as_text(s: Any) -> str:
    return s.decode("latin-1") if isinstance(s, bytes) else str(s)


def _value_cost(v: Any, as_repr: bool) -> int:
    return len(v) if isinstance(v, str) and not as_repr else _printed_size((v,))


def _nested_width(values: Sequence[Any]) -> int:
    """Widest a spec can get whose nested fields come from ``values``: the digits they hold
    can be joined into one number."""
    digits = 0
    for v in values:
        text = _as_text(v) if isinstance(v, (str, bytes)) else str(v) if isinstance(v, int) else ""
        digits += sum(len(d) for d in _DIGITS.findall(text)) if text else 0
        if isinstance(v, (list, tuple, Mapping)) and _size(v, 1 << 16) <= 1 << 16:
            items = list(v.values()) if isinstance(v, Mapping) else list(v)
            digits += len(str(_nested_width(items)))
    return 10 ** min(digits, 13)


def _percent_estimate(fmt: Any, args: Any) -> int:
    """Upper bound on the length of ``fmt % args``."""
    fmt = _as_text(fmt)
    values = (
        list(args.values())
        if isinstance(args, Mapping)
        else list(args)
        if isinstance(args, tuple)
        else [args]
    )
    _check_ints(values, {})
    specs = _PERCENT_SPEC.findall(fmt)
    widths = [_number(n) for spec in specs for n in spec[:2] if n.isdigit()]
    widths += [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    as_repr = any(spec[2] in "ra" for spec in specs)
    biggest = max((_value_cost(v, as_repr) for v in values), default=0)
    return len(fmt) + fmt.count("%") * (max(widths, default=0) + biggest + 32)


def _format_estimate(fmt: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    """Upper bound on the length of ``fmt.format(*args, **kwargs)``."""
    _check_ints(args, kwargs)
    values = [*args, *kwargs.values()]
    widths, n_fields, as_repr = [0], 0, False
    for _, field, spec, conversion in string.Formatter().parse(fmt):
        if field is not None:
            n_fields += 1
            as_repr = as_repr or conversion in ("r", "a")
            widths += [_number(n) for n in _DIGITS.findall(spec or "")]
            if spec and "{" in spec:
                widths.append(_nested_width(values))
    widths += [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    biggest = max((_value_cost(v, as_repr) for v in values), default=0)
    return len(fmt) + n_fields * (max(widths) + biggest + 32)


def _replace_estimate(s: Any, old: Any, new: Any, count: Any = -1) -> int:
    if not (isinstance(s, (str, bytes)) and type(old) is type(s) and type(new) is type(s)):
        return len(s) if isinstance(s, (str, bytes)) else 0
    # old has s's type (checked above)
    n = s.count(old) if old else len(s) + 1  # type: ignore[arg-type]
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * len(new)


def _join_estimate(sep: Any, items: list[Any]) -> int:
    """Upper bound on ``sep.join(items)``; items that are not strings are printed."""
    sep_len = len(sep) if isinstance(sep, (str, bytes)) else 0
    printed = sum(len(x) if isinstance(x, (str, bytes)) else _printed_size(x) for x in items)
    return printed + sep_len * len(items)


def _count_any(s: Any, chars: str) -> int:
    if isinstance(s, bytes):
        return sum(s.count(c.encode("latin-1")) for c in chars if ord(c) < 256)
    return sum(s.count(c) for c in chars) if isinstance(s, str) else 0


def _pieces(s: Any, sep: Any = None, maxsplit: Any = -1) -> int:
    """Upper bound on how many pieces ``s.split(sep, maxsplit)`` has."""
    if sep is None:
        n = _count_any(s, _WHITESPACE) + 1
    elif type(sep) is type(s) and sep:
        n = s.count(sep) + 1
    else:
        n = 1  # split refuses it
    if isinstance(maxsplit, int) and maxsplit >= 0:
        n = min(n, maxsplit + 1)
    return n


def _case_estimate(s: Any, *_: Any, **__: Any) -> int:
    """Changing case can turn one character into three ('ΐ'.upper())."""
    if not isinstance(s, (str, bytes)):
        return 3 * _printed_size(s)
    return len(s) if s.isascii() else 3 * len(s)


def _int_or_zero(n: Any) -> int:
    return n if isinstance(n, int) else 0


def _translate_estimate(s: Any, table: Any = None, *_: Any) -> int:
    if not isinstance(s, str):
        return len(s)
    if isinstance(table, (str, range)) or table is None:
        longest = 1
    elif isinstance(table, (Mapping, list, tuple)):
        pieces = table.values() if isinstance(table, Mapping) else table
        longest = max((len(p) if isinstance(p, str) else 1 for p in pieces), default=1)
    else:
        return MAX_VALUE_SIZE + 1  # a table whose lookups the sandbox cannot see
    return len(s) * max(longest, 1)


_PLAIN_CODECS = {"utf8", "utf_8", "ascii", "latin1", "latin_1", "iso8859_1", "cp1252"}


def _encode_estimate(s: Any, encoding: Any = "utf-8", errors: Any = "strict") -> int:
    """Bytes of ``s.encode(...)``: escape codecs and error handlers write up to 10 characters
    for one ('\\U0010ffff', '&#1114111;'), namereplace up to 90."""
    codec = str(encoding).lower().replace("-", "_")
    if s.isascii() and codec in _PLAIN_CODECS:
        return len(s)
    return len(s) * (100 if errors == "namereplace" else 10) + 8


# Upper bounds on what a method of a string (or bytes) builds, by method name, with the
# limit each is held to: changing case is bounded by 3x, so it may start from a full value.
_METHOD_ESTIMATES: dict[str, tuple[Callable[..., int], int]] = {
    "replace": (_replace_estimate, MAX_VALUE_SIZE),
    "expandtabs": (
        lambda s, tabsize=8: len(s) + _count_any(s, "\t") * _int_or_zero(tabsize),
        MAX_VALUE_SIZE,
    ),
    "format": (lambda s, *a, **k: _format_estimate(s, a, k), MAX_VALUE_SIZE),
    "format_map": (lambda s, m: _format_estimate(s, (), m), MAX_VALUE_SIZE),
    "center": (lambda s, width, *_: max(len(s), width), MAX_VALUE_SIZE),
    "ljust": (lambda s, width, *_: max(len(s), width), MAX_VALUE_SIZE),
    "rjust": (lambda s, width, *_: max(len(s), width), MAX_VALUE_SIZE),
    "zfill": (lambda s, width: max(len(s), width), MAX_VALUE_SIZE),
    "translate": (_translate_estimate, MAX_VALUE_SIZE),
    "encode": (_encode_estimate, MAX_VALUE_SIZE),
    "decode": (lambda s, *a, **k: 4 * len(s), MAX_VALUE_SIZE),  # backslashreplace: 4x
    "hex": (lambda s, *a, **k: 3 * len(s), MAX_VALUE_SIZE),
    "split": (lambda s, *a, **k: len(s) + ELEMENT_COST * _pieces(s, *a, **k), MAX_VALUE_SIZE),
    "rsplit": (lambda s, *a, **k: len(s) + ELEMENT_COST * _pieces(s, *a, **k), MAX_VALUE_SIZE),
    "splitlines": (
        lambda s, *a, **k: len(s) + ELEMENT_COST * (_count_any(s, _LINE_BREAKS) + 1),
        MAX_VALUE_SIZE,
    ),
    **{
        name: (_case_estimate, 3 * MAX_VALUE_SIZE)
        for name in ("upper", "lower", "casefold", "title", "swapcase", "capitalize")
    },
}


_JINJA_CALL_KWARGS = ("_loop_vars", "_block_vars")


def _method_estimate(owner: Any, name: str, args: tuple, kwargs: dict) -> tuple[int, int]:
    """(estimate, limit) for a method call, or (0, 0) when its result is no larger than
    what it is given."""
    if isinstance(owner, (str, bytes)) and name in _METHOD_ESTIMATES:
        estimate, limit = _METHOD_ESTIMATES[name]
        return estimate(owner, *args, **kwargs), limit
    if name == "maketrans":
        # a dict with an entry per character given
        return 2 * ELEMENT_COST * sum(_size(a, MAX_VALUE_SIZE) for a in args), MAX_VALUE_SIZE
    if name == "to_bytes" and isinstance(owner, int):
        length = kwargs.get("length", args[0] if args else 1)
        return (length if isinstance(length, int) else 0), MAX_VALUE_SIZE
    return 0, 0


def _lines(s: Any) -> int:
    return s.count("\n") + 1 if isinstance(s, str) else 1


def _escape_estimate(s: Any, *_: Any, **__: Any) -> int:
    if isinstance(s, str):
        return len(s) + 4 * _count_any(s, "&<>\"'")  # '&' -> '&amp;'
    return 5 * _printed_size(s)


def _urlize_estimate(s: Any, *_: Any, target: Any = None, rel: Any = None, **__: Any) -> int:
    words = _count_any(str(s), _WHITESPACE) + 1
    extra = len(str(target or "")) + len(str(rel or ""))
    return 6 * len(str(s)) + words * (64 + extra)


_FILTER_ESTIMATES: dict[str, Callable[..., int]] = {
    "replace": lambda s, old, new, count=None: _replace_estimate(
        str(s), str(old), str(new), -1 if count is None else count
    ),
    "indent": lambda s, width=4, *_, **__: (
        len(str(s)) + _lines(s) * (len(width) if isinstance(width, str) else int(width))
    ),
    "wordwrap": lambda s, width=79, break_long_words=True, wrapstring=None, *_, **__: (
        (len(str(s)) + 1) * (2 + len(wrapstring or "\n"))
    ),
    "format": lambda s, *a, **k: _percent_estimate(str(s), k or a),
    "center": lambda s, width=80: max(len(str(s)), int(width)),
    "tojson": lambda v, indent=None, **_: _nested_text_size(v, indent, 6, MAX_VALUE_SIZE),
    "pprint": lambda v: _nested_text_size(v, 1, 10, MAX_VALUE_SIZE),
    "string": lambda v: _printed_size(v),
    "escape": _escape_estimate,
    "e": _escape_estimate,
    "forceescape": _escape_estimate,
    "urlencode": lambda v: 12 * _printed_size(v),  # 4 UTF-8 bytes of '%XX' each
    "urlize": _urlize_estimate,
    "xmlattr": lambda d, *_: 6 * _printed_size(d) + 4 * len(d),
    "batch": lambda v, linecount, fill_with=None: (
        _size(v, MAX_VALUE_SIZE) + (0 if fill_with is None else ELEMENT_COST * linecount)
    ),
    "slice": lambda v, slices, fill_with=None: _size(v, MAX_VALUE_SIZE) + 4 * ELEMENT_COST * slices,
    "truncate": lambda s, length=255, killwords=False, end="...", *_, **__: (
        min(len(str(s)), int(length)) + len(str(end))
    ),
}
_CASE_FILTERS = ("upper", "lower", "title", "capitalize")
# filters that iterate over their value: a string becomes a list of one-character strings
_ITERATING_FILTERS = frozenset(
    ("join", "list", "sum", "unique", "sort", "map", "select", "reject", "selectattr")
    + ("rejectattr", "slice", "batch", "groupby", "min", "max", "dictsort", "items")
)
# filters that print their value: a container costs the repr of everything in it
_STRINGIFYING_FILTERS = frozenset(
    ("replace", "indent", "wordwrap", "format", "center", "truncate", "urlize", "trim")
    + ("striptags", "wordcount", "safe", "string", "upper", "lower", "title", "capitalize")
)
# filters whose (possibly lazy) input is materialized once, so that its cost is seen
_MATERIALIZED_FILTERS = ("join", "list", "sum", "unique", "sort", "map", "select", "reject")


def _checked_filter(name: str, fn: Any) -> Any:
    """``fn`` with its arguments and result checked against the value cap."""
    estimate = _FILTER_ESTIMATES.get(name)
    passes = jinja2.utils._PassArg.from_obj(fn) is not None  # context first, then the value

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        _check_ints(args, kwargs)
        value_args = args[1:] if passes else args
        value = value_args[0] if value_args else None
        if value_args and name in _ITERATING_FILTERS and isinstance(value, (str, list, tuple)):
            _expect(ELEMENT_COST * len(value))
        if value_args and name in _STRINGIFYING_FILTERS and not isinstance(value, str):
            _expect(_printed_size(value))
        if name in _MATERIALIZED_FILTERS and value_args:
            # materialize the input once (it may be a generator) and bound what it costs
            items = list(value_args[0])
            if name == "join":
                sep = kwargs.get("d", value_args[1] if len(value_args) > 1 else "")
                _expect(_join_estimate(sep, items))
            else:
                _expect(2 * _size(items, MAX_VALUE_SIZE))
            if name == "sum" and not isinstance(kwargs.get("start", 0), (int, float)):
                raise _Refused("sum() of a chat template may only add numbers")
            args = (*args[: len(args) - len(value_args)], items, *value_args[1:])
        elif name in _CASE_FILTERS and value_args:
            _expect(_case_estimate(value_args[0]), 3 * MAX_VALUE_SIZE)
        elif estimate is not None and value_args:
            _expect(estimate(*value_args, **kwargs))
        return _check(fn(*args, **kwargs))

    return checked


def _const_source(value: Any) -> str:
    """Python source for a constant folded at compile time. Jinja writes ``str(value)`` for
    a float, which for nan and inf is a name that does not exist."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if isinstance(value, list):
        return "[" + ", ".join(map(_const_source, value)) + "]"
    if isinstance(value, tuple):
        return "(" + "".join(_const_source(v) + ", " for v in value) + ")"
    if isinstance(value, dict):
        pairs = (f"{_const_source(k)}: {_const_source(v)}" for k, v in value.items())
        return "{" + ", ".join(pairs) + "}"
    return str(value) if isinstance(value, float) else repr(value)


class _OutputBuffer(list):
    """The output of a macro, a call, a ``{% set %}`` or a ``{% filter %}`` block, which
    Jinja collects in a list before joining it into one value: bounded as it grows."""

    __slots__ = ("chars",)

    def __init__(self) -> None:
        super().__init__()
        self.chars = 0

    def _grow(self, n: int) -> None:
        self.chars += n
        if self.chars > MAX_VALUE_SIZE:
            raise _Refused(
                f"a chat template built a block of more than {MAX_VALUE_SIZE} characters"
            )

    def append(self, piece: Any) -> None:
        self._grow(len(piece) if isinstance(piece, str) else 0)
        super().append(piece)

    def extend(self, pieces: Any) -> None:
        pieces = tuple(pieces)
        self._grow(sum(len(p) for p in pieces if isinstance(p, str)))
        super().extend(pieces)


class _CodeGenerator(jinja2.compiler.CodeGenerator):
    """Compiles ``a ~ b`` into a size-checked join (Jinja's own str_join is not intercepted),
    collects buffered output in an :class:`_OutputBuffer`, folds no expression, and writes
    constants as valid Python."""

    def buffer(self, frame: Any) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.output_buffer()")

    def _output_child_to_const(self, node: Any, frame: Any, finalize: Any) -> str:
        # Folding a printed expression runs its filters and joins at compile time, where
        # ``~`` is not checked, and puts the result into the generated code: a template could
        # fold hundreds of MB out of a few kB. Only literal text is folded; the rest renders.
        if not isinstance(node, (jinja2.nodes.TemplateData, jinja2.nodes.Const)):
            raise jinja2.nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)

    def visit_Concat(self, node: Any, frame: Any) -> None:
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_Const(self, node: Any, frame: Any) -> None:
        self.write(_const_source(node.as_const(frame.eval_ctx)))


def _finalize(value: Any) -> Any:
    """Every printed value passes here before ``str()``: bound what printing a container
    (the repr of everything in it) builds."""
    if not isinstance(value, str):
        _expect(_printed_size(value))
    return value


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Immutable sandbox that also bounds the size of every value a template builds.

    Values are checked after each operator, ``~``, call and filter; operations that can
    build far more than they are given (repetition, padding widths, replace, join, format,
    translate, splitting, printing a container) are estimated before they run, so that no
    single step allocates much. Time and memory of the render as a whole are watched by
    :func:`_with_watchdog`.
    """

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def __init__(self, **options: Any) -> None:
        # optimized=False: no constant folding (see _CodeGenerator._output_child_to_const)
        super().__init__(finalize=_finalize, optimized=False, **options)
        self.globals.pop("lipsum", None)  # lorem ipsum of any length: no template needs it
        self.filters["tojson"] = _tojson
        self.filters = {name: _checked_filter(name, fn) for name, fn in self.filters.items()}

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # Jinja returns an undefined value that only fails when used; a chat template has no
        # business touching such attributes at all, so fail at once
        raise jinja2.sandbox.SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} is not allowed"
        )

    @staticmethod
    def output_buffer() -> _OutputBuffer:
        return _OutputBuffer()

    def checked_concat(self, parts: Sequence[Any]) -> str:
        _expect(sum(_printed_size(p) for p in parts))
        texts = [str(p) for p in parts]
        _expect(sum(len(t) for t in texts))
        return "".join(texts)

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0:
                if max(left.bit_length(), 1) * right > MAX_INT_BITS:
                    raise _Refused("a chat template built too large a number")
            elif isinstance(right, (int, float)) and abs(right) > MAX_INT_BITS:
                raise _Refused("a chat template built too large a number")
            return _check(operator.pow(left, right))
        if operator_name == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                    _expect(_size(seq, MAX_VALUE_SIZE) * max(n, 0))
            if (
                isinstance(left, int)
                and isinstance(right, int)
                and left.bit_length() + right.bit_length() > MAX_INT_BITS
            ):
                raise _Refused("a chat template built too large a number")
            return _check(operator.mul(left, right))
        if operator_name == "%" and isinstance(left, (str, bytes)):
            _expect(_percent_estimate(left, right))
            return _check(operator.mod(left, right))
        if operator_name == "%":
            return operator.mod(left, right)
        if isinstance(left, (str, bytes, list, tuple)) and isinstance(
            right, (str, bytes, list, tuple)
        ):
            _expect(_size(left, MAX_VALUE_SIZE) + _size(right, MAX_VALUE_SIZE))
        return _check(operator.add(left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_ints(args, kwargs)
        target = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped by Jinja
        owner = getattr(target, "__self__", None)
        name = getattr(target, "__name__", "")
        # inside loops and blocks Jinja passes its variables along, for Context.call to drop
        call_kwargs = {k: v for k, v in kwargs.items() if k not in _JINJA_CALL_KWARGS}
        if name in ("join", "fromkeys") and args and isinstance(owner, (str, bytes, type)):
            if isinstance(args[0], (str, bytes, list, tuple, dict)):
                _expect(ELEMENT_COST * len(args[0]))
            items = list(args[0])  # materialized once: it may be a generator
            if name == "join":
                _expect(_join_estimate(owner, items))
            else:
                _expect(2 * ELEMENT_COST * len(items) + _size(items, MAX_VALUE_SIZE))
            args = (items, *args[1:])
        else:
            estimate, limit = _method_estimate(owner, name, args, call_kwargs)
            if estimate:
                _expect(estimate, limit)
        return _check(super().call(__context, __obj, *args, **kwargs))


def _one_line(text: Any) -> str:
    """``text`` on one line, cut to MESSAGE_CHARS: error messages quote template values."""
    text = text if isinstance(text, str) else _describe_value(text)
    flat = " ".join(text[: 4 * MESSAGE_CHARS].splitlines())
    return flat if len(flat) <= MESSAGE_CHARS else flat[: MESSAGE_CHARS - 3] + "..."


def _describe_value(value: Any) -> str:
    try:
        return str(value) if _printed_size(value, 1 << 16) <= 1 << 16 else type(value).__name__
    except Exception:  # a value whose str() fails still gets a message
        return type(value).__name__


def _describe(e: BaseException) -> str:
    return _one_line(f"{type(e).__name__}: {_describe_value(e)}")


def _raise(message: Any) -> None:
    raise errors.TemplateError(f"chat template refused the conversation: {_one_line(message)}")


def _strftime_now(fmt: str) -> str:
    _expect(16 * len(fmt))  # '%c' is 24 characters
    return datetime.datetime.now().strftime(fmt)


_RESERVED = ("messages", "add_generation_prompt", "bos_token", "eos_token")


class ChatTemplate:
    """A compiled chat template with the special-token strings it may refer to.

    Nothing but :class:`errors.TemplateError` (and :class:`errors.InvalidOptionError` for
    malformed messages) leaves the constructor or :meth:`render`, whatever the source.
    """

    def __init__(
        self, source: str, *, bos_token: str = "", eos_token: str = "", name: str = "model"
    ) -> None:
        self.name = name
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        if not isinstance(source, str):
            raise errors.TemplateError(f"chat template {name!r} is not a string")
        if len(source) > MAX_SOURCE_CHARS:
            raise errors.TemplateError(
                f"chat template {name!r} has {len(source)} characters, more than the "
                f"{MAX_SOURCE_CHARS} a chat template may have"
            )
        env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
        try:
            # compiling folds constants, which runs filters: it is watched like a render
            self._template = _with_watchdog(
                lambda: env.from_string(source), RENDER_SECONDS, RENDER_MEMORY
            )
        except _Stopped as e:
            raise errors.TemplateError(f"chat template {name!r} {e.args[0]} compiling") from None
        except Exception as e:  # any failure of the compiler is a template that does not compile
            raise errors.TemplateError(
                f"chat template {name!r} does not compile: {_describe(e)}"
            ) from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        max_chars: int | None = None,
        **extra: Any,
    ) -> str:
        """The prompt for ``messages``. ``max_chars`` caps its length (None: MAX_OUTPUT_CHARS;
        a larger value is held to MAX_OUTPUT_CHARS too); a longer prompt is refused while it
        renders, with a TemplateError."""
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise errors.InvalidOptionError("messages must be a list of {'role', 'content'} dicts")
        if max_chars is not None and (
            not isinstance(max_chars, int) or isinstance(max_chars, bool) or max_chars < 0
        ):
            raise errors.InvalidOptionError(
                f"max_chars must be a count of characters: {max_chars!r}"
            )
        clash = [name for name in _RESERVED if name in extra]
        if clash:
            raise errors.InvalidOptionError(f"render() sets {clash[0]!r} itself")
        checked = [_check_message(m, i) for i, m in enumerate(messages)]
        variables = dict(
            messages=checked,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            **extra,
        )
        limit = MAX_OUTPUT_CHARS if max_chars is None else min(max_chars, MAX_OUTPUT_CHARS)
        try:
            return _with_watchdog(
                lambda: self._render(variables, limit), RENDER_SECONDS, RENDER_MEMORY
            )
        except _Stopped as e:
            raise errors.TemplateError(f"chat template {self.name!r} {e.args[0]}") from None
        except errors.EdgeInferError:
            raise
        except jinja2.sandbox.SecurityError as e:
            raise errors.TemplateError(
                f"chat template {self.name!r} broke the sandbox rules: {_one_line(str(e))}"
            ) from None
        except Exception as e:  # whatever the template made Jinja or Python raise
            raise errors.TemplateError(
                f"chat template {self.name!r} failed: {_describe(e)}"
            ) from None

    def _render(self, variables: dict[str, Any], limit: int) -> str:
        out, n = [], 0
        for piece in self._template.generate(**variables):
            n += len(piece)
            if n > limit:
                raise errors.TemplateError(
                    f"chat template {self.name!r} rendered at least {n} characters, more than "
                    f"the {limit} allowed"
                )
            out.append(piece)
        return "".join(out)


class _Stopped(BaseException):
    """Injected into a render that runs too long or grows too much (BaseException: a template
    cannot catch it, and Jinja lets it through)."""


def _rss_bytes() -> int | None:
    """Resident memory of this process now (Linux), or its peak elsewhere; None if unknown."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except (ImportError, OSError):
        return None


def _with_watchdog(fn: Any, seconds: float, memory: int) -> Any:
    """Runs ``fn`` in this thread; a watcher thread raises _Stopped inside it once it has run
    ``seconds`` or the process has grown by ``memory`` bytes.

    Jinja compiles templates to Python bytecode, so an asynchronous exception stops even a
    loop that emits nothing. The lock makes sure it can only be sent while ``fn`` still runs;
    one sent but not yet delivered when ``fn`` returns is withdrawn.
    """
    lock = threading.Lock()
    active = [True]
    reason = [""]
    tid = threading.get_ident()
    finished = threading.Event()
    start_rss = _rss_bytes()
    deadline = time.monotonic() + seconds

    def watch() -> None:
        while not finished.wait(0.02):
            rss = _rss_bytes() if start_rss is not None else None
            if time.monotonic() > deadline:
                why = f"ran longer than {seconds:g} s"
            elif rss is not None and start_rss is not None and rss - start_rss > memory:
                why = f"used more than {memory >> 20} MB of memory"
            else:
                continue
            with lock:
                if active[0]:
                    reason[0] = why
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(tid), ctypes.py_object(_Stopped)
                    )
            return

    outer_budget = getattr(_render_budget, "value", None)
    _render_budget.value = None if start_rss is None else (start_rss, memory)
    watcher = threading.Thread(target=watch, name="chat-template-watchdog", daemon=True)
    watcher.start()
    try:
        return fn()
    except _Stopped:
        raise _Stopped(reason[0] or "was stopped") from None
    finally:
        try:
            with lock:
                active[0] = False
                if reason[0]:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)
        finally:
            finished.set()
            _render_budget.value = outer_budget


def _check_message(m: Any, i: int) -> dict[str, Any]:
    if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
        raise errors.InvalidOptionError(f"message #{i} needs a 'role' string and 'content'")
    content = m.get("content", "")
    if not isinstance(content, str):
        raise errors.InvalidOptionError(f"message #{i}: content must be a string")
    return {**m, "content": content}


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, indent=indent)
