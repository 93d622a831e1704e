"""Continuous batching: many generations share each engine step.

A :class:`Batcher` runs one worker thread over a model's engine. Each step packs the next
token of every running sequence, then chunks of the prompts still to evaluate, up to a token
budget (decode first, then prefill, as vLLM's scheduler does), so that a long prompt holds the
running streams back by one chunk at most. While streams are decoding, a prompt's chunk is
sized so that a step costs about 2.5 decoding steps (measured as the batcher runs), which
keeps their inter-token latency even. Requests join at the next step and leave as soon as
they finish; a cancelled one (its client went away) leaves at the next step.

Each request samples with its own sampler and seed, and the engine's sums do not depend on
what else shares a step (its order-independent reductions), nor on how a prompt is cut into
chunks: a request returns the same tokens alone or among others.

Prefixes: every full block of a sequence is keyed by its tokens and all before them
(:func:`edgeinfer._native.block_key`), so a request whose prompt begins as an earlier one did
(a shared system prompt) takes the cached blocks instead of evaluating them again; its
``usage.cached_tokens`` counts them.

When the engine's block pool is full, a request waits for admission; a running one that
cannot grow is preempted (the newest first): its blocks go back and it is queued again at the
front, to be recomputed (from the cached prefix of its blocks, where they survive) and go on
exactly where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer import errors
from edgeinfer.engines.base import Batch
from edgeinfer.generation import KVSession
from edgeinfer.metrics import LATENCY_BUCKETS, STEP_TOKEN_BUCKETS, Histogram
from edgeinfer.options import int_option, max_tokens_option
from edgeinfer.repetition import RepetitionGuard
from edgeinfer.repetition import repetition_guard as repetition_guard_option
from edgeinfer.sampling import Sampler
from edgeinfer.text_stream import StopScanner, stop_strings

if TYPE_CHECKING:
    from edgeinfer.api import Model

MAX_TOP_LOGPROBS = 20  # OpenAI's limit
DEFAULT_MAX_QUEUE = 64
FIRST_CHUNK = 64  # prompt tokens per step beside decoding ones, before any step was timed
MIN_CHUNK = 16
IDLE_REAP_S = 0.1  # how often an idle worker looks for streams ended without a wake-up
MIXED_STEP_FACTOR = 1.5  # a prompt chunk may add this many decoding steps' time to a step
OUTCOMES = ("stop", "length", "repetition", "cancelled", "error")


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model (the log-softmax of its raw
    logits, before any sampling option) and the ``top`` most likely tokens' (id, logprob)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Piece:
    """What one step of a request produced: the text it lets out (a stop string, or text that
    may begin one, is held back), the token generated, and its log-probabilities."""

    text: str
    tokens: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass
class Usage:
    prompt_tokens: int
    cached_tokens: int = 0  # of the prompt, taken from cached blocks rather than evaluated
    completion_tokens: int = 0


class Request:
    """One generation in a :class:`Batcher`: iterate it (``for`` or ``async for``) for its
    :class:`Piece` s, or wait for ``result()``. Afterwards ``text``, ``tokens``, ``usage``
    and ``finish_reason`` ("stop", "length", "repetition", "cancelled" or "error") describe
    it; a request that ended in an error raises it at the end of its iteration and from
    ``result()``."""

    def __init__(
        self, batcher: Batcher, request_id: int, prompt: list[int], sampler: Any,
        max_tokens: int, scanner: StopScanner, logprobs: int | None,
    ) -> None:  # fmt: skip
        self.id = request_id
        self.prompt = prompt
        self.usage = Usage(len(prompt))
        self.tokens: list[int] = []
        self.text = ""
        self.finish_reason = ""
        self.error: BaseException | None = None
        self.state = "queued"  # queued, prefill, decode, finished
        self.submitted = time.monotonic()
        self.admitted: float | None = None
        self.first_token: float | None = None
        self.finished: float | None = None
        self._batcher = batcher
        self._sampler = sampler
        self._max_tokens = max_tokens
        self._scanner = scanner
        self._logprobs = logprobs
        self._context = list(prompt)  # prompt + generated: what the sequence must hold
        self._evaluated = 0  # positions of the context the sequence holds
        self._seq = -1
        self._order = 0  # admission order: the newest is preempted first
        self._last_token = 0.0
        self._cancelled = False
        # a stream of the model's own sequence (Model.stream): its session keeps that
        # sequence's tokens; it runs a step only while its reader waits (credit), and a
        # token that ends it by length is still evaluated (the next turn reuses it)
        self._session: KVSession | None = None
        self._stream = False  # Model.stream's, on the model's own sequence (pulled)
        self._seg_end = 0  # where the context's segment whose room is made ends
        self._counted = False  # its cached prompt tokens are counted
        self._version = -1  # the session's version after this request's last step
        self._credit = False
        self._final = False
        self._cancel_check: Callable[[], bool] | None = None
        self._guard: RepetitionGuard | None = None  # ends the request once it loops
        self._cond = threading.Condition()
        self._pieces: deque[Piece] = deque()
        self._wakers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    # --- the consumer's side ---------------------------------------------------------------

    def cancel(self) -> None:
        """Ends the request at the next step (from any thread); its sequence is freed."""
        self._cancelled = True
        self._batcher._wake()

    def _is_cancelled(self) -> bool:
        return self._cancelled or (self._cancel_check is not None and self._cancel_check())

    def _schedulable(self) -> bool:
        """Whether a step has something to do for it (a stream: only while it is read)."""
        return not self._stream or self._credit or self._is_cancelled()

    def _holds_room(self) -> bool:
        """Whether its blocks are in use: a submitted request, or a stream being read."""
        return not self._stream or (self._credit and not self._is_cancelled())

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    def __iter__(self) -> Iterator[Piece]:
        return self

    def _next_piece(self) -> Piece | None:
        """The next piece; None once the request has ended (its error raised)."""
        with self._cond:
            while not self._pieces and not self.finish_reason:
                self._cond.wait()
            if self._pieces:
                return self._pieces.popleft()
        self._raise_error()
        return None

    def __next__(self) -> Piece:
        piece = self._next_piece()
        if piece is None:
            raise StopIteration
        return piece

    def __aiter__(self) -> Request:
        return self

    async def __anext__(self) -> Piece:
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._pieces:
                    return self._pieces.popleft()
                if self.finish_reason:
                    break
                event = asyncio.Event()
                self._wakers.append((loop, event))
            await event.wait()
        self._raise_error()
        raise StopAsyncIteration

    def result(self, timeout: float | None = None) -> Request:
        """Waits for the end (TimeoutError after ``timeout`` seconds); raises its error."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self.finish_reason), timeout):
                raise TimeoutError(f"request {self.id} did not finish in {timeout} s")
        self._raise_error()
        return self

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    # --- the worker's side -----------------------------------------------------------------

    def _deliver(self, piece: Piece | None, finish: str = "", error: BaseException | None = None):
        with self._cond:
            self._credit = False
            if piece is not None and (piece.text or piece.tokens):
                self._pieces.append(piece)
            if finish:
                self.finish_reason, self.error, self.state = finish, error, "finished"
            self._cond.notify_all()
            wakers, self._wakers = self._wakers, []
        for loop, event in wakers:
            # a consumer's loop that has closed has nobody waiting on it
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)


@dataclass
class BatcherMetrics:
    """The batcher's traffic since it started (apps/server.py serves it as Prometheus text)."""

    prompt_tokens: int = 0  # prompt tokens evaluated
    cached_prompt_tokens: int = 0  # prompt tokens taken from cached blocks
    generated_tokens: int = 0
    steps: int = 0
    preemptions: int = 0
    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    ttft: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    inter_token: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    queue_wait: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    step_tokens: Histogram = field(default_factory=lambda: Histogram(STEP_TOKEN_BUCKETS))


class _ChunkSizer:
    """How many prompt tokens a step takes beside decoding ones: ``fixed``, or what keeps a
    mixed step within MIXED_STEP_FACTOR decoding steps' more time, from timed steps."""

    def __init__(self, fixed: int | None, ceiling: int) -> None:
        self.fixed, self.ceiling = fixed, ceiling
        self.decode_s: float | None = None  # a step of decoding tokens only
        self.token_s: float | None = None  # one prompt token's share of a mixed step

    def observe(self, n_decode: int, n_prompt: int, seconds: float) -> None:
        if n_prompt == 0:
            self.decode_s = _ema(self.decode_s, seconds)
        elif n_decode and self.decode_s is not None:
            self.token_s = _ema(self.token_s, max(seconds - self.decode_s, 0.0) / n_prompt)
        elif not n_decode:
            self.token_s = _ema(self.token_s, seconds / n_prompt)

    def chunk(self) -> int:
        if self.fixed:
            return self.fixed
        if not self.decode_s or not self.token_s:
            return min(FIRST_CHUNK, self.ceiling)
        n = int(MIXED_STEP_FACTOR * self.decode_s / self.token_s)
        return max(MIN_CHUNK, min(n, self.ceiling))


def _ema(old: float | None, new: float, weight: float = 0.2) -> float:
    return new if old is None else (1 - weight) * old + weight * new


class Batcher:
    """Runs every generation of one model: the one worker thread that calls its engine.

    Requests from :meth:`submit` each hold one of the engine's sequences 1..n_parallel (a
    load option) while they run. Sequence 0 is the model's own: ``Model.stream`` and
    ``chat`` run there, one stream at a time (the model's turns decide which), in the same
    steps as the submitted requests; its cache is kept after the stream, so the next turn
    of a conversation evaluates only its new tokens. The model's context policy makes room
    in every sequence, by segments that keep results batch-invariant (``_session_entry``).
    Other calls of the model (``logits``, ``reset``, saved sessions) run between steps.

    ``max_queue`` bounds the requests waiting for a sequence (QueueFullError beyond);
    ``step_tokens`` the tokens of one step (the model's n_batch); ``prefill_chunk`` fixes the
    prompt tokens a step takes beside decoding ones (default: sized from timed steps)."""

    def __init__(self, model: Model, **options: Any) -> None:
        # weakly: a model dropped without close() is still collected (its __del__ closes
        # this batcher); the worker holds only what it needs of it
        self._model_ref = weakref.ref(model)
        self._engine_lock = model._engine_lock
        self._n_ctx = model.n_ctx
        self._n_batch = model._session.n_batch
        self._policy = model._session.policy  # submitted requests follow it too
        self.n_parallel = model.n_parallel
        self._engine = model.backend
        self._is_eog = model.tokenizer.is_eog
        self.max_queue = DEFAULT_MAX_QUEUE
        self.step_tokens = self._n_batch
        self._sizer = _ChunkSizer(None, self._n_batch - self.n_parallel)
        self.configure(**options)
        self.metrics = BatcherMetrics()
        self._free = list(range(self.n_parallel, 0, -1))  # sequences; pop() takes the lowest
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._ids = itertools.count(1)
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closing = False
        self._dead: BaseException | None = None  # what stopped the worker, if anything did
        self._thread = threading.Thread(target=self._loop, name="edgeinfer-batcher", daemon=True)
        self._thread.start()

    def configure(
        self, *, max_queue: int | None = None, step_tokens: int | None = None,
        prefill_chunk: int | None = None,
    ) -> None:  # fmt: skip
        """Sets the options given (see the class); they apply from the next step."""
        if max_queue is not None:
            self.max_queue = int_option("max_queue", max_queue, 0)
        if step_tokens is not None:
            lo = self.n_parallel + 1  # a decoding token for every sequence
            self.step_tokens = int_option("step_tokens", step_tokens, lo, self._n_batch)
        fixed = self._sizer.fixed
        if prefill_chunk is not None:
            fixed = int_option("prefill_chunk", prefill_chunk, 1, self.step_tokens)
        self._sizer = _ChunkSizer(fixed, self.step_tokens - self.n_parallel)

    @property
    def on_worker(self) -> bool:
        """Whether the caller runs on the worker thread (inside a step: a sampler's call)."""
        return threading.current_thread() is self._thread

    # --- submitting ------------------------------------------------------------------------

    def submit(
        self, prompt: str | Sequence[int], *, max_tokens: int = 256,
        stop: str | Sequence[str] = (), add_special: bool = True, parse_special: bool = False,
        logprobs: int | None = None, repetition_guard: Any = False, sampler: Any = None,
        **sampling: Any,
    ) -> Request:  # fmt: skip
        """Queues a generation of ``prompt`` (text or token ids) and returns its request.
        Options as :meth:`Model.stream`'s, plus ``logprobs``: None, or how many of the most
        likely tokens (0 to 20) to report with each generated token's log-probability.
        Raises QueueFullError when ``max_queue`` requests wait already, ContextOverflowError
        when the prompt leaves no room in the context for a generated token."""
        model = self._model()
        model._check_open()
        if self._closing:
            raise errors.ModelClosedError("the batcher is closed")
        if self.n_parallel < 1:
            raise errors.InvalidOptionError(
                "batching needs sequences of its own: load the model with n_parallel >= 1"
            )
        sampler = model._sampler(sampler, sampling)
        max_tokens = max_tokens_option(max_tokens, model.n_ctx)  # -1: to the context's end
        if logprobs is not None:
            logprobs = int_option("logprobs", logprobs, 0, MAX_TOP_LOGPROBS)
        guard = repetition_guard_option(repetition_guard)
        scanner = StopScanner(model.tokenizer.stream_decoder(), stop_strings(stop))
        ids = model._prompt_ids(prompt, add_special, parse_special)
        with self._cond:
            if self._closing:
                raise errors.ModelClosedError("the batcher is closed")
            if self._dead is not None:
                raise errors.BackendError(f"the batcher has stopped: {self._dead}")
            waiting = len(self._waiting) - len(self._free)  # beyond the sequences free now
            if waiting >= self.max_queue:
                raise errors.QueueFullError(
                    f"{waiting} requests are waiting for a sequence already (max_queue)",
                    retry_after_s=self._retry_after(),
                )
            request = Request(self, next(self._ids), ids, sampler, max_tokens, scanner, logprobs)
            request._guard = guard
            if max_tokens == 0:  # nothing to generate: as Model.stream, no step at all
                self._end(request, "length")
                return request
            self._waiting.append(request)
            self._cond.notify_all()
        return request

    def stream_request(
        self, session: KVSession, prompt: list[int], sampler: Any, max_tokens: int,
        scanner: StopScanner, cancelled: Callable[[], bool], guard: RepetitionGuard | None,
    ) -> Request:  # fmt: skip
        """A request on the model's own sequence (``session``), for ``Model.stream``: it runs
        a step only while :meth:`grant` lets it, and ``cancelled()`` ends it."""
        r = Request(self, next(self._ids), prompt, sampler, max_tokens, scanner, None)
        r._session, r._cancel_check, r._stream, r._guard = session, cancelled, True, guard
        return r

    def grant(self, r: Request) -> None:
        """Lets the stream ``r`` run steps until it delivers its next piece (or ends); the
        caller holds the model's turn, so the sequence is the stream's meanwhile."""
        with self._cond:
            if self._dead is not None:
                raise errors.BackendError(f"the batcher has stopped: {self._dead}")
            if self._closing:
                raise errors.ModelClosedError("the model is closed")
            if r.state == "queued":  # its first read: it joins the running requests
                r._seq, r._order, r.state = 0, next(self._order), "prefill"
                self._running.append(r)
            r._credit = True
            self._cond.notify_all()

    def _model(self) -> Model:
        model = self._model_ref()
        if model is None:
            raise errors.ModelClosedError("the model is closed")
        return model

    def submit_chat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> Request:
        """Queues a reply to a conversation, rendered by the model's chat template."""
        return self.submit(self._model().chat_tokens(messages), **options)

    def _retry_after(self) -> float:
        """A guess of when a sequence frees up: the mean request's time, at least a second."""
        m = self.metrics.e2e
        return max(1.0, math.ceil(m.sum / m.count)) if m.count else 1.0

    # --- status ----------------------------------------------------------------------------

    def slots(self) -> list[dict[str, Any]]:
        """Every request running or waiting: its id, sequence (-1 while waiting), state, and
        token counts."""
        with self._cond:
            requests = [*self._running, *self._waiting]
            return [
                {
                    "id": r.id, "seq": r._seq, "state": r.state,
                    "prompt_tokens": len(r.prompt), "cached_tokens": r.usage.cached_tokens,
                    "generated_tokens": len(r.tokens), "context_tokens": r._evaluated,
                }
                for r in requests
            ]  # fmt: skip

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def pool_stats(self) -> dict[str, Any] | None:
        """The engine's block pool (used, cached, free blocks; prefix hit rate), if it has one."""
        stats = getattr(self._engine, "pool_stats", None)
        model = self._model_ref()
        if stats is None or model is None or model._closing:
            return None
        return stats()

    # --- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Cancels every request, waits for the step in progress, and stops the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _wake(self) -> None:
        """Lets the worker look again; never blocks (a signal handler may cancel): a thread
        holding the lock now looks at the requests' flags before it waits."""
        if self._cond.acquire(blocking=False):
            try:
                self._cond.notify_all()
            finally:
                self._cond.release()

    # --- the worker ------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._closing and not self._has_work():
                        # a stream cancelled without a wake-up (its collector, a signal
                        # handler: _wake never blocks) is reaped within this while idle
                        idle = any(r._stream for r in self._running)
                        self._cond.wait(IDLE_REAP_S if idle else None)
                    if self._closing:
                        break
                with self._engine_lock:
                    try:
                        self._step()
                    except Exception as e:  # a failure must end requests, not hang them
                        self._end_all("error", _typed(e))
            with self._engine_lock:
                self._end_all("cancelled")
        except BaseException as e:  # the lock itself failed: nothing more can run
            self._dead = _typed(e)
            self._end_all("error", self._dead, engine=False)

    def _has_work(self) -> bool:
        """Whether a step would do something (called with the lock held)."""
        if self._waiting and self._free:
            return True
        return any(r._schedulable() for r in self._running)

    def _end_all(self, reason: str, error: BaseException | None = None, engine: bool = True):
        """Ends every request, running or waiting; with ``engine`` their sequences are
        cleared (inside a turn), else only handed back."""
        with self._cond:
            requests = [*self._running, *self._waiting]
        for r in requests:
            try:
                self._end(r, reason, error, clear=engine)
            except Exception:  # the engine failed too: the request still ends
                self._end(r, reason, error, clear=False)

    def _step(self) -> None:
        self._reap()
        self._admit()
        plan = self._plan()
        if not plan:
            return
        tokens: list[int] = []
        positions: list[int] = []
        seqs: list[int] = []
        want: list[bool] = []
        for r, chunk, last, pos0 in plan:
            tokens += chunk
            positions += range(pos0, pos0 + len(chunk))
            seqs += [r._seq] * len(chunk)
            want += [False] * (len(chunk) - 1) + [last]
        batch = Batch(
            np.asarray(tokens, dtype=np.int32), np.asarray(positions, dtype=np.int32),
            np.asarray(seqs, dtype=np.int32), np.asarray(want, dtype=bool),
        )  # fmt: skip
        t0 = time.perf_counter()
        try:
            logits = self._engine.decode(batch)
        except errors.OutOfMemoryError as e:
            if not self._preempt():
                for r, *_ in plan:
                    self._end(r, "error", e)
            return
        except errors.EdgeInferError as e:
            for r, *_ in plan:
                self._end(r, "error", e)
            return
        seconds = time.perf_counter() - t0
        n_decode = sum(1 for r, *_ in plan if r.state == "decode")
        self._sizer.observe(n_decode, len(tokens) - n_decode, seconds)
        m = self.metrics
        m.steps += 1
        m.step_tokens.observe(len(tokens))
        m.prompt_tokens += len(tokens) - n_decode
        row = 0
        for r, chunk, last, _ in plan:
            r._evaluated += len(chunk)
            if r._session is not None:
                r._session.commit(chunk)
                r._version = r._session.version
            if last:
                self._next_token(r, logits[row])
                row += 1
            elif r._final and r._evaluated == len(r._context):
                self._end(r, "length")  # its last token is evaluated too

    def _reap(self) -> None:
        """Ends the cancelled requests, running or waiting."""
        with self._cond:
            cancelled = [r for r in [*self._running, *self._waiting] if r._is_cancelled()]
        for r in cancelled:
            self._end(r, "cancelled")

    def _admit(self) -> None:
        """Gives waiting requests free sequences, in order, while the pool has room."""
        while True:
            with self._cond:
                if not self._waiting or not self._free:
                    return
                r = self._waiting[0]
                need = len(r._context) + 1
                if not self._fits(min(need, self._n_ctx) if self._policy.evicts else need):
                    if any(x._holds_room() for x in self._running):
                        return  # wait for room
                    if self._release_own_sequence():
                        continue  # its blocks went back to the pool
                    self._waiting.popleft()
                    self._end(r, "error", errors.OutOfMemoryError(
                        f"the KV cache pool cannot hold {len(r._context) + 1} positions "
                        "(raise kv_budget)"
                    ))  # fmt: skip
                    continue
                self._waiting.popleft()
                r._seq = self._free.pop()
                r._order = next(self._order)
                r.state = "prefill"
                self._running.append(r)
            reuse = getattr(self._engine, "reuse", None)
            if self._policy.evicts:  # a session keeps its sequence (see _session_entry)
                self._engine.seq_clear(r._seq)
                r._session = KVSession(self._engine, self._n_batch, self._policy, r._seq)
                r._version, r._evaluated = -1, 0
            elif reuse is not None:
                r._evaluated = int(reuse(r._seq, r._context))
            else:
                self._engine.seq_clear(r._seq)
                r._evaluated = 0
            if r.admitted is None:  # its first admission (not a recompute after preemption)
                r.admitted = time.monotonic()
                self.metrics.queue_wait.observe(r.admitted - r.submitted)
            if r._session is None and not r._counted:
                r._counted = True
                r.usage.cached_tokens = r._evaluated
                self.metrics.cached_prompt_tokens += r._evaluated

    def _release_own_sequence(self) -> bool:
        """Empties the model's own sequence, which keeps the last stream's cache for the
        next turn, to make room (its keyed blocks stay cached in the pool; a stream read
        again re-evaluates what it lost); False when it holds nothing."""
        model = self._model_ref()
        if model is None or self._engine.seq_length(0) == 0:
            return False
        model._session.reset()
        return True

    def _fits(self, positions: int) -> bool:
        """Whether the pool's free and cached blocks hold ``positions`` more in each group
        of full-attention layers (a window's group needs at most its window)."""
        stats = self.pool_stats()
        if stats is None:
            return True
        need = -(-positions // stats["block_size"])
        return all(g["free"] + g["cached"] >= need for g in stats["groups"] if g["window"] == 0)

    def _plan(self) -> list[tuple[Request, list[int], bool, int]]:
        """The step: each decoding request's pending token, then prompt chunks up to the
        budget (a chunk of the size the sizer allows while anything decodes). An entry is
        (request, tokens, whether the last one's logits are wanted, the first's position)."""
        with self._cond:
            running = [r for r in self._running if not r._stream]
            # the stream being read, if any (a cancelled one waits for the next reap; only
            # the reader holding the model's turn has credit, so there is one at most)
            stream = next((r for r in self._running if r._credit and not r._is_cancelled()
                           and r._stream), None)  # fmt: skip
        decoding = [r for r in running if r.state == "decode"]
        plan: list[tuple[Request, list[int], bool, int]] = []
        for r in decoding:
            if r._session is None:
                plan.append((r, r._context[r._evaluated :], True, r._evaluated))
            else:
                self._add_session_entry(plan, r, 1)
        # what the rest of the step may take: at most the sizer's chunk while anything
        # decodes; the stream's token or chunk first, so that the step stays in step_tokens
        budget = self.step_tokens - len(decoding)
        if decoding or (stream is not None and stream.state == "decode"):
            budget = min(budget, self._sizer.chunk())
        if stream is not None:
            budget -= self._add_session_entry(plan, stream, budget)
        for r in running:
            if r.state != "prefill" or budget <= 0:
                continue
            if r._session is not None:
                budget -= self._add_session_entry(plan, r, budget)
                continue
            todo = r._context[r._evaluated :]
            chunk = todo[:budget]
            plan.append((r, chunk, len(chunk) == len(todo), r._evaluated))
            budget -= len(chunk)
        return plan

    def _add_session_entry(self, plan: list[Any], r: Request, budget: int) -> int:
        """Adds ``r``'s session entry to ``plan``; the tokens it takes (0 if it failed)."""
        try:
            entry = self._session_entry(r, budget)
        except Exception as e:  # its sequence's bookkeeping failed: it alone ends
            self._end(r, "error", _typed(e))
            return 0
        plan.append(entry)
        return len(entry[1])

    def _session_entry(self, r: Request, budget: int) -> tuple[Request, list[int], bool, int]:
        """The step's part of a request whose sequence a session keeps (a stream of the
        model's own sequence, or a request under a context policy): its context from what
        the session holds of it (all of it again after another call used the sequence),
        a piece of its current segment at most.

        Room is made per segment, as the context policy says, before its first piece: the
        prompt's segments are chunk_step tokens, and each token after the prompt is one.
        Where a policy drops positions depends on those segments alone, not on the step
        budget that cuts them into pieces, so a request returns the same tokens whatever
        shares its steps (and after a preemption, which replays the same segments)."""
        s = r._session
        assert s is not None
        if r._version != s.version:  # its first step, or another call used the sequence
            r._evaluated = r._seg_end = s.start(r._context)
            if not r._counted:
                r._counted = True
                if r.admitted is None:  # a stream: admitted at its first step
                    r.admitted = time.monotonic()
                r.usage.cached_tokens = r._evaluated
                self.metrics.cached_prompt_tokens += r._evaluated
        i = r._evaluated
        todo = r._context[i:]
        if len(todo) > 1 or not r.tokens:
            r.state = "prefill"
        if r._seg_end <= i:  # a segment begins: room for all of it
            if not s.policy.evicts:
                n = min(len(todo), s.chunk_step)
            elif i < len(r.prompt):
                n = min(len(r.prompt) - i, s.chunk_step)
            else:
                n = 1
            s.make_room(n)
            r._seg_end = i + n
        chunk = todo[: min(budget, r._seg_end - i)]
        r._version = s.version
        last = len(chunk) == len(todo) and not r._final
        return r, chunk, last, self._engine.seq_length(r._seq)

    def _preempt(self) -> bool:
        """Frees the newest running request's sequence and queues it first again (to be
        recomputed); False when only one runs (nothing would make room)."""
        with self._cond:
            mine = [x for x in self._running if not x._stream]
            if len(self._running) < 2 or not mine:
                return False
            r = max(mine, key=lambda x: x._order)
            self._running.remove(r)
            self._waiting.appendleft(r)
        self._engine.seq_clear(r._seq)
        with self._cond:
            self._free.append(r._seq)
        r._seq, r._evaluated, r.state = -1, 0, "queued"
        r._session, r._version = None, -1  # a new one at its readmission
        self.metrics.preemptions += 1
        return True

    def _next_token(self, r: Request, logits: np.ndarray) -> None:
        """Samples ``r``'s next token from its logits and hands it out, or ends ``r``."""
        if r._is_cancelled():
            return  # ended at the next step's reap
        if r.usage.completion_tokens >= r._max_tokens:  # a stream of max_tokens=0
            self._end(r, "length")
            return
        try:
            # edgeinfer's Sampler checks the logits itself; a caller's sampler may not
            if not isinstance(r._sampler, Sampler) and not np.isfinite(logits).all():
                raise errors.NonFiniteLogitsError("the logits contain inf or NaN")
            token = int(r._sampler(logits, r._context))
        except errors.NonFiniteLogitsError:
            self._end(r, "error", errors.NonFiniteLogitsError(
                f"the model's logits contain inf or NaN at generated token {len(r.tokens)} "
                f"(position {len(r._context) - 1})"
            ))  # fmt: skip
            return
        except Exception as e:  # a caller's sampler: this request fails, not the others
            self._end(r, "error", _typed(e))
            return
        now = time.monotonic()
        if r.first_token is None:
            r.first_token = now
            self.metrics.ttft.observe(now - r.submitted)
        else:
            self.metrics.inter_token.observe(now - r._last_token)
        r._last_token = now
        if self._is_eog(token):
            self._end(r, "stop")
            return
        r.tokens.append(token)
        r._context.append(token)
        r.usage.completion_tokens += 1
        self.metrics.generated_tokens += 1
        try:
            text, stopped = r._scanner.push(token)
        except Exception as e:  # a token the tokenizer cannot render: this request fails
            self._end(r, "error", _typed(e))
            return
        r.text = r._scanner.text
        lp = (_logprob(logits, token, r._logprobs),) if r._logprobs is not None else ()
        r._deliver(Piece(text, (token,), lp))
        evicts = r._session is not None and r._session.policy.evicts
        if stopped:
            self._end(r, "stop", flush=False)
        elif r._guard is not None and r._guard.loops(r.tokens):
            self._end(r, "repetition")
        elif len(r._context) > self._n_ctx and not evicts:
            self._end(r, "length")  # the context is full
        elif r.usage.completion_tokens >= r._max_tokens:
            if not r._stream:
                self._end(r, "length")
            else:  # evaluated at the reader's next call, which ends the stream
                r._final, r.state = True, "decode"
        else:
            r.state = "decode"

    def _end(
        self,
        r: Request,
        reason: str,
        error: BaseException | None = None,
        flush: bool = True,
        clear: bool = True,
    ) -> None:
        """Finishes ``r``: its sequence goes back (keyed blocks stay cached), its stream ends."""
        with self._cond:
            if r.state == "finished":
                return
            if r in self._running:
                self._running.remove(r)
            if r in self._waiting:
                self._waiting.remove(r)
            seq, r._seq = r._seq, -1
        if seq >= 0 and not r._stream:  # the model's own sequence keeps its cache
            try:
                if clear:
                    self._engine.seq_clear(seq)
            finally:
                with self._cond:
                    self._free.append(seq)
        piece = None
        if flush and reason in ("stop", "length", "repetition"):
            piece = Piece(r._scanner.flush())
            r.text = r._scanner.text
        r.finished = time.monotonic()
        self.metrics.requests[reason] += 1
        self.metrics.e2e.observe(r.finished - r.submitted)
        r._deliver(piece, reason, error)


def _logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """log-softmax of the raw logits (float64): the token's, and the ``top`` best."""
    x = logits.astype(np.float64)
    peak = x.max()
    lse = peak + math.log(float(np.exp(x - peak).sum()))
    best: tuple[tuple[int, float], ...] = ()
    if top:
        ids = np.argpartition(-x, top - 1)[:top]
        ids = ids[np.argsort(-x[ids], kind="stable")]
        best = tuple((int(i), float(x[i] - lse)) for i in ids)
    return TokenLogprob(int(token), float(x[token] - lse), best)


def _typed(e: BaseException) -> BaseException:
    """An error as a request reports it: edgeinfer's own as they are, others wrapped."""
    if isinstance(e, errors.EdgeInferError):
        return e
    return errors.BackendError(f"the batcher failed: {type(e).__name__}: {e}")


__all__ = ["Batcher", "BatcherMetrics", "Piece", "Request", "TokenLogprob", "Usage"]
