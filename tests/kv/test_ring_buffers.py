"""Sliding-window layers keep a ring of window + n_batch positions: the same logits as the
full-size cache, memory that grows only with the global layers, and rewinds that either keep
the prefix (within the ring's slack) or start the sequence over."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from edgeinfer.kv_cache import cache_bytes
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
        assert ring.backend.ring_slack == 128 and full.backend.ring_slack is None
    np.testing.assert_array_equal(got, want)


def test_ring_memory_grows_with_the_global_layers_only(gemma_path, long_tokens):
    cfg = None
    used = {}
    for swa_full in (False, True):
        with _gemma(gemma_path, swa_full=swa_full) as m:
            cfg = m.config
            before = m.backend.memory_bytes
            m.logits(long_tokens[:8])  # the first token reserves the sequence's cache
            used[swa_full] = m.backend.memory_bytes - before
    assert cfg is not None
    windows = [cfg.layer_window(il) for il in range(cfg.n_layer)]
    shape = {
        "n_layer": cfg.n_layer, "n_head_kv": cfg.n_head_kv, "head_dim": cfg.head_dim,
        "head_dim_v": cfg.head_dim_v, "n_ctx": 2048, "windows": windows, "n_batch": 128,
    }  # fmt: skip
    assert used[False] == cache_bytes(**shape)
    assert used[True] == cache_bytes(**shape, ring=False)
    # 3 global layers x 2048 + 15 rings x (512 + 128) positions, against 18 x 2048
    assert used[False] / used[True] == pytest.approx((3 * 2048 + 15 * 640) / (18 * 2048))


def test_rewinds_within_the_slack_keep_the_prefix(gemma_path, long_tokens):
    tokens = long_tokens[:1100]
    with _gemma(gemma_path) as m:
        eng = m.backend
        want = eng.forward(tokens)
        eng.truncate(1000)  # 100 back: the rings still hold the window behind position 1000
        assert eng.n_past == 1000
        np.testing.assert_array_equal(eng.forward(tokens[1000:]), want)
        eng.truncate(900)  # 200 back: more than the slack of 128
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
