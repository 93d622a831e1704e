"""What a generation keeps between engine steps: the model's own sequence (its cached
tokens, context policy and prefix reuse), generation statistics, and the turns that let
several threads share that sequence.

The steps themselves run in :mod:`edgeinfer.batching`, one path for every generation; text
concerns (detokenizing, stop strings) live in :mod:`edgeinfer.text_stream`. This module deals
in token ids only.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from edgeinfer import errors
from edgeinfer.context_policy import ContextPolicy, make_room
from edgeinfer.engines.base import Batch, Engine


@dataclass
class GenerationStats:
    prompt_tokens: int = 0  # tokens in the prompt
    cached_tokens: int = 0  # of which were reused from the KV cache
    generated_tokens: int = 0
    prompt_s: float = 0.0  # time to evaluate the prompt
    ttft_s: float = 0.0  # from the request to the first generated token
    decode_s: float = 0.0  # from the first generated token to the last
    finish_reason: str = ""  # "stop", "length", "cancelled"
    started: float = field(default_factory=time.perf_counter, repr=False)

    @property
    def prompt_tok_s(self) -> float:
        n = self.prompt_tokens - self.cached_tokens
        return n / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def gen_tok_s(self) -> float:
        n = self.generated_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens,
            "prompt_tok_s": round(self.prompt_tok_s, 2),
            "gen_tok_s": round(self.gen_tok_s, 2),
            "ttft_s": round(self.ttft_s, 4),
            "finish_reason": self.finish_reason,
        }


def _never() -> bool:
    return False


@contextlib.contextmanager
def typed_memory_errors() -> Iterator[None]:
    """Python's MemoryError (numpy's names the bytes) as the typed OutOfMemoryError."""
    try:
        yield
    except errors.OutOfMemoryError:
        raise
    except MemoryError as e:
        raise errors.OutOfMemoryError(f"out of memory: {e}") from e


class KVSession:
    """An engine plus the token ids its cache holds, so that a new prompt that shares a prefix
    with the last one (the next turn of a chat) only evaluates what is new.

    ``version`` counts the changes of the cache: a generation that finds it where it left it
    decodes its next token; one that finds it changed (another call ran in between)
    re-evaluates its context first, reusing the prefix still cached.

    Past the context, ``policy`` (:mod:`edgeinfer.context_policy`) drops cached positions.
    ``history`` is then every token evaluated, the dropped ones included, and ``tokens`` what
    the cache holds: a prompt that extends ``history`` (the next turn of a long chat) only
    evaluates its new tokens."""

    def __init__(
        self, engine: Engine, n_batch: int = 512, policy: ContextPolicy | None = None,
        seq: int = 0,
    ) -> None:  # fmt: skip
        self.engine = engine
        self.seq = seq  # the engine's sequence this session keeps
        self.n_batch = n_batch
        self.policy = policy or ContextPolicy()
        self.policy.check(engine.n_ctx)
        self.tokens: list[int] = []
        self.history: list[int] = []
        # the runs (start, length) of history the cache no longer holds: in order, apart (one
        # run but for h2o), so that a stream of any length keeps a few numbers here
        self._dropped: list[tuple[int, int]] = []
        self.version = 0

    def reset(self) -> None:
        self.version += 1
        self.engine.truncate(0, self.seq)
        self.tokens, self.history, self._dropped = [], [], []

    @property
    def dropped_run(self) -> tuple[int | None, int]:
        """(start, length) of the run of ``history`` the cache no longer holds (None, 0);
        InvalidOptionError when it lost scattered tokens (h2o), which no state file holds."""
        if not self._dropped:
            return None, 0
        if len(self._dropped) > 1:
            raise errors.InvalidOptionError(
                f"the cache dropped {len(self._dropped)} scattered runs of tokens (the "
                f"{self.policy.name} policy): saving such a state is not supported"
            )
        return self._dropped[0]

    def restore(self, history: list[int], hole: int | None, dropped: int) -> None:
        """Takes the tokens of a cache the engine was given (edgeinfer.session_state):
        ``history`` less its run [hole, hole + dropped) is what the engine holds now."""
        self.version += 1
        self.history = list(history)
        cut = hole if hole is not None else len(history)
        self.tokens = self.history[:cut] + self.history[cut + dropped :]
        self._dropped = [(cut, dropped)] if hole is not None and dropped else []

    def prefill(
        self, prompt: list[int], cancelled: Callable[[], bool] = _never
    ) -> tuple[np.ndarray, int]:
        """Evaluates what of ``prompt`` is not cached; returns the last logits and the reuse."""
        if not prompt:
            raise errors.InvalidOptionError("the prompt is empty (no tokens to evaluate)")
        if len(prompt) >= self.engine.n_ctx and not self.policy.evicts:
            raise errors.ContextOverflowError(
                f"the prompt has {len(prompt)} tokens; the context holds {self.engine.n_ctx} "
                "(room is needed for at least one generated token)"
            )
        return self.evaluate(prompt, cancelled)

    def evaluate(
        self, tokens: list[int], cancelled: Callable[[], bool] = _never
    ) -> tuple[np.ndarray, int]:
        """The logits after ``tokens``, evaluating only what the cache does not hold already;
        returns them and how many of their tokens were reused.

        The cache holds ``history`` less the tokens the policy dropped: a prompt that leaves
        the history where a token is still cached, or right after a dropped run, keeps the
        cache up to there; one that leaves it inside a dropped run, up to that run, which is
        forgotten. A prompt that keeps nothing of the history takes what the engine's pool
        still caches of its prefix (another conversation's blocks: a common system prompt)."""
        n_common = self.start(tokens)
        return self._append(tokens[n_common:], cancelled), n_common

    def start(self, tokens: list[int]) -> int:
        """Keeps what the cache holds of ``tokens`` (as :meth:`evaluate` describes) and
        returns how many of them it holds: at most all but the last, which is evaluated for
        its logits. The caller then evaluates the rest: :meth:`make_room` for each chunk,
        the engine step, then :meth:`commit`."""
        self.version += 1
        n_common = 0
        for a, b in zip(self.history, tokens, strict=False):
            if a != b:
                break
            n_common += 1
        n_common = min(n_common, len(tokens) - 1)  # evaluate one token at least, for logits
        for start, length in self._dropped:  # leaving inside a dropped run: from its start
            if start < n_common < start + length:
                n_common = start
        self._dropped = [(a, n) for a, n in self._dropped if a < n_common]
        keep = n_common - sum(n for _, n in self._dropped)  # the cache position of it
        self.engine.truncate(keep, self.seq)
        if self.engine.seq_length(self.seq) < keep:  # a ring lost the window: from the start
            self.engine.truncate(0, self.seq)
            keep = n_common = 0
            self._dropped = []
        self.tokens = self.tokens[:keep]
        self.history = self.history[:n_common]
        if keep == 0:
            n_common = self._reuse(tokens)
            self.tokens, self.history = tokens[:n_common], tokens[:n_common]
        return n_common

    def _reuse(self, tokens: list[int]) -> int:
        """Positions of ``tokens`` the engine takes from its cached blocks (the native pool's
        prefix cache; none elsewhere, nor under h2o, whose scores a cached block lacks).

        Not for a prompt that overflows the context under a policy that drops positions:
        where it drops them depends on where its chunks begin, so a prompt must be cut the
        same way whatever happened to be cached (batch-invariant results)."""
        reuse = getattr(self.engine, "reuse", None)
        if reuse is None or self.policy.tracks_attention:
            return 0
        if self.policy.evicts and len(tokens) >= self.engine.n_ctx:
            return 0
        return int(reuse(self.seq, tokens))

    def decode(self, token: int) -> np.ndarray:
        self.version += 1
        return self._append([token], _never)

    @property
    def chunk_step(self) -> int:
        """The most tokens one engine step may add: n_batch, and under a policy that drops
        positions, what leaves room for the kept tokens and a window."""
        if self.policy.evicts:
            return max(1, min(self.n_batch, (self.engine.n_ctx - self.policy.kept) // 2))
        return self.n_batch

    def commit(self, chunk: list[int]) -> None:
        """Records ``chunk`` as evaluated after the cache (the engine step succeeded)."""
        self.version += 1
        self.tokens.extend(chunk)
        self.history.extend(chunk)

    def _append(self, new: list[int], cancelled: Callable[[], bool]) -> np.ndarray:
        """Evaluates ``new`` after the cache in chunks, making room for each as the policy
        says; the last token's logits."""
        step = self.chunk_step
        logits = None
        for start in range(0, len(new), step):
            if cancelled():
                raise errors.CancelledError("cancelled during the prompt")
            chunk = new[start : start + step]
            self.make_room(len(chunk))
            with typed_memory_errors():
                start = self.engine.seq_length(self.seq)
                logits = self.engine.decode(Batch.sequence(chunk, start, self.seq))[0]
            self.commit(chunk)
        assert logits is not None
        return logits

    def make_room(self, n_new: int) -> None:
        """Drops cached positions, as the policy says, so that ``n_new`` more fit."""
        runs = make_room(self.engine, self.policy, n_new, self.seq)
        if not runs:
            return
        added = self._history_runs(runs)
        for start, count in reversed(runs):
            del self.tokens[start : start + count]
        merged: list[tuple[int, int]] = []
        for start, length in sorted(self._dropped + added):
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self._dropped = merged

    def _history_runs(self, runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The runs of history that the runs (start, count) of cache positions hold, both
        lists walked once."""
        out: list[tuple[int, int]] = []
        i = pos = hist = 0  # the kept stretch from history[hist] is held from position pos
        for gap, length in [*self._dropped, (len(self.history), 0)]:
            n = gap - hist
            while i < len(runs) and runs[i][0] < pos + n:
                start, count = runs[i]
                lo, hi = max(pos, start), min(pos + n, start + count)
                if lo < hi:
                    out.append((hist + lo - pos, hi - lo))
                if start + count > pos + n:
                    break  # it goes on in the next kept stretch
                i += 1
            pos, hist = pos + n, gap + length
        return out


class FairLock:
    """A lock taken in arrival order. The batcher's worker takes the engine's lock for every
    step, and lets it go only to take it again: with a plain lock another caller (``logits``,
    ``reset``) could lose that race for seconds."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0  # the ticket the next caller takes
        self._serving = 0  # the ticket that holds the lock, or whose turn it is
        self._abandoned: set[int] = set()  # tickets whose callers gave up waiting

    def __enter__(self) -> FairLock:
        with self._cond:
            ticket = self._next
            self._next += 1
            try:
                while self._serving != ticket:
                    self._cond.wait()
            except BaseException:  # interrupted while waiting: its turn passes
                self._abandoned.add(ticket)
                self._skip_abandoned()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._serving += 1
            self._skip_abandoned()

    def _skip_abandoned(self) -> None:
        while self._serving in self._abandoned:
            self._abandoned.remove(self._serving)
            self._serving += 1
        self._cond.notify_all()


class Holder:
    """One call's claim on a model's turns: a stream keeps its turn between its steps."""

    def __init__(self, cancelled: Callable[[], bool] = _never) -> None:
        self.thread = threading.get_ident()
        self.cancelled = cancelled
        self.abandoned = False  # set when the stream is garbage-collected (no lock taken)


class Turns:
    """Who runs the model now. Calls queue in arrival order; the one whose turn it is runs
    its steps. A stream keeps its turn between its steps, so that one generation at a time
    runs to its end, unless it idles while others wait: its consumer thread itself makes
    another call, or it is cancelled or garbage-collected, or it has not been read for
    ``idle_s``. Then the next call takes the turn, and the stream, when read again, queues
    for a turn and re-evaluates its context (:class:`KVSession` keeps the common prefix)."""

    def __init__(self, idle_s: float = 0.25) -> None:
        self.idle_s = idle_s
        self._cond = threading.Condition()
        self._queue: deque[Holder] = deque()
        self._holder: Holder | None = None
        self._running = False  # the holder is inside a step
        self._idle_since = 0.0

    def _free_for(self, holder: Holder) -> float:
        """0 if ``holder`` may take the turn now, else how long to wait before asking again."""
        if self._holder is None or self._holder is holder:
            return 0.0 if self._queue[0] is holder else 1.0
        if self._running:
            return 1.0  # woken when the step ends
        h = self._holder
        if h.thread == holder.thread or h.abandoned or h.cancelled():
            return 0.0 if self._queue[0] is holder else 1.0
        left = self.idle_s - (time.monotonic() - self._idle_since)
        return 0.0 if left <= 0 and self._queue[0] is holder else max(left, 0.01)

    @contextlib.contextmanager
    def step(self, holder: Holder, keep: bool = False) -> Iterator[None]:
        """Runs the body as ``holder``'s step; ``keep`` holds the turn afterwards (a stream)."""
        with self._cond:
            h = self._holder
            if self._running and h is not None and h.thread == threading.get_ident():
                raise errors.BusyError("the model was called from inside its own step")
            if self._holder is not holder:
                self._queue.append(holder)
                try:
                    while (wait := self._free_for(holder)) > 0:
                        self._cond.wait(min(wait, 0.05))
                finally:
                    self._queue.remove(holder)
                self._holder = holder
            self._running = True
        try:
            yield
        finally:
            with self._cond:
                self._running = False
                self._idle_since = time.monotonic()
                if not keep:
                    self._holder = None
                self._cond.notify_all()

    def wake(self) -> None:
        """Lets waiting calls look again (after a cancel); never blocks, for signal handlers."""
        if self._cond.acquire(blocking=False):
            try:
                self._cond.notify_all()
            finally:
                self._cond.release()

    def release(self, holder: Holder) -> None:
        """Gives up ``holder``'s turn, if it still has it."""
        with self._cond:
            if self._holder is holder and not self._running:
                self._holder = None
                self._cond.notify_all()
