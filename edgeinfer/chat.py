"""Chat templates: the model's own Jinja template, rendered in a sandbox, or a built-in one.

A template comes from the model file, which is untrusted: it renders in Jinja's immutable
sandbox (no attribute access to Python internals, no file system, no imports), with caps
on the size of what it builds, and every failure becomes a :class:`TemplateError`.
"""

from __future__ import annotations

import ctypes
import datetime
import operator
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.sandbox

from edgeinfer import errors

MAX_OUTPUT_CHARS = 4 << 20  # a rendered prompt larger than this is an attack, not a chat
MAX_SEQUENCE_LEN = 1 << 20  # cap on strings and lists built by * and + inside a template
RENDER_SECONDS = 5.0  # a template still rendering after this is stopped (nested loops)

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

LLAMA2_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(system='') -%}
{%- for m in messages -%}
{%- if m['role'] == 'system' -%}{%- set ns.system = '<<SYS>>\n' + m['content'] + '\n<</SYS>>\n\n' -%}
{%- elif m['role'] == 'user' -%}[INST] {{ ns.system }}{{ m['content'] | trim }} [/INST]{%- set ns.system = '' -%}
{%- else -%} {{ m['content'] | trim }} {{ eos_token }}{{ bos_token }}
{%- endif -%}
{%- endfor -%}"""


def builtin_template(arch: str, vocab: set[str] | Mapping[str, int]) -> tuple[str, str]:
    """(name, template) of the built-in template that fits a model without one."""
    if "<start_of_turn>" in vocab and "<end_of_turn>" in vocab:
        return "gemma", GEMMA_TEMPLATE
    if "<|start_header_id|>" in vocab and "<|eot_id|>" in vocab:
        return "llama3", LLAMA3_TEMPLATE
    if "<|im_start|>" in vocab and "<|im_end|>" in vocab or arch in ("qwen2", "qwen3"):
        return "chatml", CHATML_TEMPLATE
    return "llama2", LLAMA2_TEMPLATE


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Immutable sandbox that also bounds the size of strings and lists a template builds."""

    intercepted_binops = frozenset({"*", "+", "**"})

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "**":
            if isinstance(right, (int, float)) and abs(right) > 64:
                raise jinja2.sandbox.SecurityError("exponent too large in a chat template")
            return operator.pow(left, right)
        if operator_name == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    if len(seq) * max(n, 0) > MAX_SEQUENCE_LEN:
                        raise jinja2.sandbox.SecurityError("a chat template built too large a value")
            return operator.mul(left, right)
        result = operator.add(left, right)
        if isinstance(result, (str, list, tuple)) and len(result) > MAX_SEQUENCE_LEN:
            raise jinja2.sandbox.SecurityError("a chat template built too large a value")
        return result


def _raise(message: str) -> None:
    raise errors.TemplateError(f"chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template with the special-token strings it may refer to."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", name: str = "model") -> None:
        self.name = name
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise errors.TemplateError(f"chat template {name!r} does not compile: {e}") from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        checked = [_check_message(m, i) for i, m in enumerate(messages)]
        variables = dict(
            messages=checked,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            **extra,
        )
        try:
            out = _with_deadline(lambda: self._template.render(**variables), RENDER_SECONDS)
        except _RenderTimeout:
            raise errors.TemplateError(
                f"chat template {self.name!r} ran longer than {RENDER_SECONDS:g} s"
            ) from None
        except errors.TemplateError:
            raise
        except jinja2.sandbox.SecurityError as e:
            raise errors.TemplateError(f"chat template {self.name!r} broke the sandbox rules: {e}") from None
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError,
                ZeroDivisionError, OverflowError, RecursionError, MemoryError) as e:  # fmt: skip
            raise errors.TemplateError(
                f"chat template {self.name!r} failed: {type(e).__name__}: {e}"
            ) from None
        if len(out) > MAX_OUTPUT_CHARS:
            raise errors.TemplateError(f"chat template {self.name!r} produced {len(out)} characters")
        return out


class _RenderTimeout(BaseException):
    """Injected into a render that outlives its deadline (BaseException: templates cannot catch it)."""


def _with_deadline(fn: Any, seconds: float) -> Any:
    """Runs ``fn`` in this thread; past ``seconds`` a _RenderTimeout is raised inside it.

    Jinja compiles templates to Python bytecode, so an asynchronous exception stops even a
    loop that emits nothing. The lock makes sure it can only land while ``fn`` still runs
    (or in the few bytecodes right after, still inside this function's try).
    """
    lock = threading.Lock()
    active = [True]
    tid = threading.get_ident()

    def fire() -> None:
        with lock:
            if active[0]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(tid), ctypes.py_object(_RenderTimeout)
                )

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        return fn()
    finally:
        with lock:
            active[0] = False
        timer.cancel()


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
