"""Saved sessions: one sequence's tokens and KV cache in a file, and back.

``Model.save_state`` / ``Model.load_state`` and the CLI's ``--prompt-cache`` use this module.
Only sequence 0 is saved (the one generation and chat use). A file is::

    magic    8 bytes  b"EISTATE\\0"
    version  u32      FORMAT_VERSION
    length   u32      bytes of the header
    header   JSON     what the cache was made by and for (HEADER_FIELDS)
    tokens   int32    (n_history) every token evaluated, a dropped run included
    shifts   int32    (n_past) how many positions ahead of its own each held key was rotated
                      (q8_0 and q4_0 keys move as they are when positions are dropped; 0s
                      for every other cache; a version 2 file has none, which reads as 0s)
    rows     bytes    per layer: the keys, then the values, of its last ``held`` positions
                      (held = min(n_past, positions the layer keeps)), oldest first, each row
                      k_row_bytes / v_row_bytes in the cache's own encoding (a KIVI cache's f16
                      residual; q8_0 and q4_0 rows as the cache holds them, Walsh-Hadamard
                      rotated, since version 4)
    groups   bytes    a KIVI cache only, per layer: the keys, then the values, of its last
                      quantized groups (those of the positions the layer keeps, below
                      n_groups * kivi_group), each group_k_bytes / group_v_bytes as the cache
                      holds it
    sha256   32 bytes of everything before it

all little-endian. The header names the model by the SHA-256 of its GGUF header and tensor
table (the bytes before the tensor data: every hyper-parameter, the vocabulary, each tensor's
name, type, shape and offset), the cache's types and row sizes, the context, each layer's
window and the positions it keeps (a sliding-window layer's ring keeps window + n_batch), the
batch size, the context policy and, for a KIVI cache, its group, residual and the groups
quantized (so that the next queries read exactly what they would have read). A file that
does not check out raises :class:`~edgeinfer.errors.StateFileError`; an intact one written
for another model or other cache settings raises :class:`~edgeinfer.errors.StateMismatchError`
(llama.cpp restores such files silently, as a no-op or as garbage). Nothing is written into
the engine before the whole file has been checked.

Rows move through the engines' rows interface (``read_rows`` / ``write_rows``), which knows
nothing of how an engine lays its cache out; the native and numpy engines write the same
bytes, so a state written by one loads in the other, where the other keeps no more positions
of a layer than the file holds.

Writes are atomic: the file goes to a temporary name next to the target, is flushed to disk,
then renamed over it; on any error or interrupt the temporary file is removed and the target
left as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer import errors, kivi
from edgeinfer.atomic_file import atomic_file
from edgeinfer.engines.base import SequenceEngine
from edgeinfer.generation import KVSession
from edgeinfer.gguf import GGUFFile
from edgeinfer.models.base import DecoderConfig

MAGIC = b"EISTATE\0"
# 2: KIVI caches (the group fields); 3: the key shifts; 4: q8_0 / q4_0 rows Walsh-Hadamard
# rotated (kv_cache.CacheType.hadamard_block), so an older file's rows of those types are not
# what this cache holds, and are refused
FORMAT_VERSION = 4
READ_VERSIONS = (2, 3, 4)
_ROTATED_SINCE = 4
_PREFIX = struct.Struct("<8sII")  # magic, version, header length
DIGEST_BYTES = 32
MAX_HEADER_BYTES = 1 << 20  # a real header is well under a kilobyte per layer
MAX_LAYERS = 4096
KEPT_ROTATED = SequenceEngine.KEPT_ROTATED  # the key caches with shifts


def model_digest(gguf: GGUFFile) -> str:
    """SHA-256 (hex) of the file's header and tensor table: the bytes before its tensor data."""
    with memoryview(gguf.buffer()) as whole, whole[: gguf.data_offset] as head:
        return hashlib.sha256(head).hexdigest()


@dataclass(frozen=True)
class StateHeader:
    """What a state file says about the cache it holds (its JSON header)."""

    model_sha256: str
    arch: str
    engine: str  # the engine that wrote it (both engines' rows are the same bytes)
    n_ctx: int
    cache_type_k: str
    cache_type_v: str
    k_row_bytes: int
    v_row_bytes: int
    windows: tuple[int, ...]  # (n_layer) sliding window of each layer, 0 for none
    kept: tuple[int, ...]  # (n_layer) positions each layer keeps: n_ctx or a ring's
    n_batch: int  # the batch size, which sizes the rings
    policy: str  # context policy name, with the tokens it keeps at the start
    n_keep: int
    n_sink: int
    n_past: int  # positions the cache holds
    n_history: int  # tokens evaluated: n_past + dropped
    hole: int  # where the dropped run of history starts (-1: none)
    dropped: int
    kivi_group: int  # a KIVI cache's G and R; 0 for a cache of rows
    kivi_residual: int
    n_groups: int  # groups quantized: the same for every layer that keeps groups
    group_k_bytes: int
    group_v_bytes: int
    group_kept: tuple[int, ...]  # (n_layer) positions whose groups each layer keeps (0: none)

    def held(self, layer: int) -> int:
        """Rows of ``layer`` in the file: those of positions [n_past - held, n_past)."""
        return min(self.n_past, self.kept[layer])

    def held_groups(self, layer: int) -> int:
        """Groups of ``layer`` in the file: [n_groups - held_groups, n_groups)."""
        return _groups_kept(self, self.group_kept[layer])

    @property
    def body_bytes(self) -> int:
        rows = sum(self.held(il) for il in range(len(self.kept)))
        groups = sum(self.held_groups(il) for il in range(len(self.kept)))
        return (
            4 * (self.n_history + self.n_past) + rows * (self.k_row_bytes + self.v_row_bytes)
            + groups * (self.group_k_bytes + self.group_v_bytes)
        )  # fmt: skip

    def to_json(self) -> bytes:
        fields = {f: getattr(self, f) for f in HEADER_FIELDS}
        for key in _LIST_FIELDS:
            fields[key] = list(fields[key])
        return json.dumps(fields, separators=(",", ":")).encode()


def _groups_kept(h: StateHeader, positions: int) -> int:
    """The newest of the state's n_groups groups a layer keeping the groups of ``positions``
    positions holds: those lying wholly within its last ``positions`` positions."""
    if not positions or not h.kivi_group:
        return 0
    first = -(-max(0, h.n_past - positions) // h.kivi_group)  # the first group held whole
    return max(0, h.n_groups - first)


HEADER_FIELDS = tuple(StateHeader.__dataclass_fields__)
_TEXT_FIELDS = ("model_sha256", "arch", "engine", "cache_type_k", "cache_type_v", "policy")
_LIST_FIELDS = ("windows", "kept", "group_kept")


def _bad(path: Path, why: str) -> errors.StateFileError:
    return errors.StateFileError(f"{path}: not a usable state file: {why}")


def _int_field(path: Path, raw: dict[str, Any], key: str, lo: int, hi: int) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        shown = repr(value)[:40]  # a hostile value may be long
        raise _bad(path, f"header field {key} is {shown}, not an integer in [{lo}, {hi}]")
    return value


def _parse_header(path: Path, text: bytes) -> StateHeader:
    """The header's fields, each checked for its type and range, and their consistency."""
    try:
        raw = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise _bad(path, f"its header is not JSON ({type(e).__name__})") from None
    if not isinstance(raw, dict) or set(raw) != set(HEADER_FIELDS):
        extra = sorted(set(raw) - set(HEADER_FIELDS)) if isinstance(raw, dict) else []
        missing = sorted(set(HEADER_FIELDS) - set(raw)) if isinstance(raw, dict) else ["all"]
        raise _bad(path, f"its header has the fields {extra[:4]} too many, {missing[:4]} missing")
    out: dict[str, Any] = {}
    for key in _TEXT_FIELDS:
        if not isinstance(raw[key], str) or len(raw[key]) > 256:
            raise _bad(path, f"header field {key} is not a short string")
        out[key] = raw[key]
    big = 1 << 40
    for key in HEADER_FIELDS:
        if key not in _TEXT_FIELDS and key not in _LIST_FIELDS:
            out[key] = _int_field(path, raw, key, -1 if key == "hole" else 0, big)
    for key in _LIST_FIELDS:
        items = raw[key]
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_LAYERS:
            raise _bad(path, f"header field {key} is not a list of 1 to {MAX_LAYERS} layers")
        values = {str(i): v for i, v in enumerate(items)}
        out[key] = tuple(_int_field(path, values, str(i), 0, big) for i in range(len(items)))
    h = StateHeader(**out)
    _check_consistent(path, h)
    return h


def _check_consistent(path: Path, h: StateHeader) -> None:
    """Refuses a header whose fields contradict each other."""
    if len(h.windows) != len(h.kept):
        raise _bad(path, f"{len(h.windows)} windows but {len(h.kept)} layers of rows")
    if h.n_past > h.n_ctx:
        raise _bad(path, f"it holds {h.n_past} positions, more than its context of {h.n_ctx}")
    if not all(1 <= k <= h.n_ctx for k in h.kept):
        raise _bad(path, f"a layer keeps more positions than the context of {h.n_ctx} (or none)")
    if h.k_row_bytes == 0 or h.v_row_bytes == 0:
        raise _bad(path, "a cache row of 0 bytes")
    if h.n_history != h.n_past + h.dropped:
        raise _bad(path, f"{h.n_history} tokens evaluated, {h.n_past} held, {h.dropped} dropped")
    if (h.hole < 0) != (h.dropped == 0) or h.hole > h.n_past:
        raise _bad(path, f"a dropped run of {h.dropped} tokens at {h.hole}")
    if len(h.group_kept) != len(h.kept) or not all(k <= h.n_ctx for k in h.group_kept):
        raise _bad(path, f"{len(h.group_kept)} layers of groups, or more than the context")
    grouped = (h.kivi_group, h.group_k_bytes, h.group_v_bytes)
    if not h.kivi_group and (any(grouped) or h.n_groups or any(h.group_kept)):
        raise _bad(path, "KIVI groups in a cache of rows")
    if h.kivi_group and (h.kivi_group not in kivi.GROUPS or not all(grouped)):
        raise _bad(path, f"KIVI groups of {h.kivi_group} positions, or of 0 bytes")
    if h.kivi_group and h.n_groups * h.kivi_group > h.n_past:
        raise _bad(path, f"{h.n_groups} quantized groups beyond the {h.n_past} positions held")
    for il in range(len(h.kept)):  # the rows after the groups are all there
        if h.held_groups(il) and h.n_past - h.held(il) > h.n_groups * h.kivi_group:
            raise _bad(path, f"layer {il} lacks the residual rows after its groups")


# --- what the model expects ----------------------------------------------------------------


def header_for(gguf: GGUFFile, cfg: DecoderConfig, session: KVSession) -> StateHeader:
    """The header of a state of ``session`` (sequence 0) as it stands."""
    engine = session.engine
    if not engine.can_save_rows:
        raise errors.InvalidOptionError(f"the {engine.name} engine cannot save its cache")
    policy = session.policy
    if policy.tracks_attention:  # the next evictions would follow other scores after a load
        raise errors.InvalidOptionError(
            f"a state under the {policy.name} context policy cannot be saved: its attention "
            "scores are not part of a state file"
        )
    k_bytes, v_bytes = engine.cache_row_bytes()
    hole, dropped = session.dropped_run
    group, residual, n_groups, group_bytes = 0, 0, 0, (0, 0)
    group_kept = (0,) * cfg.n_layer
    if engine.kivi is not None:
        group, residual = engine.kivi
        n_groups, group_bytes = engine.quantized_groups(0), engine.group_bytes()
        group_kept = tuple(engine.layer_groups(il) for il in range(cfg.n_layer))
    return StateHeader(
        model_sha256=model_digest(gguf), arch=cfg.arch, engine=engine.name, n_ctx=engine.n_ctx,
        cache_type_k=engine.cache_type_k or "", cache_type_v=engine.cache_type_v or "",
        k_row_bytes=k_bytes, v_row_bytes=v_bytes,
        windows=tuple(cfg.layer_window(il) for il in range(cfg.n_layer)),
        kept=tuple(engine.layer_rows(il) for il in range(cfg.n_layer)), n_batch=session.n_batch,
        policy=policy.name, n_keep=policy.n_keep, n_sink=policy.n_sink,
        n_past=engine.seq_length(0), n_history=len(session.history),
        hole=-1 if hole is None else hole, dropped=dropped, kivi_group=group,
        kivi_residual=residual, n_groups=n_groups, group_k_bytes=group_bytes[0],
        group_v_bytes=group_bytes[1], group_kept=group_kept,
    )  # fmt: skip


def _check_fits(path: Path, saved: StateHeader, now: StateHeader) -> None:
    """Refuses a state written for another model or other cache settings than ``now``'s."""

    def refuse(what: str, theirs: object, ours: object) -> errors.StateMismatchError:
        return errors.StateMismatchError(
            f"{path} was saved with {what} {theirs}; this model has {ours}: not loaded"
        )

    if saved.model_sha256 != now.model_sha256:
        arch = f"an {saved.arch} model" if saved.arch != now.arch else "another model file"
        raise refuse("model", f"{saved.model_sha256[:16]}... ({arch})", now.model_sha256[:16])
    for what in (
        "n_ctx", "cache_type_k", "cache_type_v", "k_row_bytes", "v_row_bytes", "kivi_group",
        "kivi_residual", "group_k_bytes", "group_v_bytes",
    ):  # fmt: skip
        if getattr(saved, what) != getattr(now, what):
            raise refuse(what, getattr(saved, what), getattr(now, what))
    if saved.windows != now.windows:
        raise refuse("layer windows", list(saved.windows), list(now.windows))
    if (saved.policy, _policy_kept(saved)) != (now.policy, _policy_kept(now)):
        raise refuse("context policy", _policy_text(saved), _policy_text(now))
    for il, kept in enumerate(now.kept):
        if _rows_wanted(saved, il, kept) > saved.held(il):
            raise errors.StateMismatchError(
                f"{path} holds the last {saved.held(il)} of {saved.n_past} positions of layer "
                f"{il} (n_batch {saved.n_batch}); this model's cache keeps {kept} there "
                f"(n_batch {now.n_batch}): not loaded"
            )
        if _groups_kept(saved, now.group_kept[il]) > saved.held_groups(il):
            raise errors.StateMismatchError(
                f"{path} holds the last {saved.held_groups(il)} of {saved.n_groups} KIVI groups "
                f"of layer {il}; this model's cache keeps more there: not loaded"
            )


def _rows_wanted(saved: StateHeader, layer: int, kept: int) -> int:
    """Rows of ``layer`` a cache keeping ``kept`` positions takes from ``saved``: its newest
    (a KIVI residual needs none below the groups it takes, which a query reads quantized)."""
    want = min(saved.n_past, kept)
    if saved.kivi_group:
        want = min(want, max(saved.n_past - saved.n_groups * saved.kivi_group, saved.held(layer)))
    return want


def _policy_kept(h: StateHeader) -> int:
    return {"shift": h.n_keep, "streaming": h.n_sink}.get(h.policy, 0)


def _policy_text(h: StateHeader) -> str:
    kept = {"shift": f" (n_keep {h.n_keep})", "streaming": f" (n_sink {h.n_sink})"}
    return h.policy + kept.get(h.policy, "")


# --- writing ---------------------------------------------------------------------------------


def _row_chunks(h: StateHeader, session: KVSession) -> Iterator[bytes]:
    """The body: the tokens, then each layer's keys and values, a layer at a time."""
    yield np.asarray(session.history, dtype="<i4").tobytes()
    yield session.engine.key_shifts(0).astype("<i4").tobytes()
    for il in range(len(h.kept)):
        k, v = session.engine.read_rows(il, h.n_past - h.held(il), h.held(il))
        yield k
        yield v
    for il in range(len(h.kept)):
        n = h.held_groups(il)
        if n:
            k, v = session.engine.read_groups(il, h.n_groups - n, n)
            yield k
            yield v


def save(
    path: str | os.PathLike[str], gguf: GGUFFile, cfg: DecoderConfig, session: KVSession
) -> int:
    """Writes the state of ``session`` (sequence 0) to ``path`` atomically; returns its bytes."""
    target = Path(path)
    h = header_for(gguf, cfg, session)
    if len(session.tokens) != h.n_past:
        raise errors.BackendError(
            f"the cache holds {h.n_past} positions but the session {len(session.tokens)} tokens"
        )
    text = h.to_json()
    try:
        with atomic_file(target) as out:
            digest = hashlib.sha256()
            for chunk in (_PREFIX.pack(MAGIC, FORMAT_VERSION, len(text)), text,
                          *_row_chunks(h, session)):  # fmt: skip
                digest.update(chunk)
                out.write(chunk)
            out.write(digest.digest())
            size = out.tell()
    except OSError as e:
        raise errors.StateFileError(f"cannot write the state file {target}: {e}") from e
    return size


# --- reading ---------------------------------------------------------------------------------


def _rotated(*names: str) -> bool:
    """Whether any of these cache types stores rows Walsh-Hadamard rotated (for some head)."""
    from edgeinfer.kv_cache import CACHE_TYPES

    return any(n in CACHE_TYPES and CACHE_TYPES[n].hadamard_block(64, keys=True) for n in names)


def read(path: str | os.PathLike[str]) -> tuple[StateHeader, bytes]:
    """The header and body of a state file, checked whole (sizes, checksum); nothing else."""
    source = Path(path)
    try:
        if not stat.S_ISREG(os.stat(source).st_mode):  # a FIFO would block open(), a device
            raise _bad(source, "it is not a regular file")  # never end
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(_PREFIX.size)
            if len(prefix) < _PREFIX.size:
                raise _bad(source, f"{size} bytes, shorter than the {_PREFIX.size}-byte prefix")
            magic, version, n_text = _PREFIX.unpack(prefix)
            if magic != MAGIC:
                raise _bad(source, f"it starts with {magic!r}, not {MAGIC!r}")
            if version not in READ_VERSIONS:
                raise _bad(
                    source, f"format version {version}; this edgeinfer reads versions "
                    f"{', '.join(map(str, READ_VERSIONS))}",
                )  # fmt: skip
            if n_text > MAX_HEADER_BYTES or _PREFIX.size + n_text > size:
                raise _bad(source, f"a header of {n_text} bytes in a file of {size}")
            text = f.read(n_text)
            h = _parse_header(source, text)
            if version < _ROTATED_SINCE and _rotated(h.cache_type_k, h.cache_type_v):
                raise _bad(
                    source, f"format version {version} holds {h.cache_type_k}/{h.cache_type_v} "
                    f"rows unrotated; this edgeinfer stores q8_0 and q4_0 rows Walsh-Hadamard "
                    f"rotated (format {_ROTATED_SINCE}): evaluate the prompt again",
                )  # fmt: skip
            no_shifts = 4 * h.n_past if version < 3 else 0  # read as 0s
            expected = _PREFIX.size + n_text + h.body_bytes - no_shifts + DIGEST_BYTES
            if size != expected:
                what = "truncated" if size < expected else "longer than it says"
                raise _bad(source, f"{what}: {size} bytes, its header announces {expected}")
            body = f.read(h.body_bytes - no_shifts)
            stored = f.read(DIGEST_BYTES)
    except OSError as e:
        raise errors.StateFileError(f"cannot read the state file {source}: {e}") from e
    digest = hashlib.sha256(prefix + text)
    digest.update(body)
    if len(body) != h.body_bytes - no_shifts or digest.digest() != stored:
        raise _bad(source, "its checksum does not match (the file is corrupt)")
    if no_shifts:
        at = 4 * h.n_history
        body = body[:at] + bytes(no_shifts) + body[at:]
    return h, body


def _check_shifts(path: Path, h: StateHeader, shifts: np.ndarray) -> None:
    """Refuses key shifts no cache of the header's settings holds: a key rotated ahead of its
    position outside the context, or in a cache that rotates its keys back when they move."""
    room = h.n_ctx - 1 - np.arange(len(shifts))
    bad = np.flatnonzero((shifts < 0) | (shifts > room))
    if len(bad):
        p = int(bad[0])
        raise _bad(path, f"position {p} holds a key rotated {int(shifts[p])} positions ahead")
    if shifts.any() and (h.kivi_group or h.cache_type_k not in KEPT_ROTATED):
        raise _bad(
            path, f"shifted keys, but its {h.cache_type_k} key cache rotates keys where they move"
        )


def load(
    path: str | os.PathLike[str], gguf: GGUFFile, cfg: DecoderConfig, session: KVSession
) -> int:
    """Restores sequence 0 of ``session`` from ``path``; returns the positions restored. On an
    error the session is left as it was (a bad file) or empty (a failure while restoring)."""
    saved, body = read(path)
    now = header_for(gguf, cfg, session)
    _check_fits(Path(path), saved, now)
    history = np.frombuffer(body, dtype="<i4", count=saved.n_history)
    if saved.n_history and (history.min() < 0 or history.max() >= cfg.n_vocab):
        raise _bad(Path(path), f"a token id outside [0, {cfg.n_vocab})")
    shifts = np.frombuffer(body, dtype="<i4", count=saved.n_past, offset=4 * saved.n_history)
    _check_shifts(Path(path), saved, shifts)
    engine = session.engine
    session.reset()
    engine.seq_clear(0)
    try:
        at = 4 * (saved.n_history + saved.n_past)
        for il, kept in enumerate(now.kept):
            held, want = saved.held(il), _rows_wanted(saved, il, kept)
            k_at = at + (held - want) * saved.k_row_bytes  # a smaller ring takes the newest
            v_at = at + held * saved.k_row_bytes + (held - want) * saved.v_row_bytes
            k = body[k_at : k_at + want * saved.k_row_bytes]
            v = body[v_at : v_at + want * saved.v_row_bytes]
            engine.write_rows(il, saved.n_past - want, k, v)
            at += held * (saved.k_row_bytes + saved.v_row_bytes)
        for il in range(len(now.kept) if saved.kivi_group else 0):
            held, want = saved.held_groups(il), _groups_kept(saved, now.group_kept[il])
            kb, vb = saved.group_k_bytes, saved.group_v_bytes
            k_at, v_at = at + (held - want) * kb, at + held * kb + (held - want) * vb
            engine.write_groups(
                il, saved.n_groups - want, body[k_at : k_at + want * kb],
                body[v_at : v_at + want * vb],
            )  # fmt: skip
            at += held * (kb + vb)
        engine.set_length(saved.n_past)
        engine.set_key_shifts(shifts)
        if saved.kivi_group:
            engine.set_quantized_groups(saved.n_groups)
    except BaseException:
        session.reset()
        engine.seq_clear(0)
        raise
    hole = None if saved.hole < 0 else saved.hole
    session.restore(history.tolist(), hole, saved.dropped)
    return saved.n_past
