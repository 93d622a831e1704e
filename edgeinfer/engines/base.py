"""The engine protocol: what every compute engine (numpy reference, native, onnxruntime)
offers, and the bookkeeping they share.

An engine holds the KV cache of up to ``max_sequences`` sequences. One call, :meth:`decode`,
runs a :class:`Batch` of (token, sequence, position) triples, so that several sequences can
share a step; :meth:`forward` is the one-sequence shorthand that generation uses today.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from edgeinfer import errors
from edgeinfer.gpu_offload import OffloadPlan
from edgeinfer.kv_cache import KIVI_GROUP, KIVI_RESIDUAL


@dataclass(frozen=True)
class EngineSpec:
    """What an engine is and supports, before one is created (the registry's entries)."""

    name: str
    summary: str
    formats: tuple[str, ...]  # model formats it runs: "gguf", "onnx"
    kv_types: tuple[str, ...]  # cache types it keeps (edgeinfer.kv_cache names); () = the file's
    max_sequences: int  # sequences one engine holds at once
    module: str  # where the factory ``open_engine`` lives, imported on use
    probe: Callable[[], tuple[bool, str]]  # runs here? and why (not); cheap, imports no engine


# limits of the options, the native engine's (EI_MAX_THREADS, EI_MAX_BATCH in simd/include)
MAX_N_THREADS = 512
MAX_N_BATCH = 4096


@dataclass(frozen=True)
class EngineOptions:
    """What :func:`edgeinfer.load` passes every engine's factory."""

    n_ctx: int
    n_threads: int
    n_batch: int = 512
    cache_type_k: str = "f16"  # edgeinfer.kv_cache names, for the keys and for the values
    cache_type_v: str = "f16"
    isa: str | None = None
    n_seq_max: int = 1
    swa_full: bool = False  # sliding-window layers keep the whole context, not a ring
    kv_budget: int = 0  # bytes for the native engine's block pool; 0: n_seq_max x n_ctx
    track_attention: bool = False  # sum the attention each position receives (h2o)
    kivi_group: int = KIVI_GROUP  # kivi4/kivi2 caches: positions per key group
    kivi_residual: int = KIVI_RESIDUAL  # and the newest positions read in f16
    # every step on n_threads; else decoding steps may run on fewer when they are faster so
    # (another program holds a core: simd/common/step_threads.h)
    fixed_threads: bool = False
    # the output and the last n_gpu_layers - 1 layers on a Vulkan device, as llama.cpp counts
    # (n_layer + 1: all); gpu_device: its index, -1 the best (simd/gpu_vulkan/offload.h)
    n_gpu_layers: int = 0
    gpu_device: int = -1


@dataclass(frozen=True)
class Batch:
    """Tokens to run at once: token ``i`` goes to sequence ``seqs[i]`` at ``positions[i]``,
    and its logits are returned where ``want[i]``, in token order."""

    tokens: np.ndarray  # (n,) int32
    positions: np.ndarray  # (n,) int32
    seqs: np.ndarray  # (n,) int32
    want: np.ndarray  # (n,) bool

    @classmethod
    def sequence(cls, tokens: object, start: int, seq: int = 0, all_logits: bool = False) -> Batch:
        """``tokens`` appended to sequence ``seq`` from position ``start``; logits of the last
        token, or of every one."""
        ids = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64).reshape(-1), dtype=np.int32)
        n = len(ids)
        want = np.ones(n, dtype=bool) if all_logits else np.zeros(n, dtype=bool)
        if n:
            want[-1] = True
        return cls(
            ids, np.arange(start, start + n, dtype=np.int32), np.full(n, seq, dtype=np.int32), want
        )

    def __len__(self) -> int:
        return len(self.tokens)


# the kinds of phase a native forward pass is cut into by its per-op profile, in the order of
# EI_PROFILE_KINDS (simd/include/edgeinfer.h), which edgeinfer._native checks against this;
# "call" is a whole engine call, the total the others add up to
PROFILE_KINDS = (
    "call", "cache_blocks", "threads", "embed", "rope_tables", "norm", "act_quant", "repack",
    "matmul", "qkv_post", "kivi_quant", "attention", "output_rows", "glu", "softcap", "gpu",
)  # fmt: skip


@dataclass(frozen=True)
class OpTime:
    """One row of an engine's per-op profile: every phase of one kind (for ``matmul``, of one
    weight type and shape) since profiling started."""

    kind: str  # one of PROFILE_KINDS other than "call"
    weight_type: int | None  # matmul: the weight's GGML type
    rows: int  # matmul: the weight's rows (outputs) and columns (inputs); 0 otherwise
    cols: int
    calls: int
    ns: int  # wall time, the wait for the slowest thread included
    flops: int  # floating-point operations done; 0 where none are counted
    bytes: int  # bytes read (weights; cache rows for attention); 0 where none are counted


@dataclass(frozen=True)
class EngineProfile:
    """What an engine's per-op profile holds: its rows, and the wall time of the engine calls
    they were taken from (measured apart, so that the rows can be checked against it)."""

    ops: tuple[OpTime, ...]
    calls: int  # engine calls (decode) profiled
    ns: int  # their wall time inside the engine

    @property
    def parts_ns(self) -> int:
        return sum(op.ns for op in self.ops)


def no_profile(engine: str) -> errors.InvalidOptionError:
    """The refusal of a profile by an engine that keeps none (``can_profile`` false)."""
    return errors.InvalidOptionError(
        f"the {engine} engine keeps no per-op profile (the native engine does)"
    )


@runtime_checkable
class Engine(Protocol):
    """The one interface ``load()``, generation, the CLI, ``doctor`` and ``bench`` use."""

    spec: ClassVar[EngineSpec]
    n_ctx: int  # positions per sequence
    # the cache's types (edgeinfer.kv_cache names); None where the model file fixes them
    cache_type_k: str | None
    cache_type_v: str | None
    ring_slack: int | None  # see SequenceEngine
    ring_window: int

    @property
    def name(self) -> str: ...

    @property
    def isa(self) -> str:
        """The kernels it runs (an instruction set, or the library doing the work)."""
        ...

    @property
    def n_past(self) -> int:
        """Positions sequence 0 holds."""
        ...

    @property
    def memory_bytes(self) -> int:
        """Bytes the engine allocated itself (buffers, KV cache, weight copies)."""
        ...

    @property
    def weight_copy_bytes(self) -> int:
        """Of memory_bytes, copies of weights the engine made (0: reads the file in place)."""
        ...

    @property
    def committed_bytes(self) -> int:
        """The most memory the engine will hold that cannot page back to the model file:
        memory_bytes, and what its KV cache may still grow to."""
        ...

    @property
    def gpu_plan(self) -> OffloadPlan | None:
        """What layer offload (n_gpu_layers) put on a GPU, and why; None: the engine has none."""
        ...

    def threads(self, n_tokens: int = 1) -> int | None:
        """The threads a step of ``n_tokens`` tokens runs on now (None: the engine does not
        say; the native engine may run decoding steps on fewer than it was given)."""
        ...

    def seq_length(self, seq: int) -> int: ...

    def decode(self, batch: Batch) -> np.ndarray:
        """Runs ``batch``; returns (number wanted, n_vocab) float32 logits."""
        ...

    def forward(self, tokens: object, all_logits: bool = False) -> np.ndarray:
        """Appends ``tokens`` to sequence 0; logits of the last token (n_vocab,) or of every
        token (n, n_vocab)."""
        ...

    def truncate(self, n_keep: int, seq: int = 0) -> None:
        """Forgets the positions of ``seq`` from ``n_keep`` on."""
        ...

    def seq_clear(self, seq: int) -> None:
        """Forgets every position of ``seq`` and frees what its cache held."""
        ...

    can_discard: bool  # whether ``discard`` works (context policies need it)

    def discard(self, start: int, count: int, seq: int = 0) -> None:
        """Forgets positions [start, start + count) of ``seq``; the later ones move down."""
        ...

    def discard_limit(self, start: int, seq: int = 0) -> int:
        """The most positions ``discard(start, ...)`` may drop from ``seq`` now."""
        ...

    def evict(self, runs: list[tuple[int, int]], seq: int = 0) -> None:
        """Forgets the runs (start, count) of positions of ``seq`` (in order, apart); every
        later position moves down by the positions dropped below it."""
        ...

    can_track_attention: ClassVar[bool]  # whether it can sum attention (the h2o policy)
    tracks_attention: bool  # whether it was created to (EngineOptions.track_attention)

    def attention_scores(self, seq: int = 0) -> np.ndarray:
        """(seq_length,) int64: the attention each position of ``seq`` received from every
        query head of every layer since it was evaluated, in units of 2**-32 (created with
        ``track_attention``)."""
        ...

    can_profile: ClassVar[bool]  # whether the two methods below work

    def set_profiling(self, on: bool) -> None:
        """Starts the per-op profile, every counter at zero (``on``), or pauses it. Off, it
        costs nothing measurable."""
        ...

    def profile(self) -> EngineProfile:
        """What the profile holds since it was last started (refused if it never was)."""
        ...

    can_save_rows: bool  # whether the rows methods below work (saved sessions)

    def cache_row_bytes(self) -> tuple[int, int]:
        """Bytes of one position's keys and of its values, in the cache's own encoding."""
        ...

    def layer_rows(self, layer: int) -> int:
        """Positions ``layer`` keeps per sequence: n_ctx, or a ring's (its last ones only)."""
        ...

    def read_rows(self, layer: int, pos0: int, n: int, seq: int = 0) -> tuple[bytes, bytes]:
        """The stored key and value rows of positions [pos0, pos0 + n) of ``layer``."""
        ...

    def write_rows(self, layer: int, pos0: int, k: bytes, v: bytes, seq: int = 0) -> None:
        """Stores rows (as ``read_rows`` returns them) for positions from ``pos0``."""
        ...

    def set_length(self, n: int, seq: int = 0) -> None:
        """Declares that ``seq`` holds ``n`` positions (after ``write_rows`` restored them)."""
        ...

    def key_shifts(self, seq: int = 0) -> np.ndarray:
        """(seq_length,) int32: how many positions ahead of its own each key of ``seq`` was
        rotated. A q8_0 or q4_0 key cache moves its keys as they are when positions are
        dropped (a query meets them rotated as far ahead itself: simd/common/key_shifts.h);
        every other cache rotates them back, and has 0s here."""
        ...

    def set_key_shifts(self, shifts: np.ndarray, seq: int = 0) -> None:
        """Restores the shifts of positions [0, len(shifts)) of ``seq`` (a saved state)."""
        ...

    # a KIVI cache (``kivi`` is (G, R)): the rows above are its f16 residual's, and its
    # quantized groups of G positions move through the methods below

    kivi: tuple[int, int] | None

    def group_bytes(self) -> tuple[int, int]:
        """Bytes of one quantized group of a layer: every KV head's key block, then the G
        value rows of every head."""
        ...

    def layer_groups(self, layer: int) -> int:
        """Positions whose groups ``layer`` keeps per sequence (0: none is ever read)."""
        ...

    def quantized_groups(self, seq: int = 0) -> int:
        """The groups of ``seq`` that a query at its length reads quantized and that exist."""
        ...

    def read_groups(self, layer: int, g0: int, n: int, seq: int = 0) -> tuple[bytes, bytes]:
        """The key and value bytes of groups [g0, g0 + n) of ``layer``."""
        ...

    def write_groups(self, layer: int, g0: int, k: bytes, v: bytes, seq: int = 0) -> None:
        """Stores groups (as ``read_groups`` returns them) from group ``g0`` on."""
        ...

    def set_quantized_groups(self, n: int, seq: int = 0) -> None:
        """Declares that the first ``n`` groups of ``seq`` are quantized (after
        ``write_groups`` restored them)."""
        ...

    def close(self) -> None: ...


class SequenceEngine:
    """Shared bookkeeping: per-sequence lengths, batch checks and the one-sequence shorthand.
    An engine implements ``_run(batch)`` (and ``_clear(seq)`` when it can free memory).

    The cache is append-only per sequence: a batch's positions for one sequence must follow
    on from what that sequence holds, in order (truncate first to overwrite)."""

    spec: ClassVar[EngineSpec]
    n_vocab: int

    def __init__(self, n_ctx: int, n_vocab: int, n_seq_max: int = 1) -> None:
        if not 1 <= n_seq_max <= self.spec.max_sequences:
            raise errors.InvalidOptionError(
                f"the {self.spec.name} engine holds 1 to {self.spec.max_sequences} sequences, "
                f"not {n_seq_max}"
            )
        self.n_ctx, self.n_vocab = n_ctx, n_vocab
        self._lengths = [0] * n_seq_max
        self._highs = [0] * n_seq_max  # the furthest each sequence reached since its clear
        # None, or how far a sequence may rewind: an engine whose sliding-window layers keep a
        # ring (window + slack positions) has overwritten the window behind a deeper rewind;
        # ring_window is their largest window
        self.ring_slack: int | None = None
        self.ring_window = 0
        self.cache_type_k: str | None = None
        self.cache_type_v: str | None = None
        self.kivi: tuple[int, int] | None = None  # a KIVI cache's (kivi_group, kivi_residual)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def n_past(self) -> int:
        return self._lengths[0]

    @property
    def memory_bytes(self) -> int:
        return 0

    @property
    def weight_copy_bytes(self) -> int:
        return 0

    @property
    def committed_bytes(self) -> int:
        return self.memory_bytes

    @property
    def gpu_plan(self) -> OffloadPlan | None:
        return None

    def threads(self, n_tokens: int = 1) -> int | None:
        return None

    def seq_length(self, seq: int) -> int:
        self._check_seq(seq)
        return self._lengths[seq]

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < len(self._lengths):
            raise errors.InvalidOptionError(
                f"sequence {seq} is outside [0, {len(self._lengths)}) of this engine"
            )

    def decode(self, batch: Batch) -> np.ndarray:
        self._check_open()
        ends = self._check_batch(batch)
        logits = self._run(batch)
        for seq, end in ends.items():
            self._lengths[seq] = end
            self._highs[seq] = max(self._highs[seq], end)
        return logits

    def forward(self, tokens: object, all_logits: bool = False) -> np.ndarray:
        logits = self.decode(Batch.sequence(tokens, self._lengths[0], 0, all_logits))
        return logits if all_logits else logits[0]

    def truncate(self, n_keep: int, seq: int = 0) -> None:
        """Keeps the first ``n_keep`` positions, or none where the ring of a sliding-window
        layer no longer holds the window behind them (see ``seq_length`` afterwards)."""
        self._check_seq(seq)
        keep = min(self._lengths[seq], max(0, n_keep))
        if self.ring_slack is not None and self._highs[seq] - keep > self.ring_slack:
            keep = 0
        self._lengths[seq] = keep
        if keep == 0:
            self._highs[seq] = 0
            self._clear(seq)  # what it held goes back (the native pool keeps it for reuse)

    def seq_clear(self, seq: int) -> None:
        self._check_seq(seq)
        self._lengths[seq] = self._highs[seq] = 0
        self._clear(seq)

    can_discard: bool = True  # whether ``discard`` (context policies) works

    def discard_limit(self, start: int, seq: int = 0) -> int:
        """The most positions ``discard(start, ...)`` may drop from ``seq`` now: all after
        ``start``, less, with rings, the window that must stay behind the kept tokens."""
        n_past = self.seq_length(seq)
        most = n_past - start
        if self.ring_slack is not None:
            most = min(most, n_past - start - self.ring_window + 1)
        return max(most, 0)

    def discard(self, start: int, count: int, seq: int = 0) -> None:
        self._check_open()
        n_past = self.seq_length(seq)
        if start < 0 or count < 0 or start + count > n_past:
            raise errors.InvalidOptionError(
                f"cannot discard {count} positions from {start} of the {n_past} held"
            )
        if count:
            self.evict([(start, count)], seq)

    def evict(self, runs: list[tuple[int, int]], seq: int = 0) -> None:
        self._check_open()
        if not self.can_discard:
            raise errors.InvalidOptionError(
                f"the {self.name} engine with a {self.cache_type_k} cache cannot drop cached "
                "positions"
            )
        n_past = self.seq_length(seq)
        end = dropped = 0
        for start, count in runs:
            if start < end or count <= 0 or start + count > n_past:
                raise errors.InvalidOptionError(
                    f"cannot drop {count} positions from {start} of the {n_past} held "
                    f"(runs must be in order, apart and not empty)"
                )
            end = start + count
            dropped += count
        if runs:
            self._evict(seq, list(runs), n_past)
            self._lengths[seq] = self._highs[seq] = n_past - dropped
            if self.kivi is not None:  # the rows behind were moved, not kept: a rewind below
                self._highs[seq] += self.ring_slack or 0  # them evaluates again

    can_track_attention: ClassVar[bool] = False
    tracks_attention = False  # whether this engine was created with track_attention

    def attention_scores(self, seq: int = 0) -> np.ndarray:
        self._check_open()
        self._check_seq(seq)
        if not self.tracks_attention:
            raise errors.InvalidOptionError(
                f"this {self.spec.name} engine sums no attention: the h2o context policy needs "
                "one created with track_attention"
            )
        return self._attention_scores(seq)

    def _attention_scores(self, seq: int) -> np.ndarray:
        raise NotImplementedError

    # --- the per-op profile ------------------------------------------------------------------

    can_profile: ClassVar[bool] = False

    def set_profiling(self, on: bool) -> None:
        raise no_profile(self.spec.name)

    def profile(self) -> EngineProfile:
        raise no_profile(self.spec.name)

    # --- rows of the cache (saved sessions: edgeinfer.session_state) -----------------------

    can_save_rows: bool = False

    def cache_row_bytes(self) -> tuple[int, int]:
        raise errors.InvalidOptionError(f"the {self.spec.name} engine cannot save its cache")

    def layer_rows(self, layer: int) -> int:
        raise errors.InvalidOptionError(f"the {self.spec.name} engine cannot save its cache")

    def _check_rows(self, layer: int, pos0: int, n: int, n_past: int, seq: int) -> None:
        """Refuses rows outside what ``layer`` holds when ``seq`` has ``n_past`` positions."""
        self._check_open()
        self._check_seq(seq)
        kept = self.layer_rows(layer)  # refuses a bad layer
        if n < 0 or pos0 < max(0, n_past - kept) or pos0 + n > n_past or n_past > self.n_ctx:
            raise errors.InvalidOptionError(
                f"layer {layer} holds positions [{max(0, n_past - kept)}, {n_past}), not rows "
                f"[{pos0}, {pos0 + n})"
            )

    def read_rows(self, layer: int, pos0: int, n: int, seq: int = 0) -> tuple[bytes, bytes]:
        self._check_rows(layer, pos0, n, self.seq_length(seq), seq)
        return self._read_rows(seq, layer, pos0, n)

    def write_rows(self, layer: int, pos0: int, k: bytes, v: bytes, seq: int = 0) -> None:
        kb, vb = self.cache_row_bytes()
        n = len(k) // kb
        if len(k) != n * kb or len(v) != n * vb:
            raise errors.InvalidOptionError(
                f"{len(k)} key and {len(v)} value bytes are not {n} rows of {kb} and {vb}"
            )
        # a run ending anywhere in the context, no longer than the layer keeps
        self._check_rows(layer, pos0, n, min(pos0 + self.layer_rows(layer), self.n_ctx), seq)
        self._write_rows(seq, layer, pos0, n, k, v)

    def set_length(self, n: int, seq: int = 0) -> None:
        self._check_seq(seq)
        if not 0 <= n <= self.n_ctx:
            raise errors.InvalidOptionError(f"{n} positions do not fit the context of {self.n_ctx}")
        self._lengths[seq] = self._highs[seq] = n

    # which caches keep their keys as first rotated (simd/common/key_shifts.h)
    KEPT_ROTATED = ("q8_0", "q4_0")

    def key_shifts(self, seq: int = 0) -> np.ndarray:
        self._check_open()
        self._check_seq(seq)
        return self._key_shifts(seq)

    def set_key_shifts(self, shifts: np.ndarray, seq: int = 0) -> None:
        self._check_open()
        self._check_seq(seq)
        d = np.asarray(shifts, dtype=np.int64).reshape(-1)
        if len(d) > self.n_ctx:
            raise errors.InvalidOptionError(f"{len(d)} shifts for a context of {self.n_ctx}")
        room = self.n_ctx - 1 - np.arange(len(d))  # a key was rotated within the context
        bad = np.flatnonzero((d < 0) | (d > room))
        if len(bad):
            p = int(bad[0])
            raise errors.InvalidOptionError(
                f"position {p} cannot hold a key rotated {int(d[p])} positions ahead of it "
                f"(the context is {self.n_ctx})"
            )
        if d.any() and (self.kivi is not None or self.cache_type_k not in self.KEPT_ROTATED):
            raise errors.InvalidOptionError(
                f"the {self.cache_type_k} key cache rotates its keys where they move: it holds no "
                "key rotated ahead of its position"
            )
        self._set_key_shifts(seq, d.astype(np.int32))

    def _key_shifts(self, seq: int) -> np.ndarray:
        return np.zeros(self.seq_length(seq), dtype=np.int32)

    def _set_key_shifts(self, seq: int, shifts: np.ndarray) -> None:
        """Only 0s reach here for a cache that rotates its keys back."""

    kivi: tuple[int, int] | None = None

    def _kivi_options(self) -> tuple[int, int]:
        if self.kivi is None:
            raise errors.InvalidOptionError("the cache holds rows, not KIVI groups")
        return self.kivi

    def group_bytes(self) -> tuple[int, int]:
        self._kivi_options()
        return self._group_bytes()

    def layer_groups(self, layer: int) -> int:
        self._kivi_options()
        self.layer_rows(layer)  # refuses a bad layer
        return self._layer_groups(layer)

    def quantized_groups(self, seq: int = 0) -> int:
        group, residual = self._kivi_options()
        self._check_seq(seq)
        return min(self._quantized_groups(seq), max(self.seq_length(seq) - residual, 0) // group)

    def _check_groups(self, layer: int, g0: int, n: int, seq: int) -> None:
        """Refuses groups outside [0, n_ctx / G) or more than ``layer`` keeps."""
        group, _ = self._kivi_options()
        self._check_open()
        self._check_seq(seq)
        kept = self.layer_groups(layer)
        if n < 0 or g0 < 0 or (g0 + n) * group > self.n_ctx or (n and n * group > kept + group):
            raise errors.InvalidOptionError(
                f"layer {layer} keeps the groups of {kept} positions, not groups [{g0}, {g0 + n})"
            )

    def read_groups(self, layer: int, g0: int, n: int, seq: int = 0) -> tuple[bytes, bytes]:
        self._check_groups(layer, g0, n, seq)
        return self._read_groups(seq, layer, g0, n)

    def write_groups(self, layer: int, g0: int, k: bytes, v: bytes, seq: int = 0) -> None:
        self._kivi_options()
        kb, vb = self.group_bytes()
        n = len(k) // kb
        if len(k) != n * kb or len(v) != n * vb:
            raise errors.InvalidOptionError(
                f"{len(k)} key and {len(v)} value bytes are not {n} groups of {kb} and {vb}"
            )
        self._check_groups(layer, g0, n, seq)
        self._write_groups(seq, layer, g0, n, k, v)

    def set_quantized_groups(self, n: int, seq: int = 0) -> None:
        group, _ = self._kivi_options()
        self._check_seq(seq)
        if not 0 <= n * group <= self.seq_length(seq):
            raise errors.InvalidOptionError(
                f"{n} groups of {group} do not fit the {self.seq_length(seq)} positions held"
            )
        self._set_quantized_groups(seq, n)

    def _group_bytes(self) -> tuple[int, int]:
        raise NotImplementedError

    def _layer_groups(self, layer: int) -> int:
        raise NotImplementedError

    def _quantized_groups(self, seq: int) -> int:
        raise NotImplementedError

    def _read_groups(self, seq: int, layer: int, g0: int, n: int) -> tuple[bytes, bytes]:
        raise NotImplementedError

    def _write_groups(self, seq: int, layer: int, g0: int, n: int, k: bytes, v: bytes) -> None:
        raise NotImplementedError

    def _set_quantized_groups(self, seq: int, n: int) -> None:
        raise NotImplementedError

    def _read_rows(self, seq: int, layer: int, pos0: int, n: int) -> tuple[bytes, bytes]:
        raise NotImplementedError

    def _write_rows(self, seq: int, layer: int, pos0: int, n: int, k: bytes, v: bytes) -> None:
        raise NotImplementedError

    def _check_batch(self, batch: Batch) -> dict[int, int]:
        """Refuses what the cache cannot take; returns each sequence's length afterwards."""
        n = len(batch)
        if n == 0:
            raise errors.InvalidOptionError("a batch needs at least one token")
        if not (len(batch.positions) == len(batch.seqs) == len(batch.want) == n):
            raise errors.InvalidOptionError(
                "a batch's tokens, positions, sequences and flags differ in length"
            )
        ends: dict[int, int] = {}
        for seq, pos in zip(batch.seqs.tolist(), batch.positions.tolist(), strict=True):
            self._check_seq(seq)
            expected = ends.get(seq, self._lengths[seq])
            if pos != expected:
                raise errors.InvalidOptionError(
                    f"sequence {seq} holds {expected} positions: its next token goes to position "
                    f"{expected}, not {pos}"
                )
            ends[seq] = pos + 1
        for seq, end in ends.items():
            if end > self.n_ctx:
                cached = self._lengths[seq]
                raise errors.ContextOverflowError(
                    f"{cached} cached + {end - cached} new tokens exceed the context of "
                    f"{self.n_ctx}"
                )
        if batch.tokens.min() < 0 or batch.tokens.max() >= self.n_vocab:
            raise errors.InvalidOptionError(f"token ids must lie in [0, {self.n_vocab})")
        return ends

    def _check_open(self) -> None:
        """Raises ModelClosedError once the engine is closed."""

    def _run(self, batch: Batch) -> np.ndarray:
        raise NotImplementedError

    def _evict(self, seq: int, runs: list[tuple[int, int]], n_past: int) -> None:
        raise errors.InvalidOptionError(
            f"the {self.spec.name} engine cannot drop cached positions (context policies)"
        )

    def _clear(self, seq: int) -> None:
        """Frees what sequence ``seq`` held (nothing to do where the cache is preallocated)."""
