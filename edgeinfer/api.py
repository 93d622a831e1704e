"""The Python API: load a model, then tokenize, generate, stream, chat, score and close.

Everything here raises :class:`edgeinfer.errors.EdgeInferError` subclasses for bad input and
never prints or exits: it is meant to be embedded in other programs.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer import errors
from edgeinfer.chat import ChatTemplate, builtin_template
from edgeinfer.generation import GenerationStats, KVSession, generate_tokens
from edgeinfer.gguf import GGUFFile
from edgeinfer.models import config_from_gguf
from edgeinfer.sampling import Sampler, SamplingParams
from edgeinfer.system import physical_cores
from edgeinfer.tokenizer import Tokenizer

DEFAULT_N_CTX = 4096
MAX_N_CTX = 1 << 20  # unless the model was trained for more
_SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__)


@dataclass
class Completion:
    """The result of :meth:`Model.generate` and non-streamed :meth:`Model.chat`."""

    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats = field(repr=False)


class Model:
    """A loaded GGUF model. Create it with :func:`edgeinfer.load`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_threads: int | None = None,
        n_ctx: int | None = None,
        n_batch: int = 512,
        engine: str = "auto",
        kv_type: str = "f16",
        isa: str | None = None,
    ) -> None:
        t0 = time.perf_counter()
        if n_threads is not None:
            n_threads = _int_option("n_threads", n_threads, 1)
        n_batch = _int_option("n_batch", n_batch, 1)
        if n_ctx is not None:
            n_ctx = _int_option("n_ctx", n_ctx, 1)
        self.path = os.fspath(path)
        onnx = os.path.isdir(self.path)  # an exported ONNX folder: edgeinfer.onnx_engine
        if onnx:
            from edgeinfer.onnx_engine import OnnxFolder

            # a GGUFFile or an OnnxFolder: the engine registry (issue 8) gives each its own field
            self.gguf: Any = OnnxFolder(self.path)
        else:
            self.gguf = GGUFFile(self.path)
        try:
            self.config = self.gguf.config if onnx else config_from_gguf(self.gguf)
            self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
            if self.tokenizer.n_vocab != self.config.n_vocab:
                raise errors.TokenizerError(
                    f"{self.path}: vocabulary has {self.tokenizer.n_vocab} tokens, "
                    f"the embedding {self.config.n_vocab} rows"
                )
            if n_ctx is None:
                n_ctx = min(self.config.n_ctx_train, DEFAULT_N_CTX)
            n_ctx_max = max(self.config.n_ctx_train, MAX_N_CTX)
            if n_ctx > n_ctx_max:
                raise errors.InvalidOptionError(f"n_ctx must lie in [1, {n_ctx_max}], got {n_ctx}")
            self.n_ctx = n_ctx
            self.n_threads = n_threads or physical_cores()
            if onnx:
                self._engine = self.gguf.engine(engine, self.n_ctx, self.n_threads, kv_type)
            else:
                self._engine = self._make_engine(engine, kv_type, isa, n_batch)
        except BaseException:
            self.gguf.close()
            raise
        self._session = KVSession(self._engine, n_batch)
        self._closing = False
        self._cancel = threading.Event()
        self._busy = threading.Condition()
        self._active: TextStream | None = None
        self._template: ChatTemplate | None = None
        self.load_s = time.perf_counter() - t0

    def _make_engine(self, name: str, kv_type: str, isa: str | None, n_batch: int) -> Any:
        from edgeinfer import _native
        from edgeinfer.models.reference import ReferenceEngine

        if name not in ("auto", "native", "reference"):
            raise errors.InvalidOptionError(f"unknown engine {name!r} (auto, native, reference)")
        if name == "auto":
            name = "native" if _native.available()[0] else "reference"
        if name == "native":
            return _native.NativeEngine(
                self.gguf, self.config, self.n_ctx, n_threads=self.n_threads, kv_type=kv_type,
                isa=isa, n_batch=n_batch,
            )
        return ReferenceEngine(self.gguf, self.config, self.n_ctx, kv_type=kv_type)

    # --- properties ------------------------------------------------------------------------

    @property
    def engine(self) -> str:
        return self._engine.name

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.gguf.metadata

    @property
    def n_vocab(self) -> int:
        return self.config.n_vocab

    def _check_open(self) -> None:
        if self._engine is None or self._closing:
            raise errors.ModelClosedError("the model is closed")

    # --- tokens ----------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, with llama.cpp's meaning of the two flags."""
        self._check_open()
        return self.tokenizer.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int], remove_special: bool = False) -> str:
        """The text of ``tokens`` (control tokens render as nothing)."""
        return self.tokenizer.detokenize(self._check_tokens(tokens, allow_empty=True), remove_special=remove_special)

    # --- scoring ---------------------------------------------------------------------------

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits at every position, shape (n_tokens, n_vocab), for a fresh sequence."""
        tokens = self._check_tokens(tokens)
        if len(tokens) > self.n_ctx:
            raise errors.ContextOverflowError(
                f"{len(tokens)} tokens do not fit the context of {self.n_ctx}"
            )
        with self._exclusive():
            self._session.reset()
            out = np.empty((len(tokens), self.n_vocab), dtype=np.float32)
            step = self._session.n_batch
            for start in range(0, len(tokens), step):
                chunk = tokens[start : start + step]
                out[start : start + len(chunk)] = self._engine.forward(chunk, all_logits=True)
                self._session.tokens.extend(chunk)
            return out

    def _check_tokens(self, tokens: Sequence[int], allow_empty: bool = False) -> list[int]:
        self._check_open()
        if isinstance(tokens, (str, bytes, bytearray)) or not hasattr(tokens, "__iter__"):
            raise errors.InvalidOptionError(
                f"expected text or a sequence of token ids, got {type(tokens).__name__}"
            )
        ids = []
        for t in tokens:
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                raise errors.InvalidOptionError(f"token ids must be integers, got {t!r}")
            if not 0 <= t < self.n_vocab:
                raise errors.InvalidOptionError(f"token id {t} is outside [0, {self.n_vocab})")
            ids.append(int(t))
        if not ids and not allow_empty:
            raise errors.InvalidOptionError("no tokens given")
        return ids

    # --- generation ------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], **options: Any) -> Completion:
        """Generates a completion of ``prompt``; see :meth:`stream` for the options."""
        s = self.stream(prompt, **options)
        text = "".join(s)
        return Completion(text, s.tokens, s.stats.finish_reason, s.stats)

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        stop: str | Sequence[str] = (),
        parse_special: bool = False,
        add_special: bool = True,
        sampler: Any = None,
        **sampling: Any,
    ) -> TextStream:
        """An iterator of text pieces. Options: max_tokens (-1: until the context is full),
        stop strings, and the fields of :class:`SamplingParams` (temperature, top_k, top_p,
        min_p, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, seed),
        or a ready ``sampler`` callable ``(logits, history) -> token``."""
        self._check_open()
        sampler = self._sampler(sampler, sampling)
        if isinstance(max_tokens, (int, np.integer)) and max_tokens == -1:
            max_tokens = self.n_ctx
        elif isinstance(max_tokens, (int, np.integer)) and max_tokens < 0:
            raise errors.InvalidOptionError(f"max_tokens must be >= 0 or -1, got {max_tokens}")
        max_tokens = _int_option("max_tokens", max_tokens, 0)
        stops = _stop_strings(stop)
        ids = self._prompt_ids(prompt, add_special, parse_special)
        self._acquire()
        return TextStream(self, ids, sampler, max_tokens, stops)

    def _sampler(self, sampler: Any, sampling: dict[str, Any]) -> Any:
        unknown = set(sampling) - _SAMPLING_FIELDS
        if unknown:
            raise errors.InvalidOptionError(f"unknown option(s): {', '.join(sorted(unknown))}")
        if sampler is None:
            return Sampler(SamplingParams(**sampling))
        if sampling:
            raise errors.InvalidOptionError("pass either a sampler or sampling options, not both")
        if not callable(sampler):
            raise errors.InvalidOptionError("sampler must be a callable (logits, history) -> token id")
        return _CheckedSampler(sampler, self.n_vocab)

    def _prompt_ids(self, prompt: Any, add_special: bool, parse_special: bool) -> list[int]:
        """The prompt's token ids, checked to leave room for one generated token."""
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=add_special, parse_special=parse_special)
        else:
            ids = self._check_tokens(prompt, allow_empty=True)
        if not ids:
            raise errors.InvalidOptionError("the prompt is empty: no tokens to start from")
        if len(ids) >= self.n_ctx:
            raise errors.ContextOverflowError(
                f"the prompt has {len(ids)} tokens; the context holds {self.n_ctx} "
                "(room is needed for at least one generated token)"
            )
        return ids

    def cancel(self) -> None:
        """Stops the generation in progress (from any thread) at the next token or chunk."""
        self._cancel.set()

    def reset(self) -> None:
        """Forgets the cached conversation (the next prompt is evaluated from scratch)."""
        with self._exclusive():
            self._session.reset()

    # --- chat ------------------------------------------------------------------------------

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's own template (``tokenizer.chat_template``) or the built-in that fits."""
        self._check_open()
        if self._template is None:
            tok = self.tokenizer
            bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
            eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
            source = self.gguf.metadata.get("tokenizer.chat_template")
            if isinstance(source, str) and source.strip():
                self._template = ChatTemplate(source, bos_token=bos, eos_token=eos, name="model")
            else:
                name, source = builtin_template(self.config.arch, tok.vocab.token_to_id)
                self._template = ChatTemplate(source, bos_token=bos, eos_token=eos, name=name)
        return self._template

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The prompt tokens of a conversation: its template rendering, special tokens parsed."""
        if isinstance(messages, Sequence) and not isinstance(messages, (str, bytes)) and not messages:
            raise errors.InvalidOptionError("the conversation has no messages")
        text = self.render_chat(messages)
        bos = self.chat_template.bos_token
        # templates usually write the BOS text themselves; do not add a second one
        add = not (bos and text.startswith(bos))
        return self.tokenize(text, add_special=add, parse_special=True)

    def chat(
        self, messages: Sequence[Mapping[str, Any]], *, stream: bool = False, **options: Any
    ) -> Completion | TextStream:
        """Replies to a conversation (a list of {"role", "content"} dicts) with the model's
        chat template; ``stream=True`` returns a :class:`TextStream`."""
        s = self.stream(self.chat_tokens(messages), **options)
        if stream:
            return s
        text = "".join(s)
        return Completion(text, s.tokens, s.stats.finish_reason, s.stats)

    # --- lifetime --------------------------------------------------------------------------

    def _acquire(self) -> None:
        with self._busy:
            active = self._active
            if active is not None and active._thread == threading.get_ident():
                active.close()  # an abandoned stream of this thread
            while self._active is not None:
                self._busy.wait()
            self._check_open()
            self._cancel.clear()
            self._active = _RESERVED

    def _release(self) -> None:
        with self._busy:
            self._active = None
            self._busy.notify_all()

    def _exclusive(self) -> _Exclusive:
        return _Exclusive(self)

    def close(self) -> None:
        """Frees the engine and unmaps the file; the model cannot be used afterwards.

        Any thread may call it: a generation running in another thread is cancelled and
        finishes its current step before the engine goes away."""
        with self._busy:
            if self._engine is None or self._closing:
                return
            self._closing = True  # no new request starts from now on
        self.cancel()
        self._stop_active()
        engine, self._engine = self._engine, None
        if hasattr(engine, "close"):
            engine.close()
        self._session = None  # type: ignore[assignment]  # closed: nothing uses it again
        self.gguf.close()

    def _stop_active(self) -> None:
        """Ends the request in progress, waiting for one that runs in another thread."""
        while True:
            with self._busy:
                active = self._active
                if active is None:
                    return
                if active is _RESERVED:  # logits() or reset() elsewhere: wait for its end
                    self._busy.wait(0.05)
                    continue
            active.close()
            if not active._done:  # its generator is running right now
                if active._thread == threading.get_ident():
                    raise errors.InvalidOptionError(
                        "close() was called from inside the model's own generation"
                    )
                with self._busy:
                    self._busy.wait(0.01)  # it sees the cancellation after this step

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:  # noqa: SIM105 (not contextlib.suppress: at interpreter exit module globals may be gone)
            self.close()
        except Exception:
            pass


class _Exclusive:
    def __init__(self, model: Model) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.model._acquire()

    def __exit__(self, *exc: object) -> None:
        self.model._release()


class TextStream:
    """Iterator of generated text pieces. Each piece is whole UTF-8 text; a stop string is
    never emitted, not even in part. After the iteration, ``stats``, ``tokens`` and ``text``
    describe what was generated."""

    def __init__(
        self, model: Model, prompt: list[int], sampler: Any, max_tokens: int, stops: list[str]
    ) -> None:
        self._model = model
        self._thread = threading.get_ident()
        self.stats = GenerationStats()
        self.tokens: list[int] = []
        self.text = ""
        model._active = self
        tokens = generate_tokens(
            model._session, prompt, sampler,
            max_tokens=max_tokens, is_eog=model.tokenizer.is_eog,
            stats=self.stats, cancel=model._cancel,
        )  # fmt: skip
        self._pieces = self._run(tokens, stops)
        self._done = False

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason

    def _run(self, tokens: Iterator[int], stops: list[str]) -> Generator[str, None, None]:
        decoder = self._model.tokenizer.stream_decoder()
        longest = max((len(s) for s in stops), default=0)
        full = ""  # everything decoded; self.text is the part already handed out
        try:
            for tok in tokens:
                self.tokens.append(tok)
                full += decoder.push(tok)
                emitted = len(self.text)
                safe = len(full)
                if stops:
                    hit = _find_stop(full, stops, max(0, emitted - longest))
                    if hit >= 0:
                        yield from self._emit(full[emitted:hit])
                        self.stats.finish_reason = "stop"
                        return
                    safe -= _partial_stop(full, stops, longest)
                yield from self._emit(full[emitted:safe])
            if self.stats.finish_reason != "cancelled":
                full += decoder.flush()
                yield from self._emit(full[len(self.text) :])
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
        if self._done:
            raise StopIteration
        try:
            return next(self._pieces)
        except BaseException:
            self._finish()
            raise

    def cancel(self) -> None:
        self._model.cancel()

    def close(self) -> None:
        """Stops the generation; the model is free for the next request. From a thread other
        than the one iterating, it cancels: the stream ends after its current step."""
        if not self._done:
            try:
                self._pieces.close()
            except ValueError:  # running in another thread right now
                self._model.cancel()
                return
            self._finish()

    def _finish(self) -> None:
        with self._model._busy:  # the consumer and a closing thread may both get here
            if not self._done:
                self._done = True
                if self._model._active is self:
                    self._model._release()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_RESERVED: Any = object()  # marks the model busy with a request that is not a stream


class _CheckedSampler:
    """A caller's sampler, whose answers must be token ids of the model."""

    def __init__(self, sampler: Any, n_vocab: int) -> None:
        self.sampler, self.n_vocab = sampler, n_vocab

    def __call__(self, logits: np.ndarray, history: list[int]) -> int:
        token = self.sampler(logits, history)
        if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
            raise errors.InvalidOptionError(f"the sampler returned {token!r}, not a token id")
        if not 0 <= token < self.n_vocab:
            raise errors.InvalidOptionError(f"the sampler returned token id {token}, outside [0, {self.n_vocab})")
        return int(token)


def _stop_strings(stop: Any) -> list[str]:
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


def load(
    path: str | os.PathLike[str],
    n_threads: int | None = None,
    n_ctx: int | None = None,
    **options: Any,
) -> Model:
    """Opens a GGUF model file (memory-mapped) and returns a ready :class:`Model`.

    Further options: ``n_batch`` (prompt tokens per engine call), ``engine`` ("auto", "native",
    "reference"), ``kv_type`` ("f16", "f32") and ``isa`` (force an instruction-set variant).
    """
    unknown = set(options) - _LOAD_OPTIONS
    if unknown:
        raise errors.InvalidOptionError(f"unknown load option(s): {', '.join(sorted(unknown))}")
    return Model(path, n_threads=n_threads, n_ctx=n_ctx, **options)


_LOAD_OPTIONS = frozenset({"n_batch", "engine", "kv_type", "isa"})


def _int_option(name: str, value: Any, lo: int) -> int:
    """``value`` as an int >= ``lo``; bools, floats and strings are refused, not converted."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise errors.InvalidOptionError(f"{name} must be an integer, got {value!r}")
    if value < lo:
        raise errors.InvalidOptionError(f"{name} must be >= {lo}, got {value}")
    return int(value)
