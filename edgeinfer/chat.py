"""Chat templates: the model's own Jinja template, rendered in a sandbox, or a built-in one.

A template comes from the model file, which is untrusted: it renders in Jinja's immutable
sandbox (no attribute access to Python internals, no file system, no imports), with caps
on the size of what it builds, and every failure becomes a :class:`TemplateError`.
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import operator
import os
import re
import string
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jinja2
import jinja2.compiler
import jinja2.sandbox
import jinja2.utils

from edgeinfer import errors
from edgeinfer.models import ARCHITECTURES

MAX_OUTPUT_CHARS = 4 << 20  # a rendered prompt larger than this is an attack, not a chat
MAX_VALUE_SIZE = MAX_OUTPUT_CHARS  # cap on any string or list a template builds (see _size)
MAX_INT_BITS = 1 << 14  # cap on the integers a template computes
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


# name -> (template, the special tokens whose presence in a vocabulary selects it), in the
# order they are tried; an architecture names its own (edgeinfer.models) for the other files
BUILTIN_TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemma": (GEMMA_TEMPLATE, ("<start_of_turn>", "<end_of_turn>")),
    "llama3": (LLAMA3_TEMPLATE, ("<|start_header_id|>", "<|eot_id|>")),
    "chatml": (CHATML_TEMPLATE, ("<|im_start|>", "<|im_end|>")),
    "llama2": (LLAMA2_TEMPLATE, ()),
}
FALLBACK_TEMPLATE = "llama2"  # for an architecture the runtime does not know


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


def _size(value: Any, limit: int) -> int:
    """What ``value`` weighs once printed: characters of its strings, counting a string each
    time a container refers to it, plus one per element. Stops counting past ``limit``."""
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v)
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += len(v) + 1
            stack.extend(v)
        elif isinstance(v, dict):
            total += len(v) + 1
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, int) and not isinstance(v, bool):
            if v.bit_length() > MAX_INT_BITS:
                return limit + 1
            total += 1
        else:
            total += 1
    return total


def _check(value: Any) -> Any:
    """Refuses a value too large for a chat prompt; returns it otherwise."""
    if _size(value, MAX_VALUE_SIZE) > MAX_VALUE_SIZE:
        raise _Refused("a chat template built too large a value")
    return value


def _expect(estimate: int) -> None:
    if estimate > MAX_VALUE_SIZE:
        raise _Refused("a chat template asked for too large a value")


def _check_ints(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Widths, counts and repetitions passed to any call stay below the value cap."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_VALUE_SIZE:
            raise _Refused(f"a chat template passed the number {v} to a function")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?[a-zA-Z%]")


def _percent_estimate(fmt: str, args: Any) -> int:
    """Upper bound on the length of ``fmt % args``."""
    values = (
        list(args.values())
        if isinstance(args, Mapping)
        else list(args)
        if isinstance(args, tuple)
        else [args]
    )
    _check_ints(values, {})
    widths = [int(n) for spec in _PERCENT_SPEC.findall(fmt) for n in spec if n.isdigit()]
    widths += [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    n_specs = fmt.count("%")
    biggest = max((_size(v, MAX_VALUE_SIZE) for v in values), default=0)
    return len(fmt) + n_specs * (max(widths, default=0) + biggest + 32)


def _format_estimate(fmt: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    """Upper bound on the length of ``fmt.format(*args, **kwargs)``."""
    _check_ints(args, kwargs)
    widths, n_fields = [0], 0
    for _, field, spec, _ in string.Formatter().parse(fmt):
        if field is not None:
            n_fields += 1
            widths += [int(n) for n in re.findall(r"\d+", spec or "")]
    widths += [
        v for v in (*args, *kwargs.values()) if isinstance(v, int) and not isinstance(v, bool)
    ]
    biggest = max((_size(v, MAX_VALUE_SIZE) for v in (*args, *kwargs.values())), default=0)
    return len(fmt) + n_fields * (max(widths) + biggest + 32)


def _replace_estimate(s: Any, old: Any, new: Any, count: Any = -1) -> int:
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * len(new)


def _join_estimate(sep: Any, items: list[Any]) -> int:
    sep_len = len(sep) if isinstance(sep, str) else 0
    return sum(_size(x, MAX_VALUE_SIZE) for x in items) + sep_len * len(items)


def _lines(s: Any) -> int:
    return s.count("\n") + 1 if isinstance(s, str) else 1


# Upper bounds on the output of the functions whose output can outgrow their input by a
# factor their arguments choose. Keyed by method name (on str) or filter name.
_METHOD_ESTIMATES: dict[str, Callable[..., int]] = {
    "replace": lambda s, *a, **k: _replace_estimate(s, *a, **k),
    "expandtabs": lambda s, tabsize=8: len(s) + s.count("\t") * int(tabsize),
    "format": lambda s, *a, **k: _format_estimate(s, a, k),
    "format_map": lambda s, m: _format_estimate(s, (), m),
}
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
    "tojson": lambda v, indent=None: 6 * _size(v, MAX_VALUE_SIZE) * (1 + int(indent or 0)),
}


def _checked_filter(name: str, fn: Any) -> Any:
    """``fn`` with its arguments and result checked against the value cap."""
    estimate = _FILTER_ESTIMATES.get(name)
    passes = jinja2.utils._PassArg.from_obj(fn) is not None  # context first, then the value

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        _check_ints(args, kwargs)
        value_args = args[1:] if passes else args
        if (
            name in ("join", "list", "sum", "unique", "sort", "map", "select", "reject")
            and value_args
        ):
            # materialize the input once (it may be a generator) and bound what it costs
            if isinstance(value_args[0], (str, list, tuple, dict)):
                _expect(2 * len(value_args[0]))  # one object per character of a string
            items = list(value_args[0])
            if name == "join":
                sep = kwargs.get("d", value_args[1] if len(value_args) > 1 else "")
                _expect(_join_estimate(sep, items))
            else:
                _expect(2 * _size(items, MAX_VALUE_SIZE))
            if name == "sum" and not isinstance(kwargs.get("start", 0), (int, float)):
                raise _Refused("sum() of a chat template may only add numbers")
            args = (*args[: len(args) - len(value_args)], items, *value_args[1:])
        elif estimate is not None and value_args:
            _expect(estimate(*value_args, **kwargs))
        return _check(fn(*args, **kwargs))

    return checked


class _CodeGenerator(jinja2.compiler.CodeGenerator):
    """Compiles ``a ~ b`` into a size-checked join (Jinja's own str_join is not intercepted)."""

    def visit_Concat(self, node: Any, frame: Any) -> None:
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Immutable sandbox that also bounds the size of every value a template builds.

    Values are checked after each operator, ``~``, call and filter; operations that can
    build far more than they are given (repetition, padding widths, replace, join, format)
    are estimated before they run, so that no single step allocates much. Time and memory
    of the render as a whole are watched by :func:`_with_watchdog`.
    """

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals.pop("lipsum", None)  # lorem ipsum of any length: no template needs it
        self.filters["tojson"] = _tojson
        self.filters = {name: _checked_filter(name, fn) for name, fn in self.filters.items()}

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # Jinja returns an undefined value that only fails when used; a chat template has no
        # business touching such attributes at all, so fail at once
        raise jinja2.sandbox.SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} is not allowed"
        )

    def checked_concat(self, parts: Sequence[Any]) -> str:
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
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    _expect(_size(seq, MAX_VALUE_SIZE) * max(n, 0))
            if (
                isinstance(left, int)
                and isinstance(right, int)
                and left.bit_length() + right.bit_length() > MAX_INT_BITS
            ):
                raise _Refused("a chat template built too large a number")
            return _check(operator.mul(left, right))
        if operator_name == "%" and isinstance(left, str):
            _expect(_percent_estimate(left, right))
            return _check(operator.mod(left, right))
        if operator_name == "%":
            return operator.mod(left, right)
        if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            _expect(_size(left, MAX_VALUE_SIZE) + _size(right, MAX_VALUE_SIZE))
        return _check(operator.add(left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_ints(args, kwargs)
        target = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped by Jinja
        owner = getattr(target, "__self__", None)
        name = getattr(target, "__name__", "")
        if isinstance(owner, str):
            if name == "join" and args:
                items = list(args[0])
                _expect(_join_estimate(owner, items))
                args = (items, *args[1:])
            elif name in _METHOD_ESTIMATES:
                _expect(_METHOD_ESTIMATES[name](owner, *args, **kwargs))
        return _check(super().call(__context, __obj, *args, **kwargs))


def _raise(message: str) -> None:
    raise errors.TemplateError(f"chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template with the special-token strings it may refer to."""

    def __init__(
        self, source: str, *, bos_token: str = "", eos_token: str = "", name: str = "model"
    ) -> None:
        self.name = name
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
        try:
            self._template = env.from_string(source)
        except (jinja2.TemplateError, RecursionError, MemoryError, SyntaxError, ValueError) as e:
            # deeply nested expressions overflow the parser's or Python's compiler's stack
            raise errors.TemplateError(f"chat template {name!r} does not compile: {e}") from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise errors.InvalidOptionError("messages must be a list of {'role', 'content'} dicts")
        checked = [_check_message(m, i) for i, m in enumerate(messages)]
        variables = dict(
            messages=checked,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            **extra,
        )
        try:
            return _with_watchdog(lambda: self._render(variables), RENDER_SECONDS, RENDER_MEMORY)
        except _Stopped as e:
            raise errors.TemplateError(f"chat template {self.name!r} {e.args[0]}") from None
        except errors.TemplateError:
            raise
        except jinja2.sandbox.SecurityError as e:
            raise errors.TemplateError(
                f"chat template {self.name!r} broke the sandbox rules: {e}"
            ) from None
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError,
                ZeroDivisionError, OverflowError, RecursionError, MemoryError) as e:  # fmt: skip
            raise errors.TemplateError(
                f"chat template {self.name!r} failed: {type(e).__name__}: {e}"
            ) from None

    def _render(self, variables: dict[str, Any]) -> str:
        out, n = [], 0
        for piece in self._template.generate(**variables):
            n += len(piece)
            if n > MAX_OUTPUT_CHARS:
                raise errors.TemplateError(
                    f"chat template {self.name!r} produced more than {MAX_OUTPUT_CHARS} characters"
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
    loop that emits nothing. The lock makes sure it can only land while ``fn`` still runs
    (or in the few bytecodes right after, still inside this function's try).
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

    watcher = threading.Thread(target=watch, name="chat-template-watchdog", daemon=True)
    watcher.start()
    try:
        return fn()
    except _Stopped:
        raise _Stopped(reason[0] or "was stopped") from None
    finally:
        with lock:
            active[0] = False
        finished.set()


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
