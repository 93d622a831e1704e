"""Perplexity of a text, computed the way llama.cpp's llama-perplexity does: the tokens are
cut into windows of n_ctx, each window is evaluated from an empty cache (starting with BOS
when the model adds one), and only the second half of every window is scored, so that each
scored token sees at least n_ctx/2 tokens of context.

The same run can save its next-token distributions as a *baseline* (``save_logits``), and a
later run (another weight type, another KV-cache type) can be compared with it
(:func:`kl_divergence`): KL divergence, top-1 agreement and the change in the observed token's
probability, as llama.cpp's ``--kl-divergence-base`` / ``--kl-divergence`` report them.

Baseline file (little-endian), version 1::

    header, 64 bytes: magic b"EIKLBASE", then uint32 version, n_vocab, n_ctx, n_windows,
        n_scored (tokens scored per window), 32 bytes SHA-256 of the evaluated token ids
        (int32, every window as evaluated, BOS included), uint32 CRC-32 of the 60 bytes before
    n_windows blocks, each n_scored records then the uint32 CRC-32 of those records
    record, 28 + 2 * n_vocab bytes: float64 nll (the observed token's, exact), float64 floor,
        float64 step, uint32 top (the argmax), then uint16 codes[n_vocab]

A code q >= 1 stands for the log-probability ``floor + (q - 1) * step``; q = 0 for a token
more than LOG_RANGE nats below the top one, whose probability is then taken as 0 (at most
n_vocab * exp(-32) of the mass, 3e-9 for a 262,144-token vocabulary). The codes span
[top - min(spread, LOG_RANGE), top] in 65,534 steps, so a log-probability is off by at most
half a step: 2.5e-4 nats. The decoded distribution is renormalized, which keeps that error from
entering the KL to first order: a run against its own baseline gives a KL of at most
(exp(2 * 2.5e-4) - 1)^2 = 2.4e-7 per token. Gemma 3's vocabulary makes a record 524,316 bytes,
0.5 MiB per scored token (128 MiB per window of 512): the same size as llama.cpp's.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import BinaryIO

import numpy as np

from edgeinfer import errors
from edgeinfer.atomic_file import atomic_file

MAGIC = b"EIKLBASE"
VERSION = 1
HEADER = struct.Struct("<8s5I32s")  # magic, version, n_vocab, n_ctx, n_windows, n_scored, sha
HEADER_SIZE = HEADER.size + 4  # then the CRC-32 of the bytes above: 64
RECORD_FIXED = 8 + 8 + 8 + 4  # nll, floor, step, top
LOG_RANGE = 32.0  # nats below the top token that the codes cover
CODE_STEPS = 65534  # steps between code 1 (the floor) and code 65535 (the top)
CHUNK_VALUES = 1 << 18  # logits in float64 at a time: 2 MiB per temporary, one Gemma row


def record_dtype(n_vocab: int) -> np.dtype:
    """One scored token of a baseline: 28 + 2 * n_vocab bytes, packed."""
    return np.dtype(
        [("nll", "<f8"), ("floor", "<f8"), ("step", "<f8"), ("top", "<u4"),
         ("codes", "<u2", (n_vocab,))]
    )  # fmt: skip


@dataclass
class PerplexityResult:
    perplexity: float
    nll: float  # mean negative log-likelihood per scored token (nats)
    scored_tokens: int
    windows: int

    def as_dict(self) -> dict[str, float | int]:
        return {"perplexity": self.perplexity, "nll": self.nll, "scored_tokens": self.scored_tokens,
                "windows": self.windows}  # fmt: skip


@dataclass
class KLDivergenceResult:
    """This run against a saved baseline, over the same scored tokens. KL is KL(base || this),
    in nats per token; top-1 agreement is the fraction of tokens whose argmax is the baseline's;
    RMS Δp is the root mean square of the change in the observed token's probability."""

    perplexity: float
    base_perplexity: float
    nll: float
    base_nll: float
    kl_mean: float
    kl_stderr: float
    kl_median: float
    kl_p99: float
    kl_max: float
    top1_agreement: float
    top1_stderr: float
    rms_delta_p: float
    scored_tokens: int
    windows: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class _Header:
    n_vocab: int
    n_ctx: int
    n_windows: int
    n_scored: int
    tokens_sha256: bytes

    def pack(self) -> bytes:
        head = HEADER.pack(MAGIC, VERSION, self.n_vocab, self.n_ctx, self.n_windows,
                           self.n_scored, self.tokens_sha256)  # fmt: skip
        return head + struct.pack("<I", zlib.crc32(head))

    def file_size(self) -> int:
        # arithmetic, not record_dtype(): a forged n_vocab must fail the size check, not numpy
        block = self.n_scored * (RECORD_FIXED + 2 * self.n_vocab) + 4
        return HEADER_SIZE + self.n_windows * block


def perplexity(
    model,
    text: str,
    n_ctx: int = 512,
    max_windows: int | None = None,
    save_logits: str | os.PathLike[str] | None = None,
) -> PerplexityResult:
    """Scores ``text`` with ``model`` (an edgeinfer Model) in windows of ``n_ctx`` tokens.

    With ``save_logits``, also writes every scored token's distribution there as a baseline
    for :func:`kl_divergence` (atomically: the file appears only once complete)."""
    windows = _windows(model, text, n_ctx, max_windows)
    first = n_ctx // 2
    header = _Header(model.n_vocab, n_ctx, len(windows), n_ctx - first, _tokens_sha256(windows))
    with contextlib.ExitStack() as stack:
        out = None if save_logits is None else stack.enter_context(atomic_file(save_logits))
        if out is not None:
            out.write(header.pack())
        total, count = 0.0, 0
        for window in windows:
            crc, nll_parts = 0, []
            for pred, target in _scored_chunks(model, window, first):
                log_z = _log_z(pred)
                nll_parts.append(log_z - pred[np.arange(len(target)), target])
                if out is not None:
                    record = _encode(pred - log_z[:, None], nll_parts[-1])
                    crc = zlib.crc32(record.data, crc)
                    out.write(record.data)
            if out is not None:
                out.write(struct.pack("<I", crc))
            nll = np.concatenate(nll_parts)
            total += float(np.sum(nll))
            count += len(nll)
    mean = total / count
    return PerplexityResult(math.exp(mean), mean, count, len(windows))


def kl_divergence(
    model,
    text: str,
    base: str | os.PathLike[str],
    n_ctx: int = 512,
    max_windows: int | None = None,
) -> KLDivergenceResult:
    """Scores ``text`` as :func:`perplexity` does and compares every scored token's
    distribution with the baseline saved at ``base`` by ``perplexity(..., save_logits=base)``.

    By default as many windows as the baseline holds are scored. A baseline written for other
    tokens, another ``n_ctx`` or window count or vocabulary, or one that is truncated or
    corrupt, raises :class:`edgeinfer.errors.InputFileError`."""
    with open(base, "rb") as f:
        header = _read_header(f, os.fspath(base))
        n_windows = header.n_windows if max_windows is None else max_windows
        windows = _windows(model, text, n_ctx, n_windows)
        _check_compatible(header, model.n_vocab, n_ctx, windows, os.fspath(base))
        tally = _KLTally()
        for w, window in enumerate(windows):
            reader = _WindowReader(f, header.n_vocab)
            for pred, target in _scored_chunks(model, window, n_ctx // 2):
                tally.add(pred, target, reader.read(len(target)))
            if not reader.checksum_matches():
                raise errors.InputFileError(
                    f"{os.fspath(base)} is corrupt: window {w + 1} fails its checksum"
                )
            tally.end_window()
    return tally.result(len(windows))


# --- windows and their scored rows -----------------------------------------------------------


def _windows(model, text: str, n_ctx: int, max_windows: int | None) -> list[list[int]]:
    """The token windows as evaluated: n_ctx tokens each, the first one BOS if the model adds
    one (as llama-perplexity)."""
    if n_ctx < 4 or n_ctx > model.n_ctx:
        raise errors.InvalidOptionError(
            f"the window must lie in [4, {model.n_ctx}] tokens, not {n_ctx}"
        )
    tokens = model.tokenize(text, add_special=False)
    bos = model.tokenizer.bos_id if model.tokenizer.add_bos else None
    n_windows = len(tokens) // n_ctx
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    if n_windows < 1:
        raise errors.InvalidOptionError(
            f"the text has {len(tokens)} tokens, fewer than one window of {n_ctx}"
        )
    windows = []
    for w in range(n_windows):
        window = list(tokens[w * n_ctx : (w + 1) * n_ctx])
        if bos is not None:
            window[0] = bos
        windows.append(window)
    return windows


def _tokens_sha256(windows: Sequence[Sequence[int]]) -> bytes:
    return hashlib.sha256(np.asarray(windows, dtype="<i4").tobytes()).digest()


@dataclass
class StreamPerplexityResult:
    perplexity: float
    nll: float  # mean negative log-likelihood per scored token (nats)
    scored_tokens: int
    dropped_tokens: int  # positions the context policy dropped on the way
    tok_s: float  # tokens evaluated per second

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def stream_perplexity(model, text: str, max_tokens: int | None = None) -> StreamPerplexityResult:
    """Scores ``text`` as one stream through the model's context, under the context policy
    it was loaded with (``load(context_policy=...)``): every token after the first is
    predicted from what the cache holds then. This is the evaluation StreamingLLM makes;
    :func:`perplexity`'s independent windows are llama-perplexity's. The model's cached
    conversation is forgotten."""
    import time

    from edgeinfer.context_policy import make_room

    policy = model.context_policy
    tokens = model.tokenize(text, add_special=True)[: max_tokens or None]
    if len(tokens) < 2:
        raise errors.InvalidOptionError(f"the text has {len(tokens)} tokens: nothing to score")
    eng = model.backend
    # a chunk is scored against the cache as it was before the chunk: an eighth of the room
    step = max(1, min(512, (eng.n_ctx - policy.kept) // 8))
    model.reset()
    total, dropped, t0 = 0.0, 0, time.perf_counter()
    try:
        for start in range(0, len(tokens) - 1, step):
            piece = tokens[start : start + step]
            dropped += sum(n for _, n in make_room(eng, policy, len(piece)))
            logits = eng.forward(piece, all_logits=True)
            target = np.asarray(tokens[start + 1 : start + 1 + len(piece)])
            pred = logits[: len(target)].astype(np.float64)
            total += float(np.sum(_log_z(pred) - pred[np.arange(len(target)), target]))
    finally:
        model.reset()
    n = len(tokens) - 1
    return StreamPerplexityResult(
        math.exp(total / n), total / n, n, dropped, len(tokens) / (time.perf_counter() - t0)
    )


def _scored_chunks(model, window: list[int], first: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The logits that predict the scored tokens (positions first..n_ctx-1) in float64, a few
    rows at a time so that no (n_ctx, n_vocab) float64 copy exists, and the tokens they
    predict."""
    logits = model.logits(window)  # (n_ctx, n_vocab) float32
    rows = max(1, CHUNK_VALUES // logits.shape[1])
    for start in range(first, len(window), rows):
        stop = min(start + rows, len(window))
        yield logits[start - 1 : stop - 1].astype(np.float64), np.asarray(window[start:stop])


def _log_z(pred: np.ndarray) -> np.ndarray:
    """Log of each row's partition function (the same float64 steps as llama-perplexity's
    figure has always been computed with here)."""
    top = pred.max(axis=1)
    return np.log(np.exp(pred - top[:, None]).sum(axis=1)) + top


# --- the baseline's records ------------------------------------------------------------------


def _encode(log_probs: np.ndarray, nll: np.ndarray) -> np.ndarray:
    """Records for rows of log-probabilities (rows, n_vocab): see the module's docstring."""
    top_lp = log_probs.max(axis=1)
    spread = np.minimum(top_lp - log_probs.min(axis=1), LOG_RANGE)
    record = np.zeros(len(log_probs), dtype=record_dtype(log_probs.shape[1]))
    record["nll"], record["top"] = nll, np.argmax(log_probs, axis=1)
    record["floor"] = top_lp - spread
    record["step"] = spread / CODE_STEPS
    step = np.where(record["step"] > 0, record["step"], 1.0)  # one value everywhere: code 1
    steps_above_floor = log_probs - record["floor"][:, None]
    steps_above_floor /= step[:, None]
    codes = np.rint(steps_above_floor)
    codes += 1
    np.clip(codes, 1, CODE_STEPS + 1, out=codes)
    codes[steps_above_floor < -0.5] = 0  # beyond LOG_RANGE below the top: probability 0
    record["codes"] = codes
    return record


def decode(record: np.ndarray) -> np.ndarray:
    """The normalized log-probabilities (rows, n_vocab) of records; -inf where a code is 0."""
    codes = record["codes"]
    log_probs = record["floor"][:, None] + (codes - 1.0) * record["step"][:, None]
    log_probs[codes == 0] = -np.inf
    return log_probs - _log_z(log_probs)[:, None]


class _WindowReader:
    """Reads one window's records from a baseline, a chunk at a time, checksumming them."""

    def __init__(self, f: BinaryIO, n_vocab: int) -> None:
        self.f, self.dtype, self.crc = f, record_dtype(n_vocab), 0

    def read(self, n: int) -> np.ndarray:
        data = self.f.read(n * self.dtype.itemsize)
        if len(data) != n * self.dtype.itemsize:  # the size was checked: the file shrank
            raise errors.InputFileError(f"{self.f.name} ended early while being read")
        self.crc = zlib.crc32(data, self.crc)
        return np.frombuffer(data, dtype=self.dtype)

    def checksum_matches(self) -> bool:
        stored = self.f.read(4)
        return len(stored) == 4 and struct.unpack("<I", stored)[0] == self.crc


def _read_header(f: BinaryIO, name: str) -> _Header:
    data = f.read(HEADER_SIZE)
    if len(data) < len(MAGIC) or not data.startswith(MAGIC):
        raise errors.InputFileError(f"{name} is not an edgeinfer logits baseline (no magic)")
    if len(data) < HEADER_SIZE:
        raise errors.InputFileError(f"{name} is truncated: {len(data)} bytes, no whole header")
    magic, version, n_vocab, n_ctx, n_windows, n_scored, sha = HEADER.unpack(data[:-4])
    if version != VERSION:
        raise errors.InputFileError(
            f"{name} is a baseline of format version {version}; this edgeinfer reads {VERSION}"
        )
    if struct.unpack("<I", data[-4:])[0] != zlib.crc32(data[:-4]):
        raise errors.InputFileError(f"{name} is corrupt: its header fails its checksum")
    header = _Header(n_vocab, n_ctx, n_windows, n_scored, sha)
    size = os.fstat(f.fileno()).st_size
    if size != header.file_size():
        state = "truncated" if size < header.file_size() else "too long"
        raise errors.InputFileError(
            f"{name} is {state}: {size} bytes, its header announces {header.file_size()}"
        )
    return header


def _check_compatible(
    header: _Header, n_vocab: int, n_ctx: int, windows: list[list[int]], name: str
) -> None:
    if header.n_vocab != n_vocab:
        raise errors.InputFileError(
            f"{name} was saved with a vocabulary of {header.n_vocab} tokens; "
            f"this model has {n_vocab}"
        )
    if header.n_ctx != n_ctx:
        raise errors.InputFileError(
            f"{name} was saved with windows of {header.n_ctx} tokens; this run uses {n_ctx}"
        )
    if header.n_windows != len(windows):
        raise errors.InputFileError(
            f"{name} holds {header.n_windows} windows; this run scores {len(windows)}"
        )
    if header.tokens_sha256 != _tokens_sha256(windows):
        raise errors.InputFileError(
            f"{name} was saved for other tokens (another text or tokenizer)"
        )


# --- the KL figures --------------------------------------------------------------------------


class _KLTally:
    """Per-token figures of a comparison; only one float per scored token is kept per figure
    (never the distributions), so memory grows with the token count alone."""

    def __init__(self) -> None:
        self.kl: list[np.ndarray] = []
        self.delta_p: list[np.ndarray] = []
        self.same_top = 0
        self.nll_parts: list[np.ndarray] = []
        self.base_parts: list[np.ndarray] = []
        self.total = self.base_total = 0.0

    def add(self, pred: np.ndarray, target: np.ndarray, record: np.ndarray) -> None:
        log_z = _log_z(pred)
        # decode() fused with the sum, for a third of its passes over the vocabulary: the
        # baseline's log-probabilities relative to its top token, unnormalized
        codes = record["codes"]
        below_top = (codes - (CODE_STEPS + 1.0)) * record["step"][:, None]
        weight = np.exp(below_top)
        weight *= codes > 0  # code 0: probability 0 (below_top stays finite: no 0 * -inf)
        norm = weight.sum(axis=1)
        # log p - log q, with log p = below_top - log(norm) and log q = pred - log_z
        gap = below_top - pred
        gap += (log_z - np.log(norm))[:, None]
        self.kl.append(np.einsum("ij,ij->i", weight, gap) / norm)
        self.same_top += int(np.sum(np.argmax(pred, axis=1) == record["top"]))
        nll = log_z - pred[np.arange(len(target)), target]
        self.nll_parts.append(nll)
        self.base_parts.append(record["nll"])
        self.delta_p.append(np.exp(-nll) - np.exp(-record["nll"]))

    def end_window(self) -> None:
        # summed per window, as perplexity() sums, so both perplexities equal that function's
        self.total += float(np.sum(np.concatenate(self.nll_parts)))
        self.base_total += float(np.sum(np.concatenate(self.base_parts)))
        self.nll_parts, self.base_parts = [], []

    def result(self, n_windows: int) -> KLDivergenceResult:
        kl, delta_p = np.concatenate(self.kl), np.concatenate(self.delta_p)
        n = len(kl)
        agree = self.same_top / n
        nll, base_nll = self.total / n, self.base_total / n
        return KLDivergenceResult(
            perplexity=math.exp(nll), base_perplexity=math.exp(base_nll), nll=nll,
            base_nll=base_nll, kl_mean=float(np.mean(kl)), kl_stderr=_stderr(kl),
            kl_median=float(np.median(kl)), kl_p99=float(np.percentile(kl, 99)),
            kl_max=float(np.max(kl)), top1_agreement=agree,
            top1_stderr=math.sqrt(agree * (1 - agree) / (n - 1)) if n > 1 else 0.0,
            rms_delta_p=float(np.sqrt(np.mean(delta_p**2))), scored_tokens=n, windows=n_windows,
        )  # fmt: skip


def _stderr(values: np.ndarray) -> float:
    return float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
