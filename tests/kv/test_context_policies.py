"""Going past the context: the policies' plans, the engines' discard (keys rotated back, the
same floats in both engines), and generation and chat that keep going with flat memory."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from edgeinfer import errors
from edgeinfer.context_policy import ContextPolicy
from edgeinfer.generation import KVSession
from tests.kv.texts import python_help_text


def test_the_plans():
    shift = ContextPolicy("shift", n_keep=10)
    assert shift.discard(100, 1, 100) == (10, 45)  # llama.cpp: half of what follows n_keep
    assert shift.discard(100, 60, 100) == (10, 60)  # at least what the new tokens need
    streaming = ContextPolicy("streaming", n_sink=4)
    assert streaming.discard(256, 1, 256) == (4, 31)  # an eighth of the context at a time
    assert streaming.discard(256, 1, 256, most=20) == (4, 20)
    with pytest.raises(errors.ContextOverflowError, match="can drop only 20"):
        streaming.discard(256, 40, 256, most=20)
    with pytest.raises(errors.ContextOverflowError, match="exceed the context"):
        ContextPolicy().discard(100, 1, 100)
    with pytest.raises(errors.InvalidOptionError, match="unknown context_policy 'h3o'"):
        ContextPolicy("h3o")
    with pytest.raises(errors.InvalidOptionError, match="n_sink must be an integer >= 0"):
        ContextPolicy("streaming", n_sink=-1)
    with pytest.raises(errors.InvalidOptionError, match="leaves too little room"):
        ContextPolicy("shift", n_keep=60).check(100)


@pytest.mark.parametrize("types", [("f32", "f32"), ("f16", "f16"), ("q8_0", "q4_0")], ids="/".join)
def test_discard_is_the_same_in_both_engines(fixture_models, types):
    kv = {"cache_type_k": types[0], "cache_type_v": types[1], "n_ctx": 64}
    tokens = list(range(3, 43))
    with edgeinfer.load(fixture_models["qwen3"], engine="reference", **kv) as ref, \
            edgeinfer.load(fixture_models["qwen3"], engine="native", **kv) as nat:  # fmt: skip
        out = []
        for m in (ref, nat):
            eng = m.backend
            eng.forward(tokens)
            eng.discard(4, 11)
            assert eng.n_past == 29
            out.append(np.stack([eng.forward([t]) for t in (50, 51, 52)]))
    np.testing.assert_array_equal(out[1], out[0])


def test_discarded_keys_are_the_kept_tokens_keys_at_their_new_positions(fixture_models):
    """Rotated back by the dropped count, the first layer's keys (which depend on the token
    and its position alone) are those of the kept tokens evaluated afresh, up to float
    rounding; its values move unchanged. (Deeper layers differ, as in llama.cpp's shift and
    in StreamingLLM: the kept tokens' states once saw the dropped ones.)"""
    tokens = [int(t) for t in np.random.default_rng(5).integers(3, 200, 40)]
    kept = tokens[:4] + tokens[15:]
    opts = {"engine": "reference", "n_ctx": 64, "kv_type": "f32"}
    for arch in ("llama", "gemma3"):  # rotating pairs, and rotating halves (neox)
        with edgeinfer.load(fixture_models[arch], **opts) as m, \
                edgeinfer.load(fixture_models[arch], **opts) as fresh:  # fmt: skip
            m.backend.forward(tokens)
            m.backend.discard(4, 11)
            fresh.backend.forward(kept)
            got, want = m.backend.k_cache[0][:29], fresh.backend.k_cache[0][:29]
            assert not np.array_equal(m.backend.k_cache[0][4], _unrotated(m, tokens)), arch
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
            np.testing.assert_array_equal(m.backend.v_cache[0][:29], fresh.backend.v_cache[0][:29])


def _unrotated(m, tokens):
    """The first layer's key of tokens[15] where it was before the discard."""
    with edgeinfer.load(m.path, engine="reference", n_ctx=64, kv_type="f32") as again:
        again.backend.forward(tokens)
        return again.backend.k_cache[0][15]


def test_bad_discards_are_typed(fixture_models):
    with edgeinfer.load(fixture_models["llama"], engine="native", n_ctx=32) as m:
        m.backend.forward([5, 6, 7, 8])
        for start, count in ((-1, 1), (2, 3), (0, -1)):
            with pytest.raises(errors.InvalidOptionError, match="cannot discard"):
                m.backend.discard(start, count)
    with pytest.raises(errors.InvalidOptionError, match="leaves too little room"):
        edgeinfer.load(fixture_models["llama"], n_ctx=32, context_policy="shift", n_keep=20)


def _flat_generation(path, policy: str, n_ctx: int, rounds: int) -> None:
    with edgeinfer.load(path, engine="native", n_ctx=n_ctx, context_policy=policy) as m:
        stream = m.stream("Once upon a time", max_tokens=rounds * n_ctx, temperature=0)
        memory = set()
        for i, _ in enumerate(stream):
            if i % 64 == 63:
                memory.add(m.backend.memory_bytes)
        assert stream.stats.generated_tokens == rounds * n_ctx
        assert stream.stats.finish_reason == "length"
        assert len(memory) == 1  # the cache never grows past the context
        assert m.backend.n_past <= n_ctx


@pytest.mark.parametrize("policy", ["streaming", "shift"])
def test_generating_8x_the_context(fixture_models, policy):
    _flat_generation(fixture_models["gemma3"], policy, 64, 8)


@pytest.mark.slow
def test_gemma_streams_8x_the_context(gemma_path):
    _flat_generation(gemma_path, "streaming", 128, 8)


def test_run_minus_one_keeps_going_under_a_policy(fixture_models):
    with edgeinfer.load(fixture_models["llama"], n_ctx=32, context_policy="streaming") as m:
        stream = m.stream([5, 6, 7], max_tokens=-1, temperature=0)
        for i, _ in enumerate(stream):
            if i == 200:
                stream.close()
                break
        assert i == 200 and m.backend.n_past <= 32
    with edgeinfer.load(fixture_models["llama"], n_ctx=32) as m:
        done = m.generate([5, 6, 7], max_tokens=-1, temperature=0)
        assert done.finish_reason == "length" and done.stats.generated_tokens <= 32


@pytest.mark.slow
def test_gemma_chat_past_the_context(gemma_path):
    """Turns until the conversation is 3x the context: each turn evaluates only its new
    tokens (the reuse covers the history, dropped tokens included)."""
    words = python_help_text().split()
    with edgeinfer.load(gemma_path, n_ctx=256, context_policy="streaming") as m:
        messages: list[dict[str, str]] = []
        total = 0
        for turn in range(12):
            text = " ".join(words[turn * 40 : turn * 40 + 40])
            messages.append({"role": "user", "content": f"Summarize: {text}"})
            stream = m.chat(messages, stream=True, max_tokens=24, temperature=0)
            reply = "".join(stream)
            prompt = stream.stats.prompt_tokens
            if turn:
                # the new turn's prompt extends what was evaluated, bar the reply's last tokens
                assert stream.stats.cached_tokens >= total - 8, (turn, total)
            total = prompt + stream.stats.generated_tokens
            messages.append({"role": "assistant", "content": reply})
        assert total > 3 * 256
        assert m.backend.n_past <= 256


def test_a_policy_needs_an_engine_that_drops_positions(fixture_models):
    with pytest.raises(errors.InvalidOptionError, match="unknown context_policy"):
        edgeinfer.load(fixture_models["llama"], context_policy="forever")


@pytest.mark.parametrize("policy", ["streaming", "h2o"])
def test_evicting_moves_a_ring_a_block_at_a_time(fixture_models, policy):
    """A drop larger than the window (n_ctx / 8 = 128 positions, window 16) moves the ring's
    rows to blocks it does not hold; with a pool sized for a step of 8 tokens there is no room
    for a second copy of the window, so each source block goes back once read. The logits stay
    those of the engine whose sliding-window layers keep the whole context."""
    opts = {"n_ctx": 1024, "n_batch": 8, "context_policy": policy}
    logits = {}
    for swa_full in (False, True):
        with edgeinfer.load(fixture_models["gemma3"], swa_full=swa_full, **opts) as m:
            assert (m.backend.ring_slack is None) == swa_full
            session = KVSession(m.backend, n_batch=8, policy=m.context_policy)
            out = [session.prefill(list(range(3, 40)))[0]]
            for i in range(1120):
                out.append(session.decode(5 + i % 90))
            logits[swa_full] = np.array(out)
    assert np.array_equal(logits[False], logits[True])
