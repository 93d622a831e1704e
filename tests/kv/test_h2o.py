"""The h2o context policy (Heavy-Hitter Oracle): which positions it drops, the engines'
eviction of scattered runs (keys rotated back, scores moved, the same bits in both engines),
and generation and chat that keep going past the context with flat memory."""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from edgeinfer import errors
from edgeinfer.context_policy import ContextPolicy, make_room, positions_to_runs
from edgeinfer.generation import KVSession


def test_the_plan_drops_the_least_attended_between_the_sinks_and_the_recent():
    h2o = ContextPolicy("h2o", n_sink=4)
    rng = np.random.default_rng(0)
    scores = rng.permutation(256).astype(np.int64) * 1000
    scores[:4] = 0  # the sinks go last even when least attended
    scores[200:] = 0  # and so does the recent window
    runs = h2o.heavy_hitter_runs(scores, 1, 256)
    dropped = np.concatenate([np.arange(s, s + n) for s, n in runs])
    assert len(dropped) == 256 // 8  # an eighth of the context at a time
    recent = (256 - 4 - 32) // 2  # half of what stays is the recent window
    assert dropped.min() >= 4 and dropped.max() < 256 - recent
    zone = np.arange(4, 256 - recent)
    kept = np.setdiff1d(zone, dropped)
    assert scores[dropped].max() < scores[kept].min()  # the lightest of the zone went
    ties = h2o.heavy_hitter_runs(np.zeros(100, np.int64), 1, 100)
    assert ties == [(4, 12)]  # on a tie, the older first
    # a ring buffer's window stays whole; too little room to drop is a typed error
    assert h2o.heavy_hitter_runs(scores, 1, 256, recent_min=240)[-1][0] + 1 <= 256 - 240
    with pytest.raises(errors.ContextOverflowError, match="h2o policy can drop only"):
        h2o.heavy_hitter_runs(scores, 200, 256, recent_min=200)
    assert positions_to_runs(np.array([1, 2, 3, 7, 9, 10])) == [(1, 3), (7, 1), (9, 2)]


@pytest.mark.parametrize(
    ("arch", "types"), [("qwen3", ("f16", "f16")), ("gemma3", ("q8_0", "q4_0"))], ids=str
)
def test_eviction_is_the_same_in_both_engines(fixture_models, arch, types):
    """Scattered runs dropped from the middle: the later keys rotated back by as much as was
    dropped below each, and the scores moved along, bit for bit in both engines."""
    kv = {"cache_type_k": types[0], "cache_type_v": types[1], "n_ctx": 64}
    runs = [(3, 2), (9, 1), (20, 7), (40, 3)]
    out = {}
    for engine in ("reference", "native"):
        with edgeinfer.load(fixture_models[arch], engine=engine, context_policy="h2o", **kv) as m:
            eng = m.backend
            eng.forward(list(range(3, 53)))
            before = eng.attention_scores()
            eng.evict(runs)
            after = eng.attention_scores()
            kept = np.ones(50, bool)
            for s, n in runs:
                kept[s : s + n] = False
            assert np.array_equal(after[: kept.sum()], before[kept])  # the scores moved along
            logits = eng.forward([7, 8, 9], all_logits=True)
            out[engine] = (after, logits, eng.attention_scores())
    for a, b in zip(out["reference"], out["native"], strict=True):
        assert np.array_equal(a, b)


def test_dropped_keys_are_the_kept_tokens_keys_at_their_new_positions(fixture_models):
    """After dropping scattered runs, the first layer's keys (which depend on the token and its
    position alone) are those of the kept tokens evaluated afresh, up to float rounding of the
    second rotation; its values move unchanged. Each run moves the later keys by a different
    amount, so a single shift for all would fail."""
    tokens = [int(t) for t in np.random.default_rng(6).integers(3, 200, 40)]
    runs = [(4, 3), (15, 2), (30, 5)]
    kept = [t for i, t in enumerate(tokens) if not any(s <= i < s + n for s, n in runs)]
    opts = {"engine": "reference", "n_ctx": 64, "kv_type": "f32", "context_policy": "h2o"}
    for arch in ("llama", "gemma3"):  # rotating pairs, and rotating halves (neox)
        with edgeinfer.load(fixture_models[arch], **opts) as m, \
                edgeinfer.load(fixture_models[arch], **opts) as fresh:  # fmt: skip
            m.backend.forward(tokens)
            m.backend.evict(runs)
            fresh.backend.forward(kept)
            n = len(kept)
            got, want = m.backend.k_cache[0][:n], fresh.backend.k_cache[0][:n]
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
            np.testing.assert_array_equal(m.backend.v_cache[0][:n], fresh.backend.v_cache[0][:n])


def test_bad_evictions_are_typed(fixture_models):
    with edgeinfer.load(fixture_models["llama"], n_ctx=32) as m:
        m.backend.forward(list(range(3, 23)))
        with pytest.raises(errors.InvalidOptionError, match="sums no attention"):
            m.backend.attention_scores()
        for runs in ([(5, 2), (6, 2)], [(3, 0)], [(15, 10)], [(-1, 2)]):
            with pytest.raises(errors.InvalidOptionError, match="cannot drop"):
                m.backend.evict(runs)
        assert m.backend.n_past == 20  # nothing dropped


def test_generating_8x_the_context_with_flat_memory(fixture_models):
    with edgeinfer.load(fixture_models["gemma3"], n_ctx=64, context_policy="h2o") as m:
        eng = m.backend
        session = KVSession(eng, policy=m.context_policy)
        session.prefill(list(range(3, 40)))
        memory = []
        for i in range(8 * 64):
            session.decode(5 + i % 50)
            assert eng.n_past <= 64
            if i % 64 == 63:
                memory.append(eng.memory_bytes)
        assert len(set(memory)) == 1
        assert len(session.history) == 37 + 8 * 64
        # the cache holds the history less what was dropped, in order
        assert len(session.tokens) == eng.n_past


def test_a_long_chat_evaluates_only_each_turns_new_tokens(fixture_models):
    with edgeinfer.load(fixture_models["qwen3"], n_ctx=64, context_policy="h2o") as m:
        session = KVSession(m.backend, policy=m.context_policy)
        history: list[int] = []
        rng = np.random.default_rng(1)
        for _turn in range(10):
            history += rng.integers(3, 200, 15).tolist()
            _, reused = session.evaluate(history)
            assert reused == len(history) - 15 or _turn == 0
            session.decode(7)
            history.append(7)
        assert session.history == history
        dropped = sorted(set(range(len(history))) - set(_cached_indices(session)))
        assert len(dropped) > 64 and dropped[-1] - dropped[0] + 1 > len(dropped)  # scattered
        with pytest.raises(errors.InvalidOptionError, match="scattered"):
            session.dropped_run  # noqa: B018 (a state file holds one dropped run at most)
        # leaving the history inside a dropped run evaluates again from that run's start
        inside = next(i for i in dropped if i + 1 in dropped and i - 1 not in dropped) + 1
        _, reused = session.evaluate(history[:inside] + [9, 9])
        assert reused == inside - 1


def _cached_indices(session: KVSession) -> list[int]:
    dropped = {a + i for a, n in session._dropped for i in range(n)}
    return [i for i in range(len(session.history)) if i not in dropped]


def test_make_room_says_what_it_dropped(fixture_models):
    with edgeinfer.load(fixture_models["llama"], n_ctx=32, context_policy="h2o") as m:
        eng, policy = m.backend, m.context_policy
        eng.forward(list(range(3, 35)))
        scores = eng.attention_scores()
        runs = make_room(eng, policy, 1)
        dropped = np.concatenate([np.arange(s, s + n) for s, n in runs])
        assert eng.n_past == 32 - len(dropped) and len(dropped) == 4
        zone = scores[4 : 32 - (32 - 4 - 4) // 2]  # after the sinks, before the recent half
        assert np.array_equal(np.sort(dropped), np.sort(np.argsort(zone, kind="stable")[:4]) + 4)


def test_h2o_keeps_a_ring_buffers_window(fixture_models):
    """Sliding-window layers with ring buffers (window 16, blocks released behind it): h2o
    drops nothing from the window, and generation past the context gives the reference
    engine's tokens, which keeps every row."""
    opts = {"n_ctx": 512, "n_batch": 64, "context_policy": "h2o", "n_sink": 2}
    tokens = {}
    for engine in ("native", "reference"):
        with edgeinfer.load(fixture_models["gemma3"], engine=engine, **opts) as m:
            if engine == "native":
                assert m.backend.ring_slack is not None  # the rings are there
            session = KVSession(m.backend, n_batch=64, policy=m.context_policy)
            logits = session.prefill(list(range(3, 40)))[0]
            out = []
            for _ in range(2 * 512):
                out.append(int(np.argmax(logits)))
                logits = session.decode(out[-1])
            tokens[engine] = out
    assert tokens["native"] == tokens["reference"]


def test_a_state_under_h2o_is_refused_not_saved_without_its_scores(fixture_models, tmp_path):
    with edgeinfer.load(fixture_models["llama"], n_ctx=32, context_policy="h2o") as m:
        m.backend.forward(list(range(3, 10)))
        with pytest.raises(errors.InvalidOptionError, match="attention scores are not part"):
            m.save_state(tmp_path / "s.state")
        assert not (tmp_path / "s.state").exists()


def test_a_stream_keeps_its_dropped_tokens_as_runs(fixture_models):
    """The session records what the cache lost as runs of history, not token by token: one run
    under streaming however long the stream, and runs that tile the lost tokens under h2o."""
    for policy in ("streaming", "h2o"):
        with edgeinfer.load(fixture_models["llama"], n_ctx=32, context_policy=policy) as m:
            session = KVSession(m.backend, policy=m.context_policy)
            session.prefill(list(range(3, 20)))
            for i in range(400):
                session.decode(3 + i % 100)
            lost = sum(n for _, n in session._dropped)
            assert lost == len(session.history) - m.backend.n_past
            cached = _cached_indices(session)
            assert [session.history[i] for i in cached] == session.tokens
            if policy == "streaming":
                assert session.dropped_run == (4, lost)
