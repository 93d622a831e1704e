"""Multi-turn chat through the API: the KV cache carries the conversation from turn to turn,
and a reused cache gives exactly what a fresh model gives."""

from __future__ import annotations

import pytest

from edgeinfer import errors
from tests.api.conftest import ARCHS, load

TURNS = ["Hello! Who are you?", "Tell me about the sea.", "Thanks, bye."]


def _converse(model, turns: list[str], **options) -> list:
    messages, replies = [{"role": "system", "content": "Be brief."}], []
    for text in turns:
        messages.append({"role": "user", "content": text})
        reply = model.chat(messages, **options)
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply.text})
    return replies, messages


@pytest.mark.slow
def test_gemma_second_turn_reuses_the_cache_and_matches_a_fresh_model(gemma, gemma_path):
    gemma.reset()
    replies, messages = _converse(gemma, TURNS[:2], max_tokens=8, temperature=0)
    first, second = replies
    assert first.stats.cached_tokens == 0
    first_prompt = gemma.chat_tokens(messages[:2])
    # the whole first prompt, and more, came from the cache
    assert second.stats.cached_tokens >= len(first_prompt)
    assert second.stats.prompt_tokens == len(gemma.chat_tokens(messages[:4]))
    with load(gemma_path, n_ctx=1024) as fresh:
        again = fresh.chat(messages[:4], max_tokens=8, temperature=0)
        assert again.stats.cached_tokens == 0
        assert (again.text, again.tokens) == (second.text, second.tokens)


@pytest.mark.parametrize("arch", ARCHS)
def test_fixture_turns_reuse_the_cache_and_match_fresh_models(fixture_models, arch):
    path = fixture_models[arch]
    with load(path, n_ctx=512) as model:
        replies, messages = _converse(model, TURNS, max_tokens=12, temperature=0.7, seed=11)
        for i, reply in enumerate(replies[1:], start=1):
            previous = model.chat_tokens(messages[: 2 * i])
            assert reply.stats.cached_tokens >= len(previous) - 1, (i, reply.stats)
    for i, reply in enumerate(replies):
        with load(path, n_ctx=512) as fresh:
            again = fresh.chat(messages[: 2 * i + 2], max_tokens=12, temperature=0.7, seed=11)
            assert again.tokens == reply.tokens and again.stats.cached_tokens == 0


def test_streamed_chat(fixture_model):
    model = fixture_model("qwen2")
    messages = [{"role": "user", "content": "Stream please"}]
    stream = model.chat(messages, stream=True, max_tokens=10, temperature=0)
    pieces = list(stream)
    whole = model.chat(messages, max_tokens=10, temperature=0)
    assert "".join(pieces) == stream.text == whole.text
    assert stream.stats.generated_tokens == whole.stats.generated_tokens == 10


def test_reset_forgets_the_conversation(fixture_model):
    model = fixture_model("llama")
    messages = [{"role": "user", "content": "Remember this"}]
    model.chat(messages, max_tokens=4, temperature=0)
    assert model.chat(messages, max_tokens=4, temperature=0).stats.cached_tokens > 0
    model.reset()
    assert model.chat(messages, max_tokens=4, temperature=0).stats.cached_tokens == 0


def test_a_different_conversation_reuses_only_the_common_prefix(fixture_model):
    model = fixture_model("gemma3")
    a = [{"role": "user", "content": "First conversation"}]
    b = [{"role": "user", "content": "Second, unrelated"}]
    model.chat(a, max_tokens=4, temperature=0)
    stats = model.chat(b, max_tokens=4, temperature=0).stats
    ta, tb = model.chat_tokens(a), model.chat_tokens(b)
    common = next(i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y)
    assert stats.cached_tokens == common


def test_conversation_outgrowing_the_context(fixture_model):
    model = fixture_model("qwen3", n_ctx=64)
    messages = []
    with pytest.raises(errors.ContextOverflowError):
        for i in range(40):
            messages.append({"role": "user", "content": f"message number {i} with some words"})
            reply = model.chat(messages, max_tokens=8, temperature=0)
            assert reply.finish_reason in ("length", "stop")
            messages.append({"role": "assistant", "content": reply.text})
    # the model is still usable afterwards
    assert model.chat(messages[-1:], max_tokens=2, temperature=0).stats.generated_tokens >= 1


def test_empty_conversation_is_refused(fixture_model):
    model = fixture_model("qwen2")
    with pytest.raises(errors.InvalidOptionError):
        model.chat([])
