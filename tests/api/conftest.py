"""Helpers for the API tests: scripted samplers and fixture models with chat templates."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]

# The engine under test: by default what users get ("auto": the native engine where it is
# built, else the reference engine). These tests check exact equalities (logits, llama.cpp's
# greedy tokens), which both engines meet; run the suite on one of them with
# EDGEINFER_TEST_ENGINE=reference or =native.
ENGINE = os.environ.get("EDGEINFER_TEST_ENGINE", "auto")


def load(path, **options):
    """``edgeinfer.load`` with the engine under test."""
    import edgeinfer

    options.setdefault("engine", ENGINE)
    return edgeinfer.load(path, **options)


class ScriptedSampler:
    """A sampler that picks the given tokens in order, then ``then`` forever.

    It records every row of logits it was handed, so tests can check what generation saw.
    """

    def __init__(self, tokens: Iterable[int], then: int | None = None) -> None:
        self.script = list(tokens)
        self.then = then
        self.calls = 0
        self.seen: list[np.ndarray] = []

    def __call__(self, logits: np.ndarray, history: list[int]) -> int:
        self.seen.append(np.array(logits, copy=True))
        i = self.calls
        self.calls += 1
        if i < len(self.script):
            return self.script[i]
        if self.then is None:
            raise AssertionError("generation asked for more tokens than the script holds")
        return self.then


def greedy_with_margins(margins: list[float]):
    """A greedy sampler that records the gap between the two best logits at each step."""

    def sample(logits: np.ndarray, history: list[int]) -> int:
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        return int(np.argmax(logits))

    return sample


# An HF-style template written like Qwen2's official one (system default, tools omitted).
QWEN2_STYLE_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant') %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' "
    "+ '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


class _WithTemplate:
    """A fixture vocabulary that also writes ``tokenizer.chat_template``."""

    def __init__(self, vocab, template: str) -> None:
        self.vocab, self.template = vocab, template
        self.tokens = vocab.tokens

    def add_to_writer(self, writer) -> None:
        self.vocab.add_to_writer(writer)
        writer.add_chat_template(self.template)


@pytest.fixture(scope="session")
def qwen2_templated_path(tmp_path_factory) -> Path:
    """The qwen2 fixture architecture and vocabulary, with a Qwen2-style chat template."""
    from tests.fixtures.models import FIXTURES, write_model
    from tests.fixtures.vocab import bpe_vocab

    path = tmp_path_factory.mktemp("templated") / "qwen2-templated.gguf"
    return write_model(
        path, FIXTURES["qwen2"], _WithTemplate(bpe_vocab("qwen2"), QWEN2_STYLE_TEMPLATE)
    )


@pytest.fixture(scope="session")
def gemma(gemma_path):
    """Gemma 3 270M on the engine under test, shared by the tests of a session."""
    with load(gemma_path, n_ctx=1024) as model:
        yield model


@pytest.fixture()
def fixture_model(fixture_models):
    """Opens a fixture model by architecture name; closes whatever it opened."""
    opened = []

    def open_model(arch: str, **options):
        model = load(fixture_models[arch], **options)
        opened.append(model)
        return model

    yield open_model
    for model in opened:
        model.close()
