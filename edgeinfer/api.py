"""The Python API: load a model, then tokenize, generate, stream, chat, score and close.

The model facade lives here; a stream's text handling (pieces, stop strings) lives in
:mod:`edgeinfer.text_stream`.

Everything here raises :class:`edgeinfer.errors.EdgeInferError` subclasses for bad input and
never prints or exits: it is meant to be embedded in other programs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer import engines, errors, gpu_offload, session_state, system
from edgeinfer.batching import Batcher, Request
from edgeinfer.chat import ChatTemplate, builtin_template
from edgeinfer.context_policy import DEFAULT_N_SINK, ContextPolicy
from edgeinfer.engines.base import MAX_N_BATCH, MAX_N_THREADS
from edgeinfer.engines.onnxruntime import OnnxFolder
from edgeinfer.generation import (
    FairLock,
    GenerationStats,
    Holder,
    KVSession,
    Turns,
    typed_memory_errors,
)
from edgeinfer.gguf import GGUFFile
from edgeinfer.gguf.reader import model_path
from edgeinfer.gpu_offload import OffloadPlan
from edgeinfer.kv_cache import (
    CACHE_TYPES,
    DEFAULT_CACHE_TYPE,
    KIVI_GROUP,
    KIVI_RESIDUAL,
    cache_type,
    check_kivi_options,
)
from edgeinfer.models import config_from_gguf
from edgeinfer.models.base import DecoderConfig
from edgeinfer.options import flags, int_option, max_tokens_option, parse_size
from edgeinfer.repetition import RepetitionGuard
from edgeinfer.repetition import repetition_guard as repetition_guard_option
from edgeinfer.sampling import Sampler, SamplingParams
from edgeinfer.text_stream import TextStream, stop_strings
from edgeinfer.tokenizer import Tokenizer

DEFAULT_N_CTX = 4096
MAX_N_CTX = 1 << 20  # unless the model was trained for more
_SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__)
# contexts a conversation may span under a context policy (the template text cap grows by it)
HISTORY_CONTEXTS = 64
MAX_N_PARALLEL = 63  # the native engine's 64 sequences, less the model's own
# a rendered chat prompt longer than this per token of n_ctx cannot fit the context: refused
# before it is tokenized (the longest pieces of real vocabularies are far shorter)
CHARS_PER_TOKEN = 32


@dataclass
class Completion:
    """The result of :meth:`Model.generate` and non-streamed :meth:`Model.chat`."""

    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats = field(repr=False)


class Model:
    """A loaded GGUF model. Create it with :func:`edgeinfer.load`.

    Every generation runs on the model's batcher (:mod:`edgeinfer.batching`), whose worker
    thread makes all engine steps: requests from :meth:`submit` each on a sequence of their
    own, and this model's streams (:meth:`stream`, :meth:`generate`, :meth:`chat`) on the
    model's own sequence, in the same steps.

    Threads: any thread may call any method. The calls that use the model's own sequence
    queue and run one at a time, in arrival order; none fails for being concurrent. A stream
    keeps that sequence between its tokens until it ends, so its generations do not
    interleave, unless it idles while another call waits (its own thread makes another call,
    it is cancelled, garbage-collected, or not read for a quarter of a second): then the
    waiting call runs, and the stream, when read again, re-evaluates its context and goes
    on. A stream computes a token only while it is read. A call from inside a step (a
    sampler's) is a BusyError. ``cancel()`` stops the calls running when it is called,
    within one step; ``close()`` cancels them, waits for the step in progress, and makes
    every later call raise ModelClosedError.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_threads: int | None = None,
        n_ctx: int | None = None,
        n_batch: int = 512,
        engine: str = "auto",
        kv_type: str | None = None,
        isa: str | None = None,
        cache_type_k: str | None = None,
        cache_type_v: str | None = None,
        swa_full: bool = False,
        context_policy: str = "error",
        n_keep: int = 0,
        n_sink: int = DEFAULT_N_SINK,
        kv_budget: int | str | None = None,
        kivi_group: int = KIVI_GROUP,
        kivi_residual: int = KIVI_RESIDUAL,
        fixed_threads: bool = False,
        n_parallel: int = 0,
        progress: Callable[[float], Any] | None = None,
        memory_check: bool = True,
        n_gpu_layers: int | str = 0,
        gpu_device: int = -1,
    ) -> None:
        t0 = time.perf_counter()
        report = _LoadProgress(progress)
        self._engine: engines.Engine | None = None
        self._batcher: Batcher | None = None
        self._closing = False
        if n_threads is not None:
            n_threads = int_option("n_threads", n_threads, 1, MAX_N_THREADS)
        n_batch = int_option("n_batch", n_batch, 1, MAX_N_BATCH)
        self.n_parallel = int_option("n_parallel", n_parallel, 0, MAX_N_PARALLEL)
        if n_batch < self.n_parallel + 1:
            raise errors.InvalidOptionError(
                f"n_batch {n_batch} cannot hold a decoding token of each of {self.n_parallel} "
                "batched sequences and the model's own"
            )
        flags(swa_full=swa_full, fixed_threads=fixed_threads, memory_check=memory_check)
        asked_cache_types = _cache_types(kv_type, cache_type_k, cache_type_v)
        policy = ContextPolicy(context_policy, n_keep=n_keep, n_sink=n_sink)
        budget = _kv_budget(kv_budget)
        kivi_group = int_option("kivi_group", kivi_group, 1, 1 << 20)
        kivi_residual = int_option("kivi_residual", kivi_residual, 0, 1 << 30)
        if n_ctx is not None:
            n_ctx = int_option("n_ctx", n_ctx, 1)
        self.path = model_path(path)
        model_format = "onnx" if os.path.isdir(self.path) else "gguf"
        spec = engines.select(engine, model_format)
        if 1 + self.n_parallel > spec.max_sequences:
            raise errors.InvalidOptionError(
                f"n_parallel {self.n_parallel} needs {1 + self.n_parallel} sequences; the "
                f"{spec.name} engine holds {spec.max_sequences}"
            )
        report(0.0)
        self.source: GGUFFile | OnnxFolder
        if model_format == "onnx":  # an exported ONNX folder: edgeinfer.engines.onnxruntime
            self.source = OnnxFolder(self.path)
        else:
            self.source = GGUFFile(self.path)
        try:
            report(0.4)
            self.config = (
                self.source.config if isinstance(self.source, OnnxFolder)
                else config_from_gguf(self.source)
            )  # fmt: skip
            self.tokenizer = Tokenizer.from_metadata(self.source.metadata)
            if self.tokenizer.n_vocab != self.config.n_vocab:
                raise errors.TokenizerError(
                    f"{self.path}: vocabulary has {self.tokenizer.n_vocab} tokens, "
                    f"the embedding {self.config.n_vocab} rows"
                )
            report(0.6)
            if n_ctx is None:
                n_ctx = min(self.config.n_ctx_train, DEFAULT_N_CTX)
            n_ctx_max = max(self.config.n_ctx_train, MAX_N_CTX)
            if n_ctx > n_ctx_max:
                raise errors.InvalidOptionError(f"n_ctx must lie in [1, {n_ctx_max}], got {n_ctx}")
            self.n_ctx = n_ctx
            self.n_threads = n_threads or system.physical_cores()
            self._kv_types = asked_cache_types or _recommended_cache_types(
                self.source.metadata, self.path
            )
            check_kivi_options(*self._kv_types, kivi_group, kivi_residual)
            self.n_gpu_layers = _gpu_layers(n_gpu_layers, self.config.n_layer, spec.name)
            options = engines.EngineOptions(
                n_ctx=self.n_ctx, n_threads=self.n_threads, n_batch=n_batch,
                cache_type_k=self._kv_types[0], cache_type_v=self._kv_types[1], isa=isa,
                swa_full=swa_full, kv_budget=budget, track_attention=policy.tracks_attention,
                kivi_group=kivi_group, kivi_residual=kivi_residual, fixed_threads=fixed_threads,
                n_seq_max=1 + self.n_parallel, n_gpu_layers=self.n_gpu_layers,
                gpu_device=int_option("gpu_device", gpu_device, -1, 1 << 16),
            )  # fmt: skip
            with typed_memory_errors():
                self._engine = engines.create(spec, self.source, self.config, options)
            plan = self._engine.gpu_plan
            if plan is not None:  # what auto chose, or the number asked
                self.n_gpu_layers = plan.n_gpu_layers
        except BaseException:
            self.source.close()
            raise
        self._engine_name = self._engine.name
        try:
            report(0.9)
            if memory_check:
                _check_memory(self._engine, _model_bytes(self.path))
            if policy.evicts and not self._engine.can_discard:
                raise errors.InvalidOptionError(
                    f"context_policy {policy.name} needs an engine that drops cached positions "
                    f"(native or reference), not {self._engine.name}"
                )
            if policy.tracks_attention and not self._engine.tracks_attention:
                raise errors.InvalidOptionError(
                    f"context_policy {policy.name} needs an engine that sums attention "
                    f"(native or reference), not {self._engine.name}"
                )
            self._session = KVSession(self._engine, n_batch, policy)
        except BaseException:
            self._engine.close()
            self.source.close()
            raise
        self._turns = Turns()  # who uses the model's own sequence (seq 0) now
        self._engine_lock = FairLock()  # held for each engine step, and each call between
        self._batcher_lock = threading.Lock()
        self._cancel_epoch = 0  # cancel() counts up; a call started before it stops
        self._template: ChatTemplate | None = None
        self.load_s = time.perf_counter() - t0
        try:
            report(1.0)
        except BaseException:
            self.close()
            raise

    # --- properties ------------------------------------------------------------------------

    @property
    def engine(self) -> str:
        """The engine's registry name (see :mod:`edgeinfer.engines`), also after close()."""
        return self._engine_name

    @property
    def context_policy(self) -> ContextPolicy:
        """What a sequence does at the end of the context (load's ``context_policy``)."""
        return self._session.policy

    @property
    def cache_types(self) -> tuple[str, str]:
        """The KV cache's (keys, values) types: load()'s options, else the file's
        recommendation (RECOMMENDED_CACHE_KEYS), else f16."""
        return self._kv_types

    @property
    def gpu_plan(self) -> OffloadPlan | None:
        """What layer offload put on the Vulkan device, the bytes of each part and the free
        memory it was fitted to, and why fewer than every layer went (n_gpu_layers "auto");
        None for an engine without offload. Its ``describe()`` is what the CLI prints."""
        self._check_open()
        assert self._engine is not None
        return self._engine.gpu_plan

    @property
    def backend(self) -> engines.Engine:
        """The engine object, for tools such as ``bench`` (its protocol: engines.Engine)."""
        self._check_open()
        assert self._engine is not None
        return self._engine

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.source.metadata

    @property
    def n_vocab(self) -> int:
        return self.config.n_vocab

    def _check_open(self) -> None:
        if self._engine is None or self._closing:
            raise errors.ModelClosedError("the model is closed")

    # --- tokens ----------------------------------------------------------------------------

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        """Token ids of ``text``, with llama.cpp's meaning of the two flags."""
        self._check_open()
        flags(add_special=add_special, parse_special=parse_special)
        return self.tokenizer.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int], remove_special: bool = False) -> str:
        """The text of ``tokens`` (control tokens render as nothing)."""
        flags(remove_special=remove_special)
        return self.tokenizer.detokenize(
            self._check_tokens(tokens, allow_empty=True), remove_special=remove_special
        )

    # --- scoring ---------------------------------------------------------------------------

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits at every position, shape (n_tokens, n_vocab), for a fresh sequence."""
        tokens = self._check_tokens(tokens)
        if len(tokens) > self.n_ctx:
            raise errors.ContextOverflowError(
                f"{len(tokens)} tokens do not fit the context of {self.n_ctx}"
            )
        with typed_memory_errors():
            out = np.empty((len(tokens), self.n_vocab), dtype=np.float32)
        with self._one_turn() as cancelled:
            self._session.reset()
            step = self._session.n_batch
            for start in range(0, len(tokens), step):
                if cancelled():
                    raise errors.CancelledError("logits() was cancelled")
                chunk = tokens[start : start + step]
                with typed_memory_errors():
                    out[start : start + len(chunk)] = self.backend.forward(chunk, all_logits=True)
                self._session.tokens.extend(chunk)
                self._session.history.extend(chunk)
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
        repetition_guard: bool | RepetitionGuard = False,
        sampler: Any = None,
        **sampling: Any,
    ) -> TextStream:
        """An iterator of text pieces. Options: max_tokens (-1: until the context is full),
        stop strings, ``repetition_guard`` (True, or a :class:`RepetitionGuard`: the reply
        ends with finish_reason "repetition" once it loops), and the fields of
        :class:`SamplingParams` (temperature, top_k, top_p, min_p, repeat_penalty,
        repeat_last_n, presence_penalty, frequency_penalty, seed), or a ready ``sampler``
        callable ``(logits, history) -> token``."""
        self._check_open()
        flags(parse_special=parse_special, add_special=add_special)
        guard = repetition_guard_option(repetition_guard)
        sampler = self._sampler(sampler, sampling)
        unbounded = sys.maxsize if self._session.policy.evicts else self.n_ctx
        max_tokens = max_tokens_option(max_tokens, unbounded)
        stops = stop_strings(stop)
        ids = self._prompt_ids(prompt, add_special, parse_special)
        return TextStream(self, ids, sampler, max_tokens, stops, guard)

    def _sampler(self, sampler: Any, sampling: dict[str, Any]) -> Any:
        unknown = set(sampling) - _SAMPLING_FIELDS
        if unknown:
            raise errors.InvalidOptionError(f"unknown option(s): {', '.join(sorted(unknown))}")
        if sampler is None:
            return Sampler(SamplingParams(**sampling))
        if sampling:
            raise errors.InvalidOptionError("pass either a sampler or sampling options, not both")
        if not callable(sampler):
            raise errors.InvalidOptionError(
                "sampler must be a callable (logits, history) -> token id"
            )
        return _CheckedSampler(sampler, self.n_vocab)

    def _prompt_ids(self, prompt: Any, add_special: bool, parse_special: bool) -> list[int]:
        """The prompt's token ids, checked to leave room for one generated token."""
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=add_special, parse_special=parse_special)
        else:
            ids = self._check_tokens(prompt, allow_empty=True)
        if not ids:
            raise errors.InvalidOptionError("the prompt is empty: no tokens to start from")
        if len(ids) >= self.n_ctx and not self._session.policy.evicts:
            raise errors.ContextOverflowError(
                f"the prompt has {len(ids)} tokens; the context holds {self.n_ctx} "
                "(room is needed for at least one generated token)"
            )
        return ids

    def cancel(self) -> None:
        """Stops the calls in progress (from any thread) at their next token or chunk:
        generations end with finish_reason "cancelled", ``logits()`` raises CancelledError.
        Calls still waiting for their turn, and later ones, run normally. Never blocks."""
        self._cancel_epoch += 1
        self._turns.wake()
        if self._batcher is not None:
            self._batcher._wake()

    def reset(self) -> None:
        """Forgets the cached conversation (the next prompt is evaluated from scratch)."""
        with self._one_turn():
            self._session.reset()

    # --- saved sessions (edgeinfer.session_state) -----------------------------------------

    def save_state(self, path: str | os.PathLike[str]) -> int:
        """Writes the cached tokens and KV cache (of sequence 0) to ``path``, atomically;
        returns the file's size in bytes."""
        with self._one_turn():
            return session_state.save(path, *self._gguf_model(), self._session)

    def load_state(self, path: str | os.PathLike[str]) -> int:
        """Restores a state ``save_state`` wrote for this model and these cache settings (else
        StateMismatchError; StateFileError for a damaged file); returns the positions restored.
        A prompt that extends the restored tokens then evaluates only its new ones."""
        with self._one_turn():
            return session_state.load(path, *self._gguf_model(), self._session)

    def _gguf_model(self) -> tuple[GGUFFile, DecoderConfig]:
        if not isinstance(self.source, GGUFFile) or not isinstance(self.config, DecoderConfig):
            raise errors.InvalidOptionError("saved sessions need a GGUF model, not an ONNX folder")
        return self.source, self.config

    # --- chat ------------------------------------------------------------------------------

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's own template (``tokenizer.chat_template``) or the built-in that fits."""
        self._check_open()
        if self._template is None:
            tok = self.tokenizer
            bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
            eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
            source = self.source.metadata.get("tokenizer.chat_template")
            if isinstance(source, str) and source.strip():
                self._template = ChatTemplate(source, bos_token=bos, eos_token=eos, name="model")
            else:
                name, source = builtin_template(self.config.arch, tok.vocab.token_to_id)
                self._template = ChatTemplate(source, bos_token=bos, eos_token=eos, name=name)
        return self._template

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        template: ChatTemplate | None = None,
    ) -> str:
        """The text of ``template`` (by default :attr:`chat_template`) for ``messages``: at
        most CHARS_PER_TOKEN characters per token of the context (longer text cannot fit,
        and tokenizing it would cost seconds)."""
        return (template or self.chat_template).render(
            messages, add_generation_prompt=add_generation_prompt,
            max_chars=CHARS_PER_TOKEN * self.n_ctx * self._history_factor,
        )  # fmt: skip

    @property
    def max_request_tokens(self) -> int:
        """The most tokens a served request may ask for: the context, or where a context
        policy drops old tokens to make room, HISTORY_CONTEXTS contexts."""
        return self.n_ctx * self._history_factor

    @property
    def _history_factor(self) -> int:
        """How many contexts a conversation may span: one, or where a context policy drops
        old tokens, HISTORY_CONTEXTS (the cap on the template's text guards against a
        hostile template's output, which tokenizing would take seconds over)."""
        return HISTORY_CONTEXTS if self._session.policy.evicts else 1

    def chat_tokens(
        self, messages: Sequence[Mapping[str, Any]], template: ChatTemplate | None = None
    ) -> list[int]:
        """The prompt tokens of a conversation: its rendering by ``template`` (by default
        :attr:`chat_template`), special tokens parsed."""
        if (
            isinstance(messages, Sequence)
            and not isinstance(messages, (str, bytes))
            and not messages
        ):
            raise errors.InvalidOptionError("the conversation has no messages")
        template = template or self.chat_template
        text = self.render_chat(messages, template=template)
        bos = template.bos_token
        # templates usually write the BOS text themselves; do not add a second one
        add = not (bos and text.startswith(bos))
        return self.tokenize(text, add_special=add, parse_special=True)

    def chat(
        self, messages: Sequence[Mapping[str, Any]], *, stream: bool = False, **options: Any
    ) -> Completion | TextStream:
        """Replies to a conversation (a list of {"role", "content"} dicts) with the model's
        chat template; ``stream=True`` returns a :class:`TextStream`."""
        flags(stream=stream)
        s = self.stream(self.chat_tokens(messages), **options)
        if stream:
            return s
        text = "".join(s)
        return Completion(text, s.tokens, s.stats.finish_reason, s.stats)

    # --- asyncio: the same generations, awaited ---------------------------------------------

    def astream(self, prompt: str | Sequence[int], **options: Any) -> TextStream:
        """:meth:`stream` for asyncio: ``async for piece in model.astream(...)``. Each piece
        is computed on a thread of the loop's executor, so the loop goes on meanwhile;
        cancelling the task that reads it cancels the generation (within one step)."""
        return self.stream(prompt, **options)

    async def agenerate(self, prompt: str | Sequence[int], **options: Any) -> Completion:
        """``await model.agenerate(...)``: :meth:`generate` without blocking the loop; a
        cancelled task cancels the generation."""
        stream = await asyncio.to_thread(self.stream, prompt, **options)  # tokenizing takes time
        return await _completion(stream)

    async def achat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> Completion:
        """``await model.achat(messages)``: :meth:`chat` without blocking the loop."""
        tokens = await asyncio.to_thread(self.chat_tokens, messages)
        return await self.agenerate(tokens, **options)

    # --- batching: many requests at once (edgeinfer.batching) -----------------------------

    def batcher(self, **options: Any) -> Batcher:
        """The model's :class:`edgeinfer.batching.Batcher`, which runs every generation;
        ``options`` (max_queue, step_tokens, prefill_chunk) apply from its next step.
        Submitted requests share the engine's steps, one per sequence of ``n_parallel`` (a
        load option), with the model's own streams."""
        batcher = self._worker()
        if options:
            batcher.configure(**options)
        return batcher

    def _worker(self) -> Batcher:
        self._check_open()
        with self._batcher_lock:
            self._check_open()  # close() marks the model closed under this lock
            if self._batcher is None:
                self._batcher = Batcher(self)
            return self._batcher

    def submit(self, prompt: str | Sequence[int], **options: Any) -> Request:
        """Queues a generation on the batcher (``batcher().submit``): a Request to iterate,
        with or without ``async``, or to cancel."""
        return self.batcher().submit(prompt, **options)

    # --- lifetime --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _one_turn(self) -> Iterator[Callable[[], bool]]:
        """Runs the body as one call in its turn, between the batcher's steps; yields whether
        it has been cancelled."""
        self._check_open()
        self._not_on_worker()
        with self._turns.step(Holder()), self._engine_lock:
            self._check_open()
            epoch = self._cancel_epoch
            yield lambda: self._closing or self._cancel_epoch != epoch

    def _not_on_worker(self) -> None:
        """A call from inside a step (a sampler's) would wait for that step: refused."""
        if self._batcher is not None and self._batcher.on_worker:
            raise errors.BusyError("the model was called from inside its own step")

    def close(self) -> None:
        """Frees the engine and unmaps the file; the model cannot be used afterwards.

        Any thread may call it: the calls in progress are cancelled, and the engine goes
        away once the step running now has finished."""
        if self._engine is None or self._closing:
            return
        with self._batcher_lock:  # no batcher is made after this
            self._closing = True  # no new call starts from now on; running ones see a cancel
            batcher = self._batcher
        self.cancel()
        if batcher is not None:
            batcher.close()
            if batcher.on_worker:  # inside a step (a sampler, the collector): the worker
                return  # stops after it, and the engine goes with the last reference
        with self._turns.step(Holder()), self._engine_lock:
            engine, self._engine = self._engine, None
            if engine is not None:  # not closed by a concurrent close() meanwhile
                engine.close()
                self.source.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:  # noqa: SIM105 (not contextlib.suppress: at interpreter exit module globals may be gone)
            self.close()
        except Exception:
            pass


async def _completion(stream: TextStream) -> Completion:
    """Reads ``stream`` to its end in a loop (its pieces computed on the executor)."""
    with stream:
        async for _ in stream:
            pass
    return Completion(stream.text, stream.tokens, stream.stats.finish_reason, stream.stats)


class _CheckedSampler:
    """A caller's sampler, whose answers must be token ids of the model."""

    def __init__(self, sampler: Any, n_vocab: int) -> None:
        self.sampler, self.n_vocab = sampler, n_vocab

    def __call__(self, logits: np.ndarray, history: list[int]) -> int:
        token = self.sampler(logits, history)
        if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
            raise errors.InvalidOptionError(f"the sampler returned {token!r}, not a token id")
        if not 0 <= token < self.n_vocab:
            raise errors.InvalidOptionError(
                f"the sampler returned token id {token}, outside [0, {self.n_vocab})"
            )
        return int(token)


def load(
    path: str | os.PathLike[str],
    n_threads: int | None = None,
    n_ctx: int | None = None,
    **options: Any,
) -> Model:
    """Opens a GGUF model file (memory-mapped) and returns a ready :class:`Model`.

    Further options: ``n_batch`` (prompt tokens per engine call), ``engine`` ("auto" or a name
    in :data:`edgeinfer.engines.ENGINES`: "native", "reference", "onnxruntime"),
    ``cache_type_k`` and ``cache_type_v`` (the KV cache's types for keys and for values, names
    in :data:`edgeinfer.kv_cache.CACHE_TYPES`: "f16", "f32", "q8_0", "q4_0", "kivi4",
    "kivi2"; by default those the file recommends, else "f16"), ``kv_type`` (a shorthand
    setting both), ``kivi_group`` and ``kivi_residual`` (a KIVI cache's positions per key
    group, 32, 64 or 128, and the newest positions it reads in f16), ``swa_full``
    (sliding-window layers keep the whole context rather than the blocks of their window),
    ``context_policy`` (what a sequence does at the end of the context: "error", "shift"
    keeping ``n_keep`` tokens, "streaming" keeping ``n_sink`` attention sinks, or "h2o"
    keeping the sinks, the recent tokens and the most attended others; see
    :mod:`edgeinfer.context_policy`), ``kv_budget`` (bytes, or a size such as "512MiB", for
    the native engine's pool of cache blocks, which its sequences share; by default what
    ``n_ctx`` positions need), ``isa`` (force an instruction-set variant of the native
    engine), ``n_parallel`` (sequences for :meth:`Model.batcher`'s requests, which run
    together; 0, the default, makes none) and ``fixed_threads`` (every decoding step on
    ``n_threads``; by default the native engine times its decoding steps and runs them on
    fewer threads while that is faster, as when another program holds a core), ``progress``
    (a callable given the fraction loaded, 0.0 to 1.0, at each stage, from the calling
    thread; returning False cancels the load with CancelledError) and ``memory_check``
    (True, the default: refuse with InsufficientMemoryError a model whose KV cache, buffers
    and weight copies, which cannot page, exceed the memory available, and warn with
    MemoryPressureWarning when the memory-mapped weights beside them do not fit either),
    ``n_gpu_layers`` (0, the default: none; N: the output and the last N - 1 layers on a Vulkan
    GPU, as llama.cpp counts them; "all": every layer and the output; "auto": as many as fit in
    the device's free memory less a margin, none without a GPU; the native engine with an f32,
    f16, q8_0 or q4_0 cache; an N that does not fit raises OutOfMemoryError with the numbers;
    ``Model.gpu_plan`` says what went where; see the README's Vulkan section) and
    ``gpu_device`` (the Vulkan device's index; -1, the default, picks the first discrete GPU,
    else integrated, else the first).
    """
    unknown = set(options) - _LOAD_OPTIONS
    if unknown:
        raise errors.InvalidOptionError(f"unknown load option(s): {', '.join(sorted(unknown))}")
    return Model(path, n_threads=n_threads, n_ctx=n_ctx, **options)


_LOAD_OPTIONS = frozenset({
    "n_batch", "engine", "kv_type", "isa", "cache_type_k", "cache_type_v", "swa_full",
    "context_policy", "n_keep", "n_sink", "kv_budget", "kivi_group", "kivi_residual",
    "fixed_threads", "n_parallel", "progress", "memory_check", "n_gpu_layers", "gpu_device",
})  # fmt: skip


def _gpu_layers(asked: int | str, n_layer: int, engine: str) -> int:
    """n_gpu_layers as the native engine takes it: "all" is every layer and the output
    (n_layer + 1, as llama.cpp counts them); "auto" what fits in the device's free memory
    (gpu_offload.AUTO); a number is that many, the output first."""
    if asked == "all":
        n = n_layer + 1
    elif asked == "auto":
        n = gpu_offload.AUTO
    elif isinstance(asked, str) and asked.strip().isdigit():
        n = int_option("n_gpu_layers", int(asked), 0, n_layer + 1)
    elif isinstance(asked, str):
        raise errors.InvalidOptionError(
            f"n_gpu_layers must be a number, 'auto' or 'all', got {asked!r}"
        )
    else:
        n = int_option("n_gpu_layers", asked, 0, n_layer + 1)
    if n and engine != "native":
        raise errors.InvalidOptionError(f"n_gpu_layers needs the native engine, not {engine}")
    return n


class _LoadProgress:
    """Calls load()'s ``progress(fraction)`` at each stage; a False answer cancels the load
    (CancelledError), anything else goes on."""

    def __init__(self, callback: Callable[[float], Any] | None) -> None:
        if callback is not None and not callable(callback):
            raise errors.InvalidOptionError(f"progress must be a callable, got {callback!r}")
        self.callback = callback

    def __call__(self, fraction: float) -> None:
        if self.callback is not None and self.callback(fraction) is False:
            raise errors.CancelledError(
                f"the load was cancelled by its progress callback at {fraction:.0%}"
            )


def _model_bytes(path: str) -> int:
    """The bytes of the model's file (a folder's files): what its weights map."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(path)
        for name in names
    )


def _check_memory(engine: engines.Engine, model_bytes: int) -> None:
    """Refuses an engine whose committed memory cannot fit the memory available; warns when
    it fits but the mapped weights beside it do not (they will page from the disk)."""
    available = system.available_memory()
    committed = engine.committed_bytes
    mib = 1 << 20
    if committed > available:
        raise errors.InsufficientMemoryError(
            f"the model needs {committed / mib:.0f} MiB of memory that cannot page (KV cache, "
            f"buffers, weight copies) and {available / mib:.0f} MiB are available: lower "
            "n_ctx, n_parallel or kv_budget, or use a smaller KV cache type "
            "(load(memory_check=False) loads it anyway)",
            committed, available,
        )  # fmt: skip
    mapped = max(0, model_bytes - engine.weight_copy_bytes)
    if mapped + committed > available:
        warnings.warn(
            f"the weights ({mapped / mib:.0f} MiB, memory-mapped) and the committed memory "
            f"({committed / mib:.0f} MiB) exceed the {available / mib:.0f} MiB available: "
            "generation will page the weights from the disk, and run far slower",
            errors.MemoryPressureWarning, stacklevel=4,
        )  # fmt: skip


def _kv_budget(value: int | str | None) -> int:
    """Bytes from an int or a size such as "512MiB"; 0 (what n_ctx needs) for None."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, str, np.integer)):
        raise errors.InvalidOptionError(f"kv_budget must be bytes or a size, got {value!r}")
    return parse_size(value if isinstance(value, str) else int(value))


def _cache_types(
    kv_type: str | None, k_type: str | None, v_type: str | None
) -> tuple[str, str] | None:
    """The (keys, values) cache type names asked for, None when none is; ``kv_type`` sets
    both, and may not disagree with one given on its own."""
    if kv_type is None and k_type is None and v_type is None:
        return None
    both = cache_type(kv_type) if kv_type is not None else None
    chosen = []
    for name, given in (("cache_type_k", k_type), ("cache_type_v", v_type)):
        one = cache_type(given, name) if given is not None else None
        if both is not None and one is not None and one != both:
            raise errors.InvalidOptionError(
                f"kv_type {both.name} sets both cache types; {name} {one.name} disagrees"
            )
        chosen.append((one or both or cache_type(DEFAULT_CACHE_TYPE)).name)
    return chosen[0], chosen[1]


# the KV cache a GGUF file recommends (edgeinfer convert writes what its memory fit counted):
# load() uses it unless given cache types of its own
RECOMMENDED_CACHE_KEYS = ("edgeinfer.cache_type_k", "edgeinfer.cache_type_v")


def _recommended_cache_types(metadata: Mapping[str, Any], path: str) -> tuple[str, str]:
    """The (keys, values) types the file recommends, f16 for a key it lacks; a value that
    names no cache type is refused with its key (load()'s cache options override it)."""
    chosen = []
    for key in RECOMMENDED_CACHE_KEYS:
        value = metadata.get(key, DEFAULT_CACHE_TYPE)
        if not isinstance(value, str):
            raise errors.MissingKeyError(f"{path}: {key} must be a string, not {value!r}")
        if value not in CACHE_TYPES:
            raise errors.UnsupportedModelError(
                f"{path}: {key} recommends the KV cache type {value!r}, not one of "
                f"{', '.join(CACHE_TYPES)}; choose one with load(cache_type_k=, cache_type_v=)"
            )
        chosen.append(value)
    return chosen[0], chosen[1]
