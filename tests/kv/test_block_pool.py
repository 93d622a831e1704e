"""The paged block pool: sequences share one pool, a common prefix is held once (by fork, or
by the keys of cached blocks), and random fork / truncate / clear / decode sequences leak
nothing and keep every sequence's logits what a fresh engine computes for its tokens."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer import engines, errors
from edgeinfer.engines import ENGINES
from edgeinfer.engines.base import Batch, EngineOptions
from edgeinfer.gguf import GGUFFile
from edgeinfer.kv_cache import BLOCK_SIZE
from edgeinfer.models import config_from_gguf
from tests.kv.texts import python_help_text


def _engine(path, n_seq_max=1, **options):
    gguf = GGUFFile(path)
    cfg = config_from_gguf(gguf)
    opts = EngineOptions(n_threads=2, n_seq_max=n_seq_max, **options)
    return gguf, engines.create(ENGINES["native"], gguf, cfg, opts)


def _fresh_logits(path, tokens, **options):
    """The last logits of ``tokens`` on a fresh single-sequence engine."""
    gguf, eng = _engine(path, **options)
    try:
        return eng.forward(tokens)
    finally:
        eng.close()
        gguf.close()


@pytest.fixture(scope="module")
def gemma_text(gemma_path):
    from edgeinfer.tokenizer import Tokenizer

    with GGUFFile(gemma_path) as f:
        tok = Tokenizer.from_metadata(f.metadata)
    return tok.tokenize(python_help_text()[:20000])


def _held(eng, window=0):
    return next(g for g in eng.pool_stats()["groups"] if g["window"] == window)


@pytest.mark.slow
def test_a_forked_prefix_is_held_once_and_gives_the_unshared_logits(gemma_path, gemma_text):
    """Two sequences share a 1,000-token prefix, then go on in one batched step."""
    prefix, a, b = gemma_text[:1000], gemma_text[1000:1040], gemma_text[2000:2030]
    opts = {"n_ctx": 2048, "n_batch": 256}
    gguf, eng = _engine(gemma_path, n_seq_max=2, **opts)
    try:
        eng.forward(prefix)
        before = _held(eng)["used"]
        eng.fork(0, 1)
        assert _held(eng)["used"] == before == -(-1000 // BLOCK_SIZE)  # shared, not copied
        batch = Batch(
            np.array(a + b, np.int32),
            np.array([*range(1000, 1040), *range(1000, 1030)], np.int32),
            np.array([0] * 40 + [1] * 30, np.int32),
            np.array([i in (39, 69) for i in range(70)]),
        )
        got = eng.decode(batch)
        # the first writer of the shared partial block (positions 992-999) got a copy; each
        # sequence took one more block for positions 1024 on
        assert _held(eng)["used"] == before + 3
    finally:
        eng.close()
        gguf.close()
    np.testing.assert_array_equal(got[0], _fresh_logits(gemma_path, prefix + a, **opts))
    np.testing.assert_array_equal(got[1], _fresh_logits(gemma_path, prefix + b, **opts))


@pytest.mark.slow
def test_cached_blocks_serve_a_later_sequence(gemma_path, gemma_text):
    """A sequence that is cleared leaves its full blocks cached under their keys; a new one
    with the same first 1,000 tokens takes them (the local layers' window behind them too)
    and computes the rest, with the logits of a fresh run."""
    prefix = gemma_text[:1000]
    first, second = prefix + gemma_text[1000:1200], prefix + gemma_text[3000:3040]
    opts = {"n_ctx": 2048, "n_batch": 256}
    gguf, eng = _engine(gemma_path, n_seq_max=2, **opts)
    try:
        eng.forward(first)
        eng.seq_clear(0)
        stats = eng.pool_stats()
        assert stats["used"] == 0 and stats["cached"] > 0
        reused = eng.reuse(1, second)
        assert reused == 1000 // BLOCK_SIZE * BLOCK_SIZE  # whole blocks of the common prefix
        stats = eng.pool_stats()
        assert stats["hits"] == reused // BLOCK_SIZE and 0 < stats["hit_rate"] <= 1
        got = eng.decode(Batch.sequence(second[reused:], reused, seq=1))[0]
        assert eng.reuse(0, gemma_text[5000:5100]) == 0  # nothing in common
    finally:
        eng.close()
        gguf.close()
    np.testing.assert_array_equal(got, _fresh_logits(gemma_path, second, **opts))


@pytest.mark.parametrize(
    "cache",
    [{}, {"kv_type": "kivi4", "kivi_residual": 16}, {"kv_type": "kivi2", "kivi_group": 64,
                                                     "kivi_residual": 0}],
    ids=["f16", "kivi4", "kivi2-g64"],
)  # fmt: skip
def test_random_operations_leak_nothing_and_keep_the_logits(fixture_models, cache):
    """Fork, truncate, clear, reuse and batched decodes at random on four sequences of a
    small pool; afterwards every sequence's next logits are a fresh engine's for its tokens,
    and with every sequence cleared no block is held. A KIVI cache's quantized groups are
    shared, copied on write and made stale by a rewind like any block."""
    path = fixture_models["gemma3"]  # it has sliding-window layers: two groups of blocks
    rng = np.random.default_rng(7)
    opts = {"n_ctx": 160, "n_batch": 16, **_kivi_options(cache)}
    gguf, eng = _engine(path, n_seq_max=4, **opts)
    tokens: list[list[int]] = [[] for _ in range(4)]
    try:
        for _ in range(60):
            op, s = rng.integers(5), int(rng.integers(4))
            if op == 0 and tokens[s]:
                d = int(rng.integers(4))
                if d != s:
                    eng.fork(s, d)
                    tokens[d] = list(tokens[s])
            elif op == 1 and tokens[s]:
                eng.truncate(int(rng.integers(len(tokens[s]) + 1)), s)
                tokens[s] = tokens[s][: eng.seq_length(s)]
            elif op == 2:
                eng.seq_clear(s)
                tokens[s] = []
            elif op == 3:
                want = tokens[s] + [int(t) for t in rng.integers(3, 200, 40)]
                tokens[s] = want[: eng.reuse(s, want)]
            else:
                seqs = [q for q in range(4) if len(tokens[q]) < 130 and rng.random() < 0.6]
                new = {q: [int(t) for t in rng.integers(3, 200, rng.integers(1, 20))] for q in seqs}
                if new:
                    eng.decode(_batch(new, tokens))
                    for q, ids in new.items():
                        tokens[q] += ids
            stats = eng.pool_stats()
            for g in stats["groups"]:
                assert g["used"] + g["cached"] + g["free"] == g["blocks"]
        for s in range(4):
            if tokens[s]:
                got = eng.decode(_batch({s: [5]}, tokens))[0]
                np.testing.assert_array_equal(got, _fresh_logits(path, tokens[s] + [5], **opts))
        for s in range(4):
            eng.seq_clear(s)
        assert eng.pool_stats()["used"] == 0
    finally:
        eng.close()
        gguf.close()


def _kivi_options(cache: dict) -> dict:
    """EngineOptions' fields for a cache given as load() options."""
    out = dict(cache)
    if "kv_type" in out:
        out["cache_type_k"] = out["cache_type_v"] = out.pop("kv_type")
    return out


def _batch(new: dict[int, list[int]], tokens: list[list[int]]) -> Batch:
    ids, pos, seq, want = [], [], [], []
    for q, extra in new.items():
        ids += extra
        pos += range(len(tokens[q]), len(tokens[q]) + len(extra))
        seq += [q] * len(extra)
        want += [False] * (len(extra) - 1) + [True]
    return Batch(np.array(ids, np.int32), np.array(pos, np.int32), np.array(seq, np.int32),
                 np.array(want))  # fmt: skip


def test_budgets(fixture_models):
    import edgeinfer

    path = fixture_models["llama"]
    gguf, eng = _engine(path, n_ctx=256)
    per_block = eng.pool_stats()["groups"][0]["block_bytes"]
    eng.close()
    gguf.close()
    with pytest.raises(errors.InvalidOptionError, match="holds no block"):
        _engine(path, n_ctx=256, kv_budget=per_block // 2)
    gguf, eng = _engine(path, n_ctx=256, kv_budget=3 * per_block + 10)
    try:
        assert eng.pool_stats()["groups"][0]["blocks"] == 3
        eng.forward(list(range(3, 3 + 3 * BLOCK_SIZE)))  # three blocks fit
        eng.truncate(0)
        with pytest.raises(errors.OutOfMemoryError, match="pool is full"):
            eng.forward(list(range(3, 3 + 4 * BLOCK_SIZE)))
    finally:
        eng.close()
        gguf.close()
    with edgeinfer.load(path, n_ctx=256, kv_budget="1MiB") as m:
        assert m.backend.pool_stats()["groups"][0]["blocks"] == (8 << 20) // (8 * per_block)
    with pytest.raises(errors.InvalidOptionError, match="memory size"):
        edgeinfer.load(path, kv_budget="lots")


def test_a_session_takes_a_cached_prefix_after_a_reset(fixture_models):
    """A conversation after a reset that starts with the same system prompt takes its full
    blocks from the pool's prefix cache (the first conversation's, released by the reset)
    and gives a fresh engine's logits bit for bit; h2o, whose scores a cached block lacks,
    evaluates everything again."""
    import edgeinfer
    from edgeinfer.generation import KVSession

    system = [int(t) for t in np.random.default_rng(3).integers(3, 200, 100)]
    with edgeinfer.load(fixture_models["llama"], n_ctx=256) as m, \
            edgeinfer.load(fixture_models["llama"], n_ctx=256) as fresh:  # fmt: skip
        session = KVSession(m.backend)
        session.evaluate([*system, 7, 8, 9])
        session.reset()
        hits = m.backend.pool_stats()["hits"]
        logits, reused = session.evaluate([*system, 20, 21])
        assert reused == 100 // BLOCK_SIZE * BLOCK_SIZE
        assert m.backend.pool_stats()["hits"] - hits == 100 // BLOCK_SIZE
        assert session.tokens == session.history == [*system, 20, 21]
        assert np.array_equal(logits, fresh.backend.forward([*system, 20, 21]))
    with edgeinfer.load(fixture_models["llama"], n_ctx=256, context_policy="h2o") as m:
        session = KVSession(m.backend, policy=m.context_policy)
        session.evaluate([*system, 7])
        session.reset()
        assert session.evaluate([*system, 20])[1] == 0


def test_a_fork_of_a_sequence_that_dropped_positions_keys_no_blocks(fixture_models):
    """After a discard the moved rows are not what evaluating their tokens gives (their keys
    saw the dropped context): a fork of that sequence must not key the blocks it fills, or a
    later prompt with those tokens would take rows that do not belong to it."""
    tokens = [int(t) for t in np.random.default_rng(5).integers(3, 200, 100)]
    gguf, eng = _engine(fixture_models["llama"], n_seq_max=2, n_ctx=256)
    try:
        eng.forward(tokens)
        eng.discard(4, 20, 0)
        eng.fork(0, 1)
        eng.decode(Batch.sequence(tokens[80:], 80, seq=1))  # fills blocks of seq 1
        eng.seq_clear(0)
        eng.seq_clear(1)
        assert eng.reuse(0, tokens) == 0
        got = eng.decode(Batch.sequence(tokens, 0))[0]
    finally:
        eng.close()
        gguf.close()
    np.testing.assert_array_equal(got, _fresh_logits(fixture_models["llama"], tokens, n_ctx=256))
