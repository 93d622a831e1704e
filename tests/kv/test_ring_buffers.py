"""Sliding-window layers give back the blocks behind their window (a ring of blocks): the same
logits as the full-size cache, memory that grows only with the global layers, and rewinds that
either keep the prefix (within the slack) or start the sequence over."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from edgeinfer.kv_cache import BLOCK_SIZE, cache_bytes
from tests.kv.texts import python_help_text

pytestmark = pytest.mark.slow
WINDOW = 512  # Gemma 3's local layers


@pytest.fixture(scope="module")
def long_tokens(gemma_path):
    with edgeinfer.load(gemma_path, engine="native", n_ctx=64) as m:
        return m.tokenize(python_help_text(), add_special=False)[: 3 * WINDOW]


def _gemma(path, **options):
    return edgeinfer.load(path, engine="native", n_ctx=2048, n_batch=128, **options)


def test_gemma_windows_are_sliding(gemma_path):
    with _gemma(gemma_path) as m:
        windows = [m.config.layer_window(il) for il in range(m.config.n_layer)]
    assert set(windows) == {0, WINDOW} and windows.count(0) == 3  # 15 local, 3 global layers


def test_ring_gives_the_full_cache_logits(gemma_path, long_tokens):
    """A prompt of 3x the window, in steps of 128: the ring wraps many times."""
    assert len(long_tokens) == 3 * WINDOW
    with _gemma(gemma_path) as ring, _gemma(gemma_path, swa_full=True) as full:
        want = full.logits(long_tokens)
        got = ring.logits(long_tokens)
        assert ring.backend.ring_slack == BLOCK_SIZE and full.backend.ring_slack is None
    np.testing.assert_array_equal(got, want)


def test_ring_memory_grows_with_the_global_layers_only(gemma_path, long_tokens):
    """The pool is sized as cache_bytes says; after 3x the window the local layers hold their
    window's blocks only, while the global layers hold every position."""
    used, budget, held = {}, {}, {}
    for swa_full in (False, True):
        with _gemma(gemma_path, swa_full=swa_full) as m:
            cfg, before = m.config, m.backend.memory_bytes
            m.backend.forward(long_tokens)
            used[swa_full] = m.backend.memory_bytes - before
            stats = m.backend.pool_stats()
            budget[swa_full] = sum(g["blocks"] * g["block_bytes"] for g in stats["groups"])
            held[swa_full] = {g["window"]: g["used"] for g in stats["groups"]}
    windows = [cfg.layer_window(il) for il in range(cfg.n_layer)]
    shape = {
        "n_layer": cfg.n_layer, "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim,
        "head_dim_v": cfg.head_dim_v, "n_ctx": 2048, "windows": windows, "n_batch": 128,
    }  # fmt: skip
    assert budget[False] == cache_bytes(**shape)
    assert budget[True] == cache_bytes(**shape, ring=False) == 18 * 2048 * 2 * 256 * 2
    # the window, the slack and one step of 128, in blocks of 32, and 2 blocks at the edges
    assert budget[False] == (3 * 2048 + 15 * (512 + 32 + 128 + 64)) * 2 * 256 * 2
    # every position in every layer, against the global ones and the local window
    assert held[True] == {0: 3 * WINDOW // BLOCK_SIZE}
    # after the last step a local layer holds the blocks from 32 behind its window: 17
    behind = (3 * WINDOW - WINDOW - 32) // BLOCK_SIZE
    assert held[False] == {0: 3 * WINDOW // BLOCK_SIZE, WINDOW: 3 * WINDOW // BLOCK_SIZE - behind}
    # memory comes in slabs of 16 blocks (1 KiB a position and layer): 18 layers x 1536
    # positions in 3 slabs, against the global layers' 3 slabs and the local layers' whole
    # pool of 23 blocks (the window, the slack, the step of 128 and 2 at the edges), which
    # the steps went through
    slab = 16 * BLOCK_SIZE * 1024
    assert used[True] == 3 * 18 * slab == 18 * 1536 * 1024
    assert used[False] == 3 * 3 * slab + 15 * 23 * BLOCK_SIZE * 1024


def test_rewinds_within_the_slack_keep_the_prefix(gemma_path, long_tokens):
    tokens = long_tokens[:1100]
    with _gemma(gemma_path) as m:
        eng = m.backend
        want = eng.forward(tokens)
        eng.truncate(1080)  # 20 back: the local layers still hold the window behind 1080
        assert eng.n_past == 1080
        np.testing.assert_array_equal(eng.forward(tokens[1080:]), want)
        eng.truncate(1000)  # 100 back: more than the slack of one block
        assert eng.n_past == 0
        np.testing.assert_array_equal(eng.forward(tokens), want)


def test_a_session_reevaluates_what_a_deep_rewind_lost(gemma_path, long_tokens):
    """KVSession asks the engine what it kept: a new prompt sharing 600 of 1100 tokens is
    evaluated whole on the ring, and gives the logits of a fresh model."""
    first, second = long_tokens[:1100], long_tokens[:600] + long_tokens[700:900]
    with _gemma(gemma_path) as m, _gemma(gemma_path) as fresh:
        session = m._session
        session.evaluate(first)
        logits, reused = session.evaluate(second)
        assert reused == 0
        np.testing.assert_array_equal(logits, fresh.logits(second)[-1])
