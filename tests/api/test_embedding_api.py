"""What apps that embed edgeinfer need: asyncio generation (through the batcher, cancelled
with its task), a load progress callback, the memory check before load, the repetition
guard, and chat defaults that suit a base model."""

from __future__ import annotations

import asyncio
import warnings

import pytest

from edgeinfer import errors, system
from edgeinfer.conversation import BASE_REPLY_TOKENS, Conversation, instruction_tuned
from edgeinfer.repetition import RepetitionGuard
from tests.api.conftest import load

HAIKU = [{"role": "user", "content": "Write a haiku about the sea."}]


# --- asyncio ---------------------------------------------------------------------------------


def test_agenerate_and_astream_equal_generate(gemma):
    expected = gemma.generate("The capital of France is", max_tokens=12, temperature=0)

    async def main():
        done = await gemma.agenerate("The capital of France is", max_tokens=12, temperature=0)
        pieces = [p async for p in gemma.astream("The capital of France is", max_tokens=12,
                                                 temperature=0)]  # fmt: skip
        chat = await gemma.achat(HAIKU, max_tokens=6, temperature=0)
        return done, "".join(pieces), chat

    done, streamed, chat = asyncio.run(main())
    assert done.text == streamed == expected.text and done.tokens == expected.tokens
    assert chat.text == gemma.chat(HAIKU, max_tokens=6, temperature=0).text


def test_cancelling_the_task_cancels_the_generation_mid_stream(gemma):
    async def main():
        stream = gemma.astream("Once upon a time", max_tokens=2000, temperature=0)
        pieces: list[str] = []

        async def read():
            async for piece in stream:
                pieces.append(piece)

        task = asyncio.create_task(read())
        while len(pieces) < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the loop was never blocked meanwhile, and the model serves the next call
        after = await gemma.agenerate("Hello", max_tokens=4, temperature=0)
        return stream, after

    stream, after = asyncio.run(main())
    assert stream.finish_reason == "cancelled" and 3 <= len(stream.tokens) < 100
    assert after.text == gemma.generate("Hello", max_tokens=4, temperature=0).text

    async def cancel_agenerate():
        task = asyncio.create_task(gemma.agenerate("Once upon a time", max_tokens=2000))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_agenerate())
    assert gemma.generate("Hello", max_tokens=4, temperature=0).text == after.text


# --- load: progress and the memory check ------------------------------------------------------


def test_load_reports_progress_and_can_be_cancelled(gemma_path):
    seen: list[float] = []
    with load(gemma_path, progress=seen.append) as model:
        assert model.engine
    assert seen[0] == 0.0 and seen[-1] == 1.0 and seen == sorted(seen)
    with pytest.raises(errors.CancelledError):
        load(gemma_path, progress=lambda f: f < 0.5)
    with pytest.raises(errors.InvalidOptionError):
        load(gemma_path, progress="yes")


def test_memory_check_against_a_small_ram_figure(gemma_path, monkeypatch):
    with load(gemma_path) as model:
        committed = model.backend.committed_bytes
        weights = model.backend.weight_copy_bytes
    assert committed > weights > 0  # the copies are committed, with the pool and buffers
    monkeypatch.setattr(system, "available_memory", lambda: committed // 2)
    with pytest.raises(errors.InsufficientMemoryError) as refused:
        load(gemma_path)
    e = refused.value
    assert isinstance(e, errors.OutOfMemoryError)
    assert e.committed_bytes == committed and e.available_bytes == committed // 2
    assert f"{committed / 2**20:.0f} MiB" in str(e)
    # a larger KV budget commits more: refused by the same figure that let the default in
    monkeypatch.setattr(system, "available_memory", lambda: 64 << 30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load(gemma_path).close()  # fits with room to spare: no warning
    monkeypatch.setattr(system, "available_memory", lambda: committed + 1)
    with pytest.warns(errors.MemoryPressureWarning, match="page the weights"):
        load(gemma_path).close()  # fits, but the mapped weights beside it do not
    monkeypatch.setattr(system, "available_memory", lambda: 1 << 20)
    load(gemma_path, memory_check=False).close()  # the caller knows better
    with pytest.raises(errors.InsufficientMemoryError):
        load(gemma_path, kv_budget="64GiB", memory_check=True)


# --- the repetition guard and base-model chat ------------------------------------------------


def test_repetition_guard_stops_a_looping_greedy_reply(gemma):
    looping = gemma.chat(HAIKU, max_tokens=200, temperature=0)
    assert looping.finish_reason == "length"  # the loop of the report: to the end
    guarded = gemma.chat(HAIKU, max_tokens=200, temperature=0, repetition_guard=True)
    assert guarded.finish_reason == "repetition"
    assert guarded.tokens == looping.tokens[: len(guarded.tokens)] and len(guarded.tokens) < 60


def test_repetition_guard_on_submitted_requests(gemma_path):
    with load(gemma_path, n_parallel=1) as model:
        guarded = model.chat(HAIKU, max_tokens=200, temperature=0, repetition_guard=True)
        request = model.submit(model.chat_tokens(HAIKU), max_tokens=200, temperature=0,
                               repetition_guard=True).result()  # fmt: skip
    assert request.finish_reason == "repetition" and request.tokens == guarded.tokens


def test_repetition_guard_lets_a_normal_reply_run(gemma):
    prompt = "def fibonacci(n):"
    plain = gemma.generate(prompt, max_tokens=128, temperature=0)
    guarded = gemma.generate(prompt, max_tokens=128, temperature=0, repetition_guard=True)
    assert guarded.finish_reason == plain.finish_reason == "length"
    assert guarded.text == plain.text


def test_repetition_guard_rule():
    guard = RepetitionGuard()
    sentence = list(range(10))
    assert not guard.loops(sentence * 2 + [0])
    assert guard.loops(sentence * 3)  # a sentence said for the third time
    assert not guard.loops([7] * 23) and guard.loops([7] * 24)  # short n-grams need more
    assert not guard.loops(list(range(200)))
    with pytest.raises(errors.InvalidOptionError):
        RepetitionGuard(min_repeats=1)


def test_base_model_chat_defaults(gemma, qwen2_templated_path):
    tuned, why = instruction_tuned(gemma.metadata)
    assert not tuned and "no chat template" in why
    conversation = Conversation(gemma, temperature=0)
    d = conversation.defaults
    assert d.template == "transcript" and d.max_tokens == BASE_REPLY_TOKENS
    assert d.repetition_guard and "\nUser:" in d.stop and "base model" in d.notice("Gemma")
    stream = conversation.send("What is the capital of France?")
    reply = "".join(stream)
    assert stream.finish_reason == "stop" and reply.strip()  # it ended at the next turn
    conversation.finish(stream)
    assert conversation.messages[-1] == {"role": "assistant", "content": reply.strip()}
    with load(qwen2_templated_path) as model:
        tuned = Conversation(model).defaults
        assert tuned.instruction_tuned and tuned.notice("x") is None and tuned.template == "model"
    for key, value in (("general.finetune", "it"), ("general.name", "Llama 3 8B Instruct"),
                       ("general.tags", ["chat"])):  # fmt: skip
        assert instruction_tuned({key: value})[0], key
    assert not instruction_tuned({"general.name": "Gemma 3 270m", "general.finetune": "base"})[0]
