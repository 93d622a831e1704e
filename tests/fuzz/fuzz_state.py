"""Fuzz target: saved sessions (edgeinfer.session_state) fed to ``Model.load_state``.

The first byte of an input chooses how the rest is used: bit 0 reseals it (its last 32 bytes
replaced by the SHA-256 of the others, so that mutations of the header and body get past the
checksum to the checks behind it), bit 1 loads it into the numpy engine rather than the
native one, bit 2 goes on to generate a token after a successful load, bit 3 loads it into a
KIVI cache (kivi4, groups of 32, a residual of 8) rather than an f16 one, bit 4 (without bit 3)
into a q4_0 cache under the streaming policy, whose keys carry shifts once positions were
dropped (simd/common/key_shifts.h). The rest is written
to a file in memory (/dev/shm where there is one) and loaded into the tiny llama fixture
(context 64). Beyond "typed errors only", a load that succeeds must leave the session
consistent: the engine holds as many positions as the session has tokens, and a KIVI cache
no more quantized groups than those positions fill.

The seeds are states saved from that model: empty, after a prompt, after a generation (for
the q4_0 cache, past the context), from each engine and each cache, each sealed and resealed.

    python -m tests.fuzz.fuzz_state --runs 1000000 --corpus DIR --artifacts DIR
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import atheris

from tests.fuzz import harness

with atheris.instrument_imports(include=["edgeinfer"]):
    import edgeinfer
    from edgeinfer import _native, api, generation, session_state  # noqa: F401 (instrumented)
    from edgeinfer.engines import base, reference  # noqa: F401 (instrumented)

N_CTX = 64
ENGINES = ("native", "reference")
RESEAL, REFERENCE, GENERATE, KIVI, SHIFTED = 1, 2, 4, 8, 16
CACHES = ("f16", "kivi", "shifted")
CACHE_OPTIONS: dict[str, dict[str, Any]] = {
    "f16": {},
    "kivi": {"kv_type": "kivi4", "kivi_group": 32, "kivi_residual": 8},
    "shifted": {"kv_type": "q4_0", "context_policy": "streaming", "n_sink": 4},
}
DIGEST_BYTES = 32

_SHM = "/dev/shm"
_WORK = Path(
    tempfile.mkdtemp(prefix="edgeinfer-fuzz-state-", dir=_SHM if os.path.isdir(_SHM) else None)
)
atexit.register(shutil.rmtree, _WORK, ignore_errors=True)
_INPUT = _WORK / "input.state"


@functools.cache
def _model_path() -> Path:
    from tests.conftest import _fixture_models, packaged_gemma_path

    return _fixture_models(packaged_gemma_path(), all_f32=False)["llama"]


@functools.cache
def models() -> dict[tuple[str, str], Any]:
    """One model per engine and cache, loaded once per process."""
    return {
        (e, cache): edgeinfer.load(_model_path(), engine=e, n_ctx=N_CTX, **CACHE_OPTIONS[cache])
        for e in ENGINES
        for cache in CACHES
    }


def _cache(flags: int) -> str:
    return "kivi" if flags & KIVI else "shifted" if flags & SHIFTED else "f16"


def _flags(cache: str) -> int:
    return {"f16": 0, "kivi": KIVI, "shifted": SHIFTED}[cache]


def reseal(data: bytes) -> bytes:
    if len(data) < DIGEST_BYTES:
        return data
    body = data[:-DIGEST_BYTES]
    return body + hashlib.sha256(body).digest()


def one_input(data: bytes) -> None:
    if not data:
        return
    flags, payload = data[0], data[1:]
    _INPUT.write_bytes(reseal(payload) if flags & RESEAL else payload)
    model = models()[("reference" if flags & REFERENCE else "native", _cache(flags))]
    session = model._session
    try:
        n = model.load_state(_INPUT)
    finally:
        assert model.backend.n_past == len(session.tokens), "the session and the cache disagree"
    assert n == model.backend.n_past <= N_CTX
    if flags & KIVI:
        assert 32 * model.backend.quantized_groups() <= n, "groups beyond the positions"
    shifts = model.backend.key_shifts()
    assert len(shifts) == n and (shifts + range(n) < N_CTX).all(), "keys rotated past the context"
    if flags & GENERATE:
        model.generate(session.history + [1], max_tokens=1, temperature=0)


# --- seeds -------------------------------------------------------------------------------


def _states() -> Iterator[tuple[str, bytes]]:
    """States of the fixture model from each engine and cache: empty, a prompt, a generation
    (a KIVI cache's prompt is long enough to fill a group; the q4_0 cache's generation goes
    past the context, so that its keys carry shifts)."""
    path = _WORK / "seed.state"
    for engine, cache in [(e, c) for e in ENGINES for c in CACHES]:
        prompt = [1 + (7 * i) % 300 for i in range(50 if cache == "kivi" else 20)]
        options = CACHE_OPTIONS[cache]
        with edgeinfer.load(_model_path(), engine=engine, n_ctx=N_CTX, **options) as m:
            m.save_state(path)
            yield cache, path.read_bytes()
            m.generate(prompt, max_tokens=0)
            m.save_state(path)
            yield cache, path.read_bytes()
            m.generate(prompt, max_tokens=60 if cache == "shifted" else 3, temperature=0)
            m.save_state(path)
            yield cache, path.read_bytes()


def seeds() -> Iterator[bytes]:
    for cache, state in _states():
        for flags in (0, RESEAL | GENERATE, REFERENCE | RESEAL):
            yield bytes([flags | _flags(cache)]) + state


if __name__ == "__main__":
    harness.main(one_input, seeds)
