"""The threading contract (see edgeinfer.api.Model): calls from several threads queue and
run one at a time; abandoned streams, cancel() and close() never wedge or crash the model.

Timeouts here detect hangs; they are generous and are not speed bars."""

from __future__ import annotations

import gc
import os
import random
import threading
import time

import numpy as np
import pytest

from edgeinfer import errors

HANG = 60.0  # seconds after which a call counts as hung
STORM_SECONDS = float(os.environ.get("EDGEINFER_THREAD_STORM_SECONDS", "30"))


def in_thread(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:  # reported to the test
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def slow(word: int, seconds: float = 0.02):
    def sampler(logits, history):
        time.sleep(seconds)
        return word

    return sampler


def test_an_abandoned_stream_does_not_block_another_thread(fixture_model):
    """The report: read one piece of a stream, drop it; generate() elsewhere never returned."""
    model = fixture_model("llama")
    expected = model.generate("Other", max_tokens=4, temperature=0).tokens
    left = model.stream("Hello", max_tokens=50, temperature=0)
    next(left)  # then never read again, but still referenced
    thread, result = in_thread(model.generate, "Other", max_tokens=4, temperature=0)
    thread.join(HANG)
    assert not thread.is_alive() and result["value"].tokens == expected


def test_a_garbage_collected_stream_frees_the_model_at_once(fixture_model):
    model = fixture_model("llama")
    model._turns.idle_s = HANG * 10  # only the collection can free it here
    left = model.stream("Hello", max_tokens=50, temperature=0)
    next(left)
    thread, result = in_thread(model.generate, "Other", max_tokens=3, temperature=0)
    time.sleep(0.3)
    assert thread.is_alive()  # the stream still holds its turn: it may be read again
    del left
    gc.collect()
    thread.join(HANG)
    assert not thread.is_alive() and result["value"].stats.generated_tokens == 3


def test_calls_during_logits_and_reset_queue(fixture_model):
    """The report: a call while another thread was inside logits() or reset() failed with
    AttributeError in the busy marker."""
    model = fixture_model("qwen2")
    tokens = model.tokenize("a fairly long text " * 8)
    expected = model.logits(tokens)
    inside = threading.Event()
    engine = model.backend
    forward, truncate = engine.forward, engine.truncate

    def slowly(fn):
        def wrapped(*args, **kwargs):
            inside.set()
            time.sleep(0.2)
            return fn(*args, **kwargs)

        return wrapped

    engine.forward, engine.truncate = slowly(forward), slowly(truncate)  # type: ignore[method-assign]
    try:
        for first in (lambda: model.logits(tokens), model.reset):
            inside.clear()
            a, ra = in_thread(first)
            assert inside.wait(HANG)
            b, rb = in_thread(model.logits, tokens)
            c, rc = in_thread(model.generate, "x", max_tokens=2, temperature=0)
            for t in (a, b, c):
                t.join(HANG)
                assert not t.is_alive()
            assert "error" not in ra and "error" not in rb and "error" not in rc, (ra, rb, rc)
            np.testing.assert_array_equal(rb["value"], expected)
    finally:
        engine.forward, engine.truncate = forward, truncate  # type: ignore[method-assign]


def test_cancel_releases_a_waiting_caller_within_one_step(fixture_model):
    model = fixture_model("gemma3")
    word = model.tokenize(" word", add_special=False)[0]
    long = model.stream("Hello", max_tokens=2000, sampler=slow(word))
    holder, _ = in_thread(lambda: list(long))
    while len(long.tokens) < 3:
        time.sleep(0.01)
    waiter, result = in_thread(model.generate, "Queued", max_tokens=3, temperature=0)
    time.sleep(0.2)
    assert waiter.is_alive()  # queued behind the running generation
    n_at_cancel = len(long.tokens)
    model.cancel()
    waiter.join(HANG)
    holder.join(HANG)
    assert not waiter.is_alive() and not holder.is_alive()
    assert long.finish_reason == "cancelled" and len(long.tokens) <= n_at_cancel + 1
    # the waiting call was not cancelled: it ran to its length
    assert result["value"].finish_reason == "length"


def test_a_reentrant_call_is_a_typed_busy_error(fixture_model):
    """A call from inside a step (a sampler's, or here the engine's) would wait for that
    step forever: it is refused instead."""
    model = fixture_model("llama")
    decode = model.backend.decode
    seen = []

    def calling_decode(*args, **kwargs):
        for call in (model.reset, lambda: model.logits([1, 2])):
            try:
                call()
            except errors.EdgeInferError as e:
                seen.append(e)
        return decode(*args, **kwargs)

    model.backend.decode = calling_decode  # type: ignore[method-assign]
    try:
        model.generate("x", max_tokens=1, temperature=0)
    finally:
        model.backend.decode = decode  # type: ignore[method-assign]
    assert len(seen) >= 2 and all(isinstance(e, errors.BusyError) for e in seen)

    def reading_sampler(logits, history):
        inner = model.stream("y", max_tokens=1)
        with pytest.raises(errors.BusyError):
            next(inner)
        return 5

    assert model.generate("x", max_tokens=2, sampler=reading_sampler).tokens == [5, 5]
    assert model.generate("x", max_tokens=2, temperature=0).stats.generated_tokens == 2


# --- the storm ---------------------------------------------------------------------------------

MIN_CALLS = 10  # successful calls each thread must complete (about 70 in 30 s here)


def _storm_worker(model, seed: int, deadline: float, kept: list, stats: dict) -> None:
    rng = random.Random(seed)
    prompts = ["Hello", "Once upon a time", "The quick brown fox", "1 2 3 4"]
    ok = typed = 0
    while time.monotonic() < deadline:
        op = rng.choice(["generate", "stream", "abandon", "keep", "logits", "cancel",
                         "reset", "close_stream", "tokenize"])  # fmt: skip
        try:
            if op == "generate":
                c = model.generate(rng.choice(prompts), max_tokens=rng.randint(1, 6))
                assert c.finish_reason in ("length", "stop", "cancelled")
            elif op == "stream":
                s = model.stream(rng.choice(prompts), max_tokens=rng.randint(1, 6))
                text = "".join(s)
                assert s.finish_reason in ("length", "stop", "cancelled")
                assert text == s.text
            elif op in ("abandon", "keep", "close_stream"):
                s = model.stream(rng.choice(prompts), max_tokens=20, temperature=0)
                next(s, None)
                if op == "keep":
                    kept.append(s)  # referenced, never read again
                elif op == "close_stream":
                    s.close()
                    assert s.finish_reason in ("cancelled", "length", "stop")
                del s
            elif op == "logits":
                ids = model.tokenize(rng.choice(prompts))
                out = model.logits(ids)
                assert out.shape == (len(ids), model.n_vocab) and np.isfinite(out).all()
            elif op == "cancel":
                model.cancel()
            elif op == "reset":
                model.reset()
            else:
                assert model.tokenize("x")
            ok += 1
        except errors.CancelledError:  # logits() overtaken by another thread's cancel()
            typed += 1
    stats[seed] = (ok, typed)


@pytest.mark.slow
def test_eight_threads_mixing_every_call(fixture_model):
    model = fixture_model("qwen3", n_ctx=256)
    reference = model.generate("The quick brown fox", max_tokens=8, temperature=0)
    deadline = time.monotonic() + STORM_SECONDS
    kept: list = []
    stats: dict = {}
    threads = [in_thread(_storm_worker, model, seed, deadline, kept, stats) for seed in range(8)]
    for thread, result in threads:
        thread.join(STORM_SECONDS + HANG)
        assert not thread.is_alive(), "a thread hung"
        assert "error" not in result, repr(result.get("error"))
    assert len(stats) == 8
    print("storm calls (ok, cancelled logits) per thread:", stats)
    for ok, _ in stats.values():
        assert ok >= MIN_CALLS, stats
    # still usable, and nothing of the storm leaked into its state
    again = model.generate("The quick brown fox", max_tokens=8, temperature=0)
    assert again.tokens == reference.tokens
    # streams kept from the storm can still be read to their end
    for s in kept[:3]:
        before = s.text
        rest = "".join(s)
        assert s.text == before + rest and s.finish_reason in ("length", "stop", "cancelled")


@pytest.mark.slow
def test_close_during_a_storm_ends_every_thread_with_typed_errors(fixture_model):
    model = fixture_model("llama")
    deadline = time.monotonic() + 3.0
    outcomes: list = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            try:
                if rng.random() < 0.5:
                    model.generate("Hello", max_tokens=5)
                else:
                    model.logits(model.tokenize("Hello there"))
            except errors.EdgeInferError as e:
                outcomes.append(type(e))
                if isinstance(e, errors.ModelClosedError):
                    return

    threads = [in_thread(worker, seed) for seed in range(8)]
    time.sleep(1.0)
    model.close()
    for thread, result in threads:
        thread.join(HANG)
        assert not thread.is_alive() and "error" not in result, result
    assert set(outcomes) <= {errors.ModelClosedError, errors.CancelledError}
    with pytest.raises(errors.ModelClosedError):
        model.generate("x")
