"""Fuzz target: chat template rendering (edgeinfer.chat.ChatTemplate) on random template
sources, built from a grammar of Jinja constructs, and on raw bytes.

The first byte of an input picks the mode: one in eight inputs is used as the template source
itself (the rest decoded as UTF-8), the others drive a grammar (statements, expressions,
filters, tests, method calls, loops, macros, namespaces, raise_exception ...) and the
conversation through :class:`atheris.FuzzedDataProvider`. Compiling and rendering may pass or
raise a TemplateError; anything else is a finding (see harness.py), and so is a prompt
that differs from plain Jinja's rendering of the same template.

    python -m tests.fuzz.fuzz_template --runs 1000000 --corpus DIR --artifacts DIR
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import atheris
import jinja2.compiler
import jinja2.exceptions
import jinja2.nodes
import jinja2.sandbox

from tests.fuzz import harness

with atheris.instrument_imports(include=["edgeinfer"]):
    from edgeinfer import chat

RENDER_SECONDS = 1.0  # per compile and per render: hostile loops end in TemplateError sooner
MAX_DEPTH = 4  # nesting of statements and expressions the grammar builds
RAW_MODE = 8  # first byte % RAW_MODE == 0: the rest of the input is the template source

ROLES = ["system", "user", "assistant", "tool", "ipython", "developer", ""]
NAMES = ["x", "y", "content", "message", "item", "m", "ns", "loop", "tools", "undefined_name"]
FILTERS = sorted(chat._Sandbox().filters)
TESTS = ["defined", "undefined", "none", "string", "mapping", "iterable", "number", "integer",
         "float", "sequence", "callable", "sameas", "escaped", "lower", "upper", "true",
         "false", "boolean", "divisibleby", "even", "odd", "eq", "ne", "lt", "gt",
         "in"]  # fmt: skip
METHODS = ["strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith",
           "endswith", "replace", "upper", "lower", "title", "capitalize", "center", "ljust",
           "rjust", "zfill", "format", "format_map", "join", "translate", "maketrans",
           "expandtabs", "encode", "decode", "hex", "count", "find", "index", "partition",
           "casefold", "swapcase", "removeprefix", "items", "keys", "values", "get", "copy",
           "fromkeys", "append", "pop", "update", "to_bytes", "bit_length", "isdigit"]  # fmt: skip
OPERATORS = ["+", "-", "*", "/", "//", "%", "**", "~", "and", "or", "==", "!=", "<", ">",
             "<=", ">=", "in", "not in"]  # fmt: skip
TEXTS = ["", " ", "\n", "<|im_start|>", "<|im_end|>", "<start_of_turn>", "[INST]", "\t", "a",
         "{}", "{0}", "{:>{}}", "%s", "%*d", "%r", "&<>\"'", "nan", "inf", "1e308", "é", "😀",
         "\x00", "\u2028", "ΐ", "http://a.b", "9" * 12]  # fmt: skip
INTS = [0, 1, 2, 3, -1, 7, 64, 255, 4096, 100000, 4194304, 2**31, 10**12]
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}
NONDETERMINISTIC = ("random", "strftime_now", "cycler", "joiner")  # differ between renders
# a printed object whose repr holds its address (a filter's generator): equal up to the address
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


class _Grammar:
    """Builds a template source from the fuzzer's bytes, one production per choice."""

    def __init__(self, fdp: atheris.FuzzedDataProvider) -> None:
        self.fdp = fdp

    def pick(self, options: list[Any]) -> Any:
        return options[self.fdp.ConsumeIntInRange(0, len(options) - 1)]

    def text(self) -> str:
        if self.fdp.ConsumeBool():
            return self.pick(TEXTS)
        return self.fdp.ConsumeUnicodeNoSurrogates(self.fdp.ConsumeIntInRange(0, 12))

    def string_literal(self) -> str:
        return repr(self.text())

    def literal(self, depth: int) -> str:
        kind = self.fdp.ConsumeIntInRange(0, 7)
        if kind == 0:
            return str(self.pick(INTS))
        if kind == 1:
            return self.pick(["1.5", "0.0", "-2.25", "1e300", "'nan'|float", "'inf'|float"])
        if kind == 2:
            return self.pick(["none", "true", "false", "None", "True"])
        if kind == 3 and depth > 0:
            return "[" + ", ".join(self.expr(depth - 1) for _ in range(self.count())) + "]"
        if kind == 4 and depth > 0:
            items = (
                f"{self.string_literal()}: {self.expr(depth - 1)}" for _ in range(self.count())
            )
            return "{" + ", ".join(items) + "}"
        if kind == 5 and depth > 0:
            return "(" + "".join(self.expr(depth - 1) + ", " for _ in range(self.count())) + ")"
        return self.string_literal()

    def count(self) -> int:
        return self.fdp.ConsumeIntInRange(0, 3)

    def variable(self, depth: int) -> str:
        kind = self.fdp.ConsumeIntInRange(0, 9)
        if kind == 0:
            index = self.pick(["0", "-1", "1", "loop.index0", "i"])
            key = self.pick(["'role'", "'content'", "'tool_calls'", "0"])
            return f"messages[{index}][{key}]"
        if kind == 1:
            return "messages" + self.pick(["", "[1:]", "[::-1]", "|length", "[0]"])
        if kind == 2:
            return "loop." + self.pick(["index", "index0", "first", "last", "length", "revindex",
                                        "previtem", "nextitem", "depth"])  # fmt: skip
        if kind == 3:
            return self.pick(["bos_token", "eos_token", "add_generation_prompt", "tools",
                              "date_string", "ns.x", "ns.s"])  # fmt: skip
        if kind == 4 and depth > 0:
            return f"{self.expr(depth - 1)}[{self.expr(depth - 1)}]"
        if kind == 5 and depth > 0:
            parts = [
                self.pick(["", "1", "-1", "i"]) for _ in range(self.fdp.ConsumeIntInRange(1, 3))
            ]
            return f"{self.expr(depth - 1)}[{':'.join(parts)}]"
        if kind == 6 and depth > 0:
            return f"{self.expr(depth - 1)}.{self.pick(['role', 'content', 'x', 'items'])}"
        return self.pick(NAMES)

    def call(self, depth: int) -> str:
        args = ", ".join(self.expr(depth - 1) for _ in range(self.count()))
        kind = self.fdp.ConsumeIntInRange(0, 7)
        if kind == 0:
            return f"range({args})"
        if kind == 1:
            return f"namespace(x={self.expr(depth - 1)}, s={self.expr(depth - 1)})"
        if kind == 2:
            return f"dict(a={self.expr(depth - 1)})"
        if kind == 3:
            return f"raise_exception({args})"
        if kind == 4:
            return self.pick(["cycler", "joiner", "strftime_now", "m", "caller", "loop.cycle"]) + (
                f"({args})"
            )
        return f"({self.expr(depth - 1)}).{self.pick(METHODS)}({args})"

    def filtered(self, depth: int) -> str:
        value = self.expr(depth - 1)
        name = self.pick(FILTERS)
        if self.fdp.ConsumeBool():
            return f"{value}|{name}"
        args = [self.expr(depth - 1) for _ in range(self.count())]
        if self.fdp.ConsumeBool():
            args.append(f"{self.pick(['attribute', 'indent', 'start', 'd', 'end'])}={self.expr(0)}")
        return f"{value}|{name}({', '.join(args)})"

    def expr(self, depth: int) -> str:
        if depth <= 0:
            return self.literal(0) if self.fdp.ConsumeBool() else self.variable(0)
        kind = self.fdp.ConsumeIntInRange(0, 9)
        if kind == 0:
            return f"({self.expr(depth - 1)} {self.pick(OPERATORS)} {self.expr(depth - 1)})"
        if kind == 1:
            return f"{self.pick(['not ', '-', '+'])}{self.expr(depth - 1)}"
        if kind == 2:
            return self.filtered(depth)
        if kind == 3:
            test = self.pick(TESTS)
            arg = f"({self.expr(depth - 1)})" if self.fdp.ConsumeBool() else ""
            return f"({self.expr(depth - 1)} is {self.pick(['', 'not '])}{test}{arg})"
        if kind == 4:
            return self.call(depth)
        if kind == 5:
            cond, a, b = self.expr(depth - 1), self.expr(depth - 1), self.expr(depth - 1)
            return f"({a} if {cond} else {b})"
        if kind in (6, 7):
            return self.variable(depth)
        return self.literal(depth)

    def body(self, depth: int) -> str:
        return "".join(self.statement(depth) for _ in range(self.fdp.ConsumeIntInRange(0, 3)))

    def tag(self, inner: str) -> str:
        left, right = self.pick(["", "-", "+"]), self.pick(["", "-"])
        return "{%" + left + " " + inner + " " + right + "%}"

    def statement(self, depth: int) -> str:
        kind = self.fdp.ConsumeIntInRange(0, 13 if depth > 0 else 2)
        if kind == 0:
            return self.text()
        if kind in (1, 2):
            return "{{" + self.pick(["", "-"]) + " " + self.expr(depth) + " " + "}}"
        d = depth - 1
        if kind == 3:
            out = self.tag(f"if {self.expr(d)}") + self.body(d)
            if self.fdp.ConsumeBool():
                out += self.tag(f"elif {self.expr(d)}") + self.body(d)
            if self.fdp.ConsumeBool():
                out += self.tag("else") + self.body(d)
            return out + self.tag("endif")
        if kind == 4:
            target = self.pick(["message", "m", "i", "x, y", "(k, v)"])
            extra = self.pick(["", f" if {self.expr(d)}", " recursive"])
            control = self.pick(["", self.tag("break"), self.tag("continue")])
            out = self.tag(f"for {target} in {self.expr(d)}{extra}") + self.body(d) + control
            if self.fdp.ConsumeBool():
                out += self.tag("else") + self.body(d)
            return out + self.tag("endfor")
        if kind == 5:
            return self.tag(
                f"set {self.pick(['x', 'y', 'ns.x', 'ns.s', 'messages'])} = {self.expr(d)}"
            )
        if kind == 6:
            return self.tag(f"set {self.pick(['x', 'y'])}") + self.body(d) + self.tag("endset")
        if kind == 7:
            params = self.pick(["", "a", "a, b=1", "a='x', b=[]"])
            return self.tag(f"macro m({params})") + self.body(d) + self.tag("endmacro")
        if kind == 8:
            return self.tag(f"call m({self.expr(d)})") + self.body(d) + self.tag("endcall")
        if kind == 9:
            return self.tag(f"filter {self.pick(FILTERS)}") + self.body(d) + self.tag("endfilter")
        if kind == 10:
            return self.tag(f"with x = {self.expr(d)}") + self.body(d) + self.tag("endwith")
        if kind == 11:
            return self.tag("set ns = namespace(x=0, s='')")
        if kind == 12:
            return "{# " + self.text().replace("#}", "") + " #}"
        return self.tag("raw") + self.text().replace("{%", "") + self.tag("endraw")


def _messages(fdp: atheris.FuzzedDataProvider) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(fdp.ConsumeIntInRange(0, 5)):
        role = ROLES[fdp.ConsumeIntInRange(0, len(ROLES) - 1)]
        message: dict[str, Any] = {
            "role": role or fdp.ConsumeUnicodeNoSurrogates(6),
            "content": fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 40)),
        }
        if fdp.ConsumeIntInRange(0, 7) == 0:
            call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            message["tool_calls"] = [call]
        out.append(message)
    return out


class _UnfoldedCodeGenerator(jinja2.compiler.CodeGenerator):
    """Jinja's code generator without constant folding, which would evaluate at compile time
    what the template may never run (a macro nobody calls), with no caps: folding changes
    no output, only when the work is done."""

    def _output_child_to_const(self, node: Any, frame: Any, finalize: Any) -> str:
        if not isinstance(node, (jinja2.nodes.TemplateData, jinja2.nodes.Const)):
            raise jinja2.nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)


class _ReferenceEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    code_generator_class = _UnfoldedCodeGenerator


def _reference(source: str, messages: list[dict[str, Any]], **options: Any) -> str:
    """How transformers' apply_chat_template renders: Jinja's own immutable sandbox."""

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = _ReferenceEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols"],
        optimized=False,
    )
    env.globals.update(raise_exception=raise_exception, strftime_now=chat._strftime_now)
    env.filters["tojson"] = chat._tojson
    options.pop("max_chars", None)
    return env.from_string(source).render(messages=messages, **options, **TOKENS)


def _render(source: str, messages: list[dict[str, Any]], **options: Any) -> None:
    """Renders in the sandbox; a template the sandbox renders must render the same in plain
    Jinja (the caps refuse, they never change what a template means)."""
    options.setdefault("add_generation_prompt", True)
    template = chat.ChatTemplate(source, **TOKENS)
    ours = template.render(messages, **options)
    if any(word in source for word in NONDETERMINISTIC):
        return
    try:
        reference = _reference(source, messages, **options)
    except NameError:
        return  # Jinja folds nan and inf into names its generated code lacks; we do not
    if _ADDRESS.sub(" at 0x>", ours) != _ADDRESS.sub(" at 0x>", reference):
        raise AssertionError(f"the sandbox rendered {ours[:200]!r}, Jinja {reference[:200]!r}")


def one_input(data: bytes) -> None:
    saved, chat.RENDER_SECONDS = chat.RENDER_SECONDS, RENDER_SECONDS
    try:
        _one_input(data)
    finally:
        chat.RENDER_SECONDS = saved  # other tests in the same process keep the real budget


def _one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] % RAW_MODE == 0:
        conversation = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
        ]
        _render(data[1:].decode("utf-8", "replace"), conversation)
        return
    fdp = atheris.FuzzedDataProvider(data[1:])
    source = _Grammar(fdp).body(MAX_DEPTH)
    messages = _messages(fdp)
    tools = [{"name": "get_weather", "parameters": {"city": {"type": "string"}}}]
    _render(
        source,
        messages,
        add_generation_prompt=fdp.ConsumeBool(),
        tools=tools if fdp.ConsumeBool() else None,
        max_chars=fdp.ConsumeIntInRange(0, 1 << 16) if fdp.ConsumeBool() else None,
    )


def _installed_templates() -> Iterator[str]:
    """Chat templates that installed packages ship as string constants in their sources
    (llama-cpp-python's chat formats, transformers' processors); none if they are absent."""
    files: list[Path] = []
    for package, patterns in [
        ("llama_cpp", ["llama_chat_format.py"]),
        ("transformers", ["models/*/processing_*.py", "utils/chat_template_utils.py"]),
    ]:
        spec = importlib.util.find_spec(package)  # finds the folder without importing it
        if spec is not None and spec.submodule_search_locations:
            root = Path(next(iter(spec.submodule_search_locations)))
            files += [p for pattern in patterns for p in sorted(root.glob(pattern))]
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if "{%" not in text or "message" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            value = getattr(node, "value", None)
            if (
                isinstance(node, ast.Constant)
                and isinstance(value, str)
                and "{%" in value
                and "message" in value
                and len(value) < 20_000
            ):
                yield value


def seeds() -> Iterator[bytes]:
    """Raw-mode inputs of the built-in and installed chat templates, and a few grammar-mode
    inputs."""
    for source, _ in chat.BUILTIN_TEMPLATES.values():
        yield b"\x00" + source.encode()
    for source in _installed_templates():
        yield b"\x00" + source.encode()
    for i in range(1, 8):
        yield bytes([i]) + bytes(range(i * 13, i * 13 + 120))


if __name__ == "__main__":
    harness.main(one_input, seeds)
