"""Continuous batching (edgeinfer.batching): requests that share engine steps return exactly
what they return alone, prefixes are reused, cancellation frees a sequence at once, a full
queue refuses, a full pool preempts and recomputes, and asyncio consumers stream."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import numpy as np
import pytest

from edgeinfer import errors
from tests.api.test_generate import GEMMA_PROMPTS, llama_cpp_greedy

# prompts of different lengths (one over two prompt chunks) and options of every kind
LONG = "The history of the printing press begins in the fifteenth century. " * 12
REQUESTS = [
    ("The capital of France is", dict(temperature=0)),
    ("Once upon a time", dict(temperature=0.8, seed=5)),
    ("def fibonacci(n):\n", dict(temperature=0, stop=["return"])),
    (LONG, dict(temperature=1.0, seed=7, top_k=0, top_p=0.9)),
    ("1, 2, 3, 4,", dict(temperature=0, logprobs=3)),
    ("Water boils at", dict(temperature=0.7, seed=1, presence_penalty=0.5, logprobs=0)),
    ("In 1492,", dict(temperature=0, stop=["."], repeat_penalty=1.3)),
    (LONG[:150], dict(temperature=1.2, seed=11, min_p=0.1, frequency_penalty=0.4)),
    ("My favourite food is", dict(temperature=0, max_tokens=5)),
    ("Translate to French: cheese", dict(temperature=0.9, seed=3)),
]


def _load(path, **options):
    import edgeinfer

    options.setdefault("n_ctx", 1024)
    options.setdefault("n_threads", 2)
    return edgeinfer.load(path, **options)


def _run(model, prompt, options, n=20):
    options = {"max_tokens": n, **options}
    return model.submit(prompt, **options)


def _outcome(r):
    lps = [(p.token, p.logprob, p.top) for piece in r._seen for p in piece.logprobs]
    return r.tokens, r.text, r.finish_reason, lps, r.usage.completion_tokens


def _collect(r):
    r._seen = list(r)
    return r


@pytest.fixture(scope="module")
def batched(gemma_path):
    with _load(gemma_path, n_parallel=8) as model:
        yield model


def test_requests_together_return_what_they_return_alone(gemma_path, batched):
    """Ten requests, eight at a time with prompt chunks among decoding tokens, against the
    same ones run one by one on a fresh model: the same tokens, text, logprobs, ends."""
    with _load(gemma_path, n_parallel=1) as alone_model:
        alone = [_outcome(_collect(_run(alone_model, p, o))) for p, o in REQUESTS]
    together = [_run(batched, p, o) for p, o in REQUESTS]
    for r in together:
        _collect(r)
    assert [_outcome(r) for r in together] == alone
    assert batched.batcher().metrics.steps < sum(len(r.tokens) for r in together)  # shared steps
    reasons = {r.finish_reason for r in together}
    assert reasons == {"stop", "length"}


def test_the_models_own_streams_run_in_the_same_steps(gemma_path, batched):
    """Model.generate and stream go through the batcher (one path): their tokens share
    steps with submitted requests, on the model's own sequence, and equal a model's alone;
    a conversation's next turn still evaluates only its new tokens."""
    prompt, follow = "The three primary colours are", " Name a fourth:"
    with _load(gemma_path) as alone_model:  # no batched sequences at all
        first = alone_model.generate(prompt, max_tokens=12, temperature=0)
        again = alone_model.generate(prompt + first.text + follow, max_tokens=8, temperature=0)
    b = batched.batcher()
    steps, generated = b.metrics.steps, b.metrics.generated_tokens
    others = [_run(batched, p, o, n=40) for p, o in REQUESTS[:4]]
    seen_slots = []

    def greedy_watching(logits, history):  # runs on the batcher's worker, inside its step
        seen_slots.append(b.slots())
        return int(np.argmax(logits))

    got = batched.generate(prompt, max_tokens=12, sampler=greedy_watching)
    turn = batched.generate(prompt + got.text + follow, max_tokens=8, temperature=0)
    for r in others:
        r.result(timeout=120)
    assert (got.tokens, turn.tokens) == (first.tokens, again.tokens)
    assert turn.stats.cached_tokens >= len(batched.tokenize(prompt)) + len(got.tokens) - 1
    # the stream's steps carried the submitted requests' tokens too
    assert any(len(s) > 1 and any(x["seq"] == 0 for x in s) for s in seen_slots)
    total = sum(len(r.tokens) for r in others) + len(got.tokens) + len(turn.tokens)
    assert b.metrics.generated_tokens - generated == total
    assert b.metrics.steps - steps < total


def test_the_models_own_stream_reads_with_async_for(batched):
    """``async for`` over Model.stream, beside a submitted request read the same way: the
    same text as the blocking calls, and the loop is not blocked while they run."""
    prompt = "The three primary colours are"
    want = batched.generate(prompt, max_tokens=12, temperature=0).text
    other = batched.submit("Once upon a time", max_tokens=12, temperature=0)
    ticks = 0

    async def stream_text():
        return "".join([p async for p in batched.stream(prompt, max_tokens=12, temperature=0)])

    async def submitted_text():
        return "".join([p.text async for p in other])

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    async def main():
        tick = asyncio.create_task(ticker())
        got = await asyncio.gather(stream_text(), submitted_text())
        tick.cancel()
        return got

    got, submitted = asyncio.run(main())
    assert got == want and submitted == other.text and ticks > 5


@pytest.mark.parametrize("policy", ["shift", "streaming", "h2o"])
def test_context_policies_keep_results_batch_invariant(gemma_path, policy):
    """Under a policy that drops positions, prompts over the context and generations past
    it: submitted requests among others (and beside a stream of the model's own sequence)
    return exactly what each returns alone, and a stream returns what a request does."""
    text = "The history of the printing press begins in the fifteenth century. " * 30
    prompts = [text[:n] for n in (120, 400, 900, 1500)]  # about 25 to 300 tokens
    opts = dict(n_ctx=128, context_policy=policy)
    with _load(gemma_path, n_parallel=1, **opts) as model:
        alone = [model.submit(p, max_tokens=90, temperature=0).result().tokens for p in prompts]
        streamed = model.generate(prompts[3], max_tokens=90, temperature=0).tokens
    assert streamed == alone[3]
    with _load(gemma_path, n_parallel=4, **opts) as model:
        rs = [model.submit(p, max_tokens=90, temperature=0) for p in prompts]
        mine = model.generate(prompts[2], max_tokens=90, temperature=0).tokens
        got = [r.result(timeout=120).tokens for r in rs]
    assert [len(t) for t in got] == [90] * 4
    assert got == alone and mine == alone[2]


def test_a_preempted_request_under_a_policy_replays_to_the_same_tokens(gemma_path):
    """A pool too small for two sequences that each fill the context and drop positions: the
    preempted one is recomputed by the same segments and ends as it does alone."""
    text = "The history of the printing press begins in the fifteenth century. " * 30
    prompts = [text[:1400], "Once upon a time, " + text[:1200]]
    opts = dict(n_ctx=128, context_policy="shift")
    with _load(gemma_path, n_parallel=1, **opts) as model:
        alone = [model.submit(p, max_tokens=120, temperature=0).result().tokens for p in prompts]
        block_bytes = model.backend.pool_stats()["groups"][0]["block_bytes"]
    with _load(gemma_path, n_parallel=2, kv_budget=6 * block_bytes, **opts) as model:
        rs = [model.submit(p, max_tokens=120, temperature=0) for p in prompts]
        got = [r.result(timeout=120).tokens for r in rs]
        assert model.batcher().metrics.preemptions > 0
    assert got == alone


def test_a_fixed_small_prefill_chunk_changes_nothing(gemma_path, batched):
    expected = [_outcome(_collect(_run(batched, p, o))) for p, o in REQUESTS[:4]]
    with _load(gemma_path, n_parallel=4) as model:
        model.batcher(prefill_chunk=7)
        got = [_run(model, p, o) for p, o in REQUESTS[:4]]
        assert [_outcome(_collect(r)) for r in got] == expected


@pytest.mark.parametrize("prompt", GEMMA_PROMPTS)
def test_batched_greedy_tokens_equal_llama_cpp(batched, gemma_llama_cpp, prompt):
    ids = batched.tokenize(prompt)
    # the prompt among others, so that its steps are shared
    others = [_run(batched, p, o) for p, o in REQUESTS[:3]]
    r = batched.submit(ids, max_tokens=32, temperature=0).result()
    for o in others:
        o.result()
    assert r.tokens == llama_cpp_greedy(gemma_llama_cpp, ids, 32, batched.tokenizer.is_eog)


def test_logprobs_are_the_log_softmax_of_the_models_logits(batched):
    ids = batched.tokenize("The three primary colors are")
    r = _collect(batched.submit(ids, max_tokens=3, temperature=0, logprobs=4))
    logits = batched.logits(ids + r.tokens[:2]).astype(np.float64)
    for i, lp in enumerate(p for piece in r._seen for p in piece.logprobs):
        row = logits[len(ids) - 1 + i]
        lse = row.max() + math.log(np.exp(row - row.max()).sum())
        assert lp.token == r.tokens[i] == int(np.argmax(row))
        assert lp.logprob == pytest.approx(row[lp.token] - lse, abs=1e-9)
        best = np.argsort(-row, kind="stable")[:4]
        assert [t for t, _ in lp.top] == best.tolist()


def test_a_shared_prefix_is_computed_once(batched):
    system = "You are a careful assistant who answers in one sentence. " * 6
    first = batched.submit(system + "What is red?", max_tokens=4, temperature=0).result()
    second = batched.submit(system + "What is blue?", max_tokens=4, temperature=0).result()
    block = batched.backend.block_size
    assert first.usage.cached_tokens == 0 or first.usage.cached_tokens % block == 0
    shared = len(batched.tokenize(system)) // block * block
    assert second.usage.cached_tokens >= shared - block > 0
    with _load(batched.path, n_parallel=1) as fresh:
        ref = fresh.submit(system + "What is blue?", max_tokens=4, temperature=0).result()
    assert (second.tokens, ref.usage.cached_tokens) == (ref.tokens, 0)


def test_cancel_frees_the_sequence_within_a_step(batched):
    b = batched.batcher()
    used = b.pool_stats()["used"]  # the model's own sequence may hold blocks
    r = batched.submit("Tell me a long story.", max_tokens=500, temperature=0)
    next(iter(r))  # it is running
    r.cancel()
    r.result(timeout=30)
    assert r.finish_reason == "cancelled"
    assert 0 < len(r.tokens) < 500
    assert b.slots() == [] and b.pool_stats()["used"] == used


def test_a_full_queue_refuses_while_the_running_request_goes_on(gemma_path):
    with _load(gemma_path, n_parallel=1) as model:
        b = model.batcher(max_queue=1)
        running = model.submit("Count slowly:", max_tokens=40, temperature=0)
        next(iter(running))
        waiting = model.submit("And again:", max_tokens=4, temperature=0)
        with pytest.raises(errors.QueueFullError) as e:
            model.submit("One too many", max_tokens=4)
        assert e.value.retry_after_s >= 1
        assert running.result(timeout=60).finish_reason == "length"
        assert len(running.tokens) == 40 and waiting.result(timeout=60).tokens
        assert b.metrics.requests["length"] == 2


def test_a_full_pool_preempts_the_newest_and_recomputes_it(gemma_path):
    """A pool too small for both sequences' growth: the newest is preempted, recomputed from
    its prompt and tokens, and still returns what it returns alone."""
    prompts = ["The history of Rome " * 20, "The history of Greece " * 20]
    n = 250  # each sequence grows to 11 blocks of 32 positions; the pool holds 14
    with _load(gemma_path, n_parallel=1, n_ctx=512) as model:
        alone = [model.submit(p, max_tokens=n, temperature=0).result().tokens for p in prompts]
        group = model.backend.pool_stats()["groups"]
        assert len(group) == 1 and group[0]["window"] == 0
        budget = group[0]["block_bytes"] * 14
    with _load(gemma_path, n_parallel=2, n_ctx=512, kv_budget=budget) as model:
        rs = [model.submit(p, max_tokens=n, temperature=0) for p in prompts]
        got = [r.result(timeout=120).tokens for r in rs]
        assert model.batcher().metrics.preemptions > 0
        assert [len(t) for t in got] == [n, n]
    assert got == alone


def test_the_models_own_sequence_gives_its_blocks_back_for_a_waiting_request(gemma_path):
    """A conversation's cache stays on the model's own sequence after its stream; a request
    the pool cannot hold beside it takes those blocks rather than failing."""
    with _load(gemma_path, n_parallel=1, n_ctx=512) as model:
        block = model.backend.pool_stats()["groups"][0]["block_bytes"]
    with _load(gemma_path, n_parallel=1, n_ctx=512, kv_budget=block * 12) as model:
        model.generate("The history of Rome " * 40, max_tokens=40, temperature=0)
        assert model.backend.seq_length(0) > 6 * 32  # the conversation holds 7 blocks
        r = model.submit("The history of Greece " * 40, max_tokens=100, temperature=0)
        assert r.result(timeout=120).finish_reason == "length"


def test_steps_stay_within_step_tokens_with_a_stream_beside_prompts(gemma_path):
    with _load(gemma_path, n_parallel=1, n_batch=64) as model:
        sizes = []
        decode = model.backend.decode

        def recording(batch):
            sizes.append(len(batch))
            return decode(batch)

        model.backend.decode = recording
        other = model.submit("The history of the printing press begins. " * 30, max_tokens=5)
        while model.batcher().running == 0:
            pass
        "".join(model.stream("A long story about the sea and ships. " * 20, max_tokens=3))
        other.result(timeout=60)
        assert max(sizes) == 64


def test_a_stream_cancelled_just_before_a_step_is_reaped_not_run(gemma_path):
    """Two streams of the model's own sequence: the idle one cancelled between a step's reap
    and its plan must not join the step (both would write the same positions)."""
    with _load(gemma_path, n_parallel=1, n_ctx=512) as model:
        b = model.batcher()
        idle = model.stream("The history of Rome", max_tokens=50, temperature=0)
        next(idle)
        read = model.stream("Water boils at", max_tokens=4, temperature=0)
        next(read)  # the same thread: it takes the model's turn from the idle stream
        other = model.submit("Once upon a time", max_tokens=30, temperature=0)
        admit = b._admit

        def admit_then_cancel():
            admit()
            idle._request._cancelled = True  # as model.cancel() or a collector would

        b._admit = admit_then_cancel
        rest = "".join(read)
        assert read.finish_reason == "length" and rest
        assert other.result(timeout=60).finish_reason == "length"


def test_a_call_between_steps_waits_for_one_step_at_most(gemma_path):
    """The engine's lock is taken in arrival order: reset() while requests decode runs after
    the step in progress, not after a lucky gap between steps (with a plain lock the worker,
    which lets it go only to take it again, won for seconds)."""
    with _load(gemma_path, n_parallel=2, n_threads=1) as model:
        b = model.batcher()
        rs = [model.submit("Once", max_tokens=400, temperature=0.8, seed=i) for i in range(2)]
        while b.metrics.generated_tokens < 4:
            time.sleep(0.01)
        waits = []
        for _ in range(10):
            before = b.metrics.steps
            model.reset()
            waits.append(b.metrics.steps - before)
            time.sleep(0.02)
        for r in rs:
            r.cancel()
        assert max(waits) <= 1, waits


def test_asyncio_consumers_stream_concurrently(batched):
    async def one(prompt):
        r = batched.submit(prompt, max_tokens=8, temperature=0)
        text = "".join([piece.text async for piece in r])
        return text, r.text

    async def main():
        return await asyncio.gather(*(one(p) for p, _ in REQUESTS[:5]))

    for streamed, final in asyncio.run(main()):
        assert streamed == final and final


def test_bad_requests_are_typed_errors(gemma_path, batched):
    with pytest.raises(errors.ContextOverflowError):
        batched.submit(list(range(1, 1025)), max_tokens=1)
    with pytest.raises(errors.InvalidOptionError, match="logprobs"):
        batched.submit("x", logprobs=21)
    with pytest.raises(errors.InvalidOptionError, match="unknown option"):
        batched.submit("x", n=2)
    with pytest.raises(errors.InvalidOptionError, match="max_queue"):
        batched.batcher(max_queue=-1)
    with pytest.raises(errors.InvalidOptionError, match="step_tokens"):
        batched.batcher(step_tokens=1)
    with _load(gemma_path) as model, pytest.raises(errors.InvalidOptionError, match="n_parallel"):
        model.submit("x")
    with pytest.raises(errors.InvalidOptionError, match="sequences"):
        _load(gemma_path, n_parallel=2, engine="reference")


def test_close_cancels_running_requests_and_refuses_new_ones(gemma_path):
    model = _load(gemma_path, n_parallel=2)
    r = model.submit("Write an essay about rivers.", max_tokens=400, temperature=0)
    next(iter(r))
    model.close()
    assert r.result(timeout=30).finish_reason == "cancelled"
    assert not [t for t in threading.enumerate() if t is model._batcher._thread and t.is_alive()]
    with pytest.raises(errors.ModelClosedError):
        model.submit("x")


def test_a_failing_sampler_fails_its_request_only(batched):
    def broken(logits, history):
        raise ValueError("boom")

    bad = batched.submit("x", max_tokens=4, sampler=broken)
    good = batched.submit("The capital of France is", max_tokens=4, temperature=0)
    assert good.result(timeout=30).finish_reason == "length"
    with pytest.raises(errors.BackendError, match="boom"):
        bad.result(timeout=30)
    assert bad.finish_reason == "error"


def test_zero_max_tokens_runs_no_step_and_free_sequences_do_not_count_as_queued(gemma_path):
    with _load(gemma_path, n_parallel=2) as model:
        b = model.batcher(max_queue=0)
        r = model.submit("Hello", max_tokens=0)
        assert (r.result().finish_reason, r.tokens, b.metrics.steps) == ("length", [], 0)
        # a queue of 0: requests that find a free sequence still run
        rs = [model.submit("Hello", max_tokens=2, temperature=0) for _ in range(2)]
        assert [x.result(timeout=30).finish_reason for x in rs] == ["length", "length"]


def test_a_model_dropped_without_close_stops_its_batcher(gemma_path):
    import gc

    model = _load(gemma_path, n_parallel=1)
    model.submit("Hello", max_tokens=2, temperature=0).result(timeout=30)
    thread = model.batcher()._thread
    del model
    gc.collect()
    thread.join(timeout=30)
    assert not thread.is_alive()
