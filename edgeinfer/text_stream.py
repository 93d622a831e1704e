"""A generation as an iterator of text: whole UTF-8 pieces, stop strings never emitted (not
even in part), and the stream's hold on its model released when it ends.

:class:`edgeinfer.api.Model` creates streams; this module owns the text concerns (decoding
token pieces, finding stop strings) that :mod:`edgeinfer.generation`, which deals in token ids,
leaves out.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from edgeinfer import errors
from edgeinfer.generation import GenerationStats, Holder

if TYPE_CHECKING:
    from edgeinfer.api import Model
    from edgeinfer.batching import Piece
    from edgeinfer.repetition import RepetitionGuard
    from edgeinfer.tokenizer.tokenizer import StreamDecoder


class TextStream:
    """Iterator of generated text pieces. Each piece is whole UTF-8 text; a stop string is
    never emitted, not even in part. After the iteration, ``stats``, ``tokens`` and ``text``
    describe what was generated.

    The generation is a request of the model's batcher on the model's own sequence: its
    steps run on the batcher's worker, beside any submitted requests, and only while this
    stream is read (a reader holds the model's turn)."""

    def __init__(
        self, model: Model, prompt: list[int], sampler: Any, max_tokens: int, stops: list[str],
        guard: RepetitionGuard | None = None,
    ) -> None:  # fmt: skip
        self._model = model
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.tokens: list[int] = []
        self.text = ""
        self._stopped = False  # close() or cancel() of this stream
        self._epoch: int | None = None  # the model's cancel count when this stream started
        cancelled = _weak_cancelled(self)  # the turns and the batcher must not keep it alive
        self._holder = Holder(cancelled)
        self._reader: int | None = None  # the thread inside __next__
        self._lock = threading.Lock()  # one reader at a time
        self._batcher = model._worker()
        scanner = StopScanner(model.tokenizer.stream_decoder(), stops)
        self._request = self._batcher.stream_request(
            model._session, prompt, sampler, max_tokens, scanner, cancelled, guard
        )
        self._done = False
        self._first: float | None = None  # when the first token came

    def _cancelled(self) -> bool:
        model = self._model
        return (
            self._stopped
            or model._closing
            or (self._epoch is not None and self._epoch != model._cancel_epoch)
        )

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        if self._reader == threading.get_ident() or self._batcher.on_worker:
            raise errors.BusyError("the stream was read from inside its own step")
        with self._lock:
            if self._done:
                raise StopIteration
            self._reader = threading.get_ident()
            try:
                while True:
                    piece = self._next_piece()
                    if piece is None:
                        raise StopIteration
                    self._take(piece)
                    if piece.text:
                        return piece.text
            except BaseException:
                self._finish()
                raise
            finally:
                self._reader = None

    def __aiter__(self) -> TextStream:
        return self

    async def __anext__(self) -> str:
        """``async for piece in model.stream(...)``: each piece is read on a thread of the
        loop's executor (the model's turns are thread locks), so the loop goes on meanwhile;
        a consumer task cancelled while it waits cancels the stream."""
        step = asyncio.ensure_future(asyncio.to_thread(self._next_or_none))
        try:
            piece = await asyncio.shield(step)
        except asyncio.CancelledError:
            # the step in flight ends (within one step) and the stream is finished before the
            # task's cancellation completes: its finish reason is then "cancelled"
            self.cancel()
            with contextlib.suppress(BaseException):
                await step
            self.close()
            raise
        if piece is None:
            raise StopAsyncIteration
        return piece

    def _next_or_none(self) -> str | None:
        return next(self, None)  # StopIteration cannot cross into a future

    def _next_piece(self) -> Piece | None:
        """The request's next piece (None at its end), run in this stream's turn."""
        r = self._request
        if r._pieces or r.done:  # one it left at its end (the text held back)
            return r._next_piece()
        with self._model._turns.step(self._holder, keep=True):
            if self._epoch is None:  # model.cancel() stops the streams started before it
                self._epoch = self._model._cancel_epoch
            self._batcher.grant(r)
            return r._next_piece()

    def _take(self, piece: Piece) -> None:
        if piece.tokens:
            if self._first is None:
                self._first = time.perf_counter()
                self.stats.ttft_s = self._first - self.stats.started
            self.tokens.extend(piece.tokens)
            self.stats.generated_tokens = len(self.tokens)
            self.stats.decode_s = time.perf_counter() - self._first
        self.text += piece.text

    def cancel(self) -> None:
        """Stops this stream after its current step (from any thread)."""
        self._stopped = True
        self._request.cancel()
        self._model._turns.wake()

    def close(self) -> None:
        """Stops the generation; the model is free for the next request. From a thread other
        than the one reading, it cancels: the stream ends after its current step."""
        if self._done:
            return
        if not self._lock.acquire(blocking=False):  # being read in another thread right now
            self.cancel()
            return
        try:
            self._finish()
        finally:
            self._lock.release()

    def _finish(self) -> None:
        self._done = True
        r = self._request
        if not r.done:  # stopped early: the batcher drops it at its next step
            r.cancel()
        s = self.stats
        s.finish_reason = r.finish_reason or "cancelled"
        s.cached_tokens = r.usage.cached_tokens
        if r.admitted is not None and r.first_token is not None:
            s.prompt_s = r.first_token - r.admitted
        self._model._turns.release(self._holder)

    def __del__(self) -> None:
        # no lock here (the collector may run inside any code): waiting calls see the flags
        self._holder.abandoned = True
        request = getattr(self, "_request", None)  # None: __init__ failed before it
        if request is not None:
            request._cancelled = True

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _weak_cancelled(stream: TextStream) -> Any:
    ref = weakref.ref(stream)

    def cancelled() -> bool:
        s = ref()
        return s is None or s._cancelled()

    return cancelled


class StopScanner:
    """Generated tokens to text: whole characters only, and never a stop string, nor the part
    of one that a later token may complete (it is held back until it cannot)."""

    def __init__(self, decoder: StreamDecoder, stops: list[str]) -> None:
        self._decoder = decoder
        self._stops = stops
        self._longest = max((len(s) for s in stops), default=0)
        self._full = ""  # everything decoded
        self.text = ""  # the part handed out

    def push(self, token: int) -> tuple[str, bool]:
        """The text that ``token`` lets out, and whether a stop string ended the text there."""
        self._full += self._decoder.push(token)
        emitted, safe = len(self.text), len(self._full)
        stopped = False
        if self._stops:
            hit = _find_stop(self._full, self._stops, max(0, emitted - self._longest))
            if hit >= 0:
                safe, stopped = hit, True
            else:
                safe -= _partial_stop(self._full, self._stops, self._longest)
        piece = self._full[emitted:safe]
        self.text += piece
        return piece, stopped

    def flush(self) -> str:
        """What is left at the end of the generation (held-back bytes and text)."""
        self._full += self._decoder.flush()
        piece = self._full[len(self.text) :]
        self.text += piece
        return piece


def stop_strings(stop: Any) -> list[str]:
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise errors.InvalidOptionError("stop must be a non-empty string or a list of them")
    return list(stops)


def _find_stop(text: str, stops: list[str], start: int) -> int:
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else -1


def _partial_stop(text: str, stops: list[str], longest: int) -> int:
    """Length of the longest tail of ``text`` that begins some stop string."""
    for n in range(min(longest - 1, len(text)), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in stops):
            return n
    return 0
