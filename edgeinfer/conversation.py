"""A chat as an app holds it: a system prompt, the messages so far, and the defaults that
suit the model (the terminal chat and the desktop app both talk through it).

Whether a model was instruction-tuned decides those defaults. An instruction-tuned model
(its file has a chat template, or its metadata names it "it", "instruct", "chat" ...) talks
through its own template. A base model does not follow instructions, and in special tokens
it never learned it falls into loops at once (Gemma 3 270M answered "Write a haiku about
the sea." with one line repeated for 436 tokens). So a base model talks through a plain
transcript ("User: ... / Assistant:"), which it continues far better; its reply ends where
it starts the user's next turn, after :data:`BASE_REPLY_TOKENS`, or once it loops (the
repetition guard, on for both kinds here; the plain API leaves it off).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeinfer import errors
from edgeinfer.chat import TRANSCRIPT_TEMPLATE, TRANSCRIPT_TURN, ChatTemplate

if TYPE_CHECKING:
    from edgeinfer.api import Model
    from edgeinfer.text_stream import TextStream

BASE_REPLY_TOKENS = 256  # a base model's reply is cut here: it rarely ends one by itself
REPLY_TOKENS = 1024
# words of general.finetune, general.name or general.basename that mark a tuned model
TUNED_WORDS = frozenset({"it", "instruct", "chat", "sft", "dpo", "rlhf", "assistant"})
TUNED_TAGS = frozenset({"instruct", "chat", "conversational"})
ROLES = ("system", "user", "assistant")


def instruction_tuned(metadata: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a model's metadata says it was tuned to follow instructions, and why."""
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str) and template.strip():
        return True, "its file has a chat template"
    for key in ("general.finetune", "general.name", "general.basename"):
        value = metadata.get(key)
        if isinstance(value, str) and TUNED_WORDS & set(re.split(r"[^a-z0-9]+", value.lower())):
            return True, f"its metadata names it {value!r} ({key})"
    tags = metadata.get("general.tags")
    tuned_tags = TUNED_TAGS & {str(t).lower() for t in tags} if isinstance(tags, list) else set()
    if tuned_tags:
        return True, f"its metadata tags it {sorted(tuned_tags)}"
    return False, "its file has no chat template and its metadata no instruction-tuned marker"


@dataclass(frozen=True)
class ChatDefaults:
    """What a chat with a model starts from (each can be overridden)."""

    instruction_tuned: bool
    why: str
    template: str  # the template's name
    max_tokens: int
    stop: tuple[str, ...]
    repetition_guard: bool = True

    def notice(self, name: str) -> str | None:
        """What to tell a user starting a chat with a base model (None for a tuned one)."""
        if self.instruction_tuned:
            return None
        return (
            f"{name} is a base model ({self.why}): it continues text rather than follows "
            "instructions, so expect short, loose answers. The chat writes the conversation "
            f"as a plain transcript; a reply ends at the next 'User:' turn, after "
            f"{self.max_tokens} tokens, or when it starts repeating itself."
        )

    def describe(self) -> str:
        """One line for /stats."""
        kind = "instruction-tuned" if self.instruction_tuned else "base model"
        stops = ", ".join(repr(s) for s in self.stop) or "none"
        guard = "on" if self.repetition_guard else "off"
        return (
            f"{kind} ({self.why}); template {self.template}, replies up to {self.max_tokens} "
            f"tokens, stop strings {stops}, repetition guard {guard}"
        )


def chat_defaults(model: Model) -> ChatDefaults:
    tuned, why = instruction_tuned(model.metadata)
    if tuned:
        return ChatDefaults(True, why, model.chat_template.name, REPLY_TOKENS, ())
    return ChatDefaults(False, why, "transcript", BASE_REPLY_TOKENS, (TRANSCRIPT_TURN,))


class Conversation:
    """A conversation with ``model``: ``send(text)`` streams the reply; ``finish(stream)``
    records it (what came, when it was stopped early). Options given here or to ``send``
    (max_tokens, stop, repetition_guard, the sampling fields) override the defaults; stop
    strings add to the default ones. Not thread-safe: one thread (an app's worker) drives it.
    """

    def __init__(
        self,
        model: Model,
        *,
        system: str | None = None,
        messages: Sequence[Mapping[str, Any]] = (),
        **options: Any,
    ) -> None:
        self.model = model
        self.defaults = chat_defaults(model)
        self.system = system
        self.messages: list[dict[str, str]] = [_message(m, i) for i, m in enumerate(messages)]
        self.options = options
        self._template = (
            model.chat_template
            if self.defaults.instruction_tuned
            else ChatTemplate(TRANSCRIPT_TEMPLATE, name="transcript")
        )

    def prompt_tokens(self) -> list[int]:
        """The tokens of the conversation so far, ready for the assistant's turn."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return self.model.chat_tokens(system + self.messages, template=self._template)

    def send(self, text: str, **options: Any) -> TextStream:
        """Adds the user's ``text`` and returns the reply's stream; on an error (the
        conversation no longer fits the context, a bad option) the text is taken back."""
        if not isinstance(text, str) or not text.strip():
            raise errors.InvalidOptionError("a message must be non-empty text")
        self.messages.append({"role": "user", "content": text})
        try:
            return self.model.stream(self.prompt_tokens(), **self._options(options))
        except BaseException:
            self.messages.pop()
            raise

    def finish(self, stream: TextStream) -> None:
        """Records the reply ``stream`` gave (all of it, or what came before it was stopped)."""
        self.messages.append({"role": "assistant", "content": stream.text.strip()})

    def retract(self) -> None:
        """Takes back the last user message (its reply failed, or was stopped before any
        text came)."""
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()

    def reset(self) -> None:
        """Forgets the messages (the system prompt stays) and the model's cached context."""
        self.messages.clear()
        self.model.reset()

    def to_dict(self) -> dict[str, Any]:
        return {"system": self.system, "messages": [dict(m) for m in self.messages]}

    def _options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        merged = {
            "max_tokens": self.defaults.max_tokens,
            "repetition_guard": self.defaults.repetition_guard,
            **self.options,
            **given,
        }
        extra = merged.get("stop", ())
        extra = [extra] if isinstance(extra, str) else list(extra)
        merged["stop"] = list(self.defaults.stop) + [
            s for s in extra if s not in self.defaults.stop
        ]
        return merged


def _message(m: Any, i: int) -> dict[str, str]:
    if (
        not isinstance(m, Mapping)
        or m.get("role") not in ROLES
        or not isinstance(m.get("content"), str)
    ):
        raise errors.InvalidOptionError(
            f"message {i} must be a {{'role': one of {ROLES}, 'content': text}} dict"
        )
    return {"role": m["role"], "content": m["content"]}
