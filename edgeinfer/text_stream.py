"""A generation as an iterator of text: whole UTF-8 pieces, stop strings never emitted (not
even in part), and the stream's hold on its model released when it ends.

:class:`edgeinfer.api.Model` creates streams; this module owns the text concerns (decoding
token pieces, finding stop strings) that :mod:`edgeinfer.generation`, which deals in token ids,
leaves out.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

from edgeinfer import errors
from edgeinfer.generation import GenerationStats, Holder, generate_tokens

if TYPE_CHECKING:
    from edgeinfer.api import Model
    from edgeinfer.tokenizer.tokenizer import StreamDecoder


class TextStream:
    """Iterator of generated text pieces. Each piece is whole UTF-8 text; a stop string is
    never emitted, not even in part. After the iteration, ``stats``, ``tokens`` and ``text``
    describe what was generated."""

    def __init__(
        self, model: Model, prompt: list[int], sampler: Any, max_tokens: int, stops: list[str]
    ) -> None:
        self._model = model
        self.stats = GenerationStats()
        self.tokens: list[int] = []
        self.text = ""
        self._stopped = False  # close() or cancel() of this stream
        self._epoch: int | None = None  # the model's cancel count when this stream started
        self._holder = Holder(_weak_cancelled(self))  # the turns must not keep the stream alive
        self._reader: int | None = None  # the thread inside __next__
        self._lock = threading.Lock()  # one reader at a time
        tokens = generate_tokens(
            model._session, prompt, sampler,
            max_tokens=max_tokens, is_eog=model.tokenizer.is_eog,
            stats=self.stats, cancelled=self._cancelled, turn=self._turn,
        )  # fmt: skip
        self._pieces = self._run(tokens, stops)
        self._done = False

    def _cancelled(self) -> bool:
        model = self._model
        return (
            self._stopped
            or model._closing
            or (self._epoch is not None and self._epoch != model._cancel_epoch)
        )

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        with self._model._turns.step(self._holder, keep=True):
            if self._epoch is None:  # model.cancel() stops the streams started before it
                self._epoch = self._model._cancel_epoch
            yield

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason

    def _run(self, tokens: Iterator[int], stops: list[str]) -> Generator[str, None, None]:
        scanner = StopScanner(self._model.tokenizer.stream_decoder(), stops)
        try:
            for tok in tokens:
                self.tokens.append(tok)
                piece, stopped = scanner.push(tok)
                yield from self._emit(piece)
                if stopped:
                    self.stats.finish_reason = "stop"
                    return
            if self.stats.finish_reason != "cancelled":
                yield from self._emit(scanner.flush())
        finally:
            if not self.stats.finish_reason:
                self.stats.finish_reason = "cancelled"

    def _emit(self, piece: str) -> Iterator[str]:
        if piece:
            self.text += piece
            yield piece

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        if self._reader == threading.get_ident():
            raise errors.BusyError("the stream was read from inside its own step")
        with self._lock:
            if self._done:
                raise StopIteration
            self._reader = threading.get_ident()
            try:
                return next(self._pieces)
            except BaseException:
                self._finish()
                raise
            finally:
                self._reader = None

    def cancel(self) -> None:
        """Stops this stream after its current step (from any thread)."""
        self._stopped = True
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
            self._pieces.close()
            self._finish()
        finally:
            self._lock.release()

    def _finish(self) -> None:
        self._done = True
        if not self.stats.finish_reason:
            self.stats.finish_reason = "cancelled"
        self._model._turns.release(self._holder)

    def __del__(self) -> None:
        # no lock here (the collector may run inside any code): waiting calls see the flag
        self._holder.abandoned = True

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
