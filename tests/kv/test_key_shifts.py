"""Keys kept as first rotated (simd/common/key_shifts.h): a q8_0 or q4_0 key moves down as it
is when positions are dropped, the cache records how far ahead of its position it was
rotated, and a query meets it rotated as far ahead itself.

- The bytes move unchanged and the shifts are the positions dropped below each key.
- A key moved many times is still one quantization away from the exact key at its new
  position (an f32 evaluation of the kept tokens afresh), where rotating it back and encoding
  it again at every move (what the f16 and f32 caches do) would add a rounding each time.
- Both engines give the same bits through scattered drops, on every instruction set here.
- Forks share the shifts of their prefix; invalid shifts are refused at every boundary.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import edgeinfer
from edgeinfer import errors
from edgeinfer._native import library
from edgeinfer.engines.base import Batch
from edgeinfer.engines.reference import apply_rope, hadamard, q4_0_values, rope_cos_sin
from tests.kv.test_block_pool import _engine
from tests.kv.test_kivi_cache import _native_isas

ENGINES = ("native", "reference")


def _tokens(n: int, seed: int = 3) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 200, n)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("k_type", ["q8_0", "q4_0", "f16"])
def test_quantized_keys_move_as_they_are(fixture_models, engine, k_type):
    with edgeinfer.load(fixture_models["llama"], engine=engine, n_ctx=64, cache_type_k=k_type) as m:
        eng = m.backend
        eng.forward(_tokens(40))
        layers = (0, eng.cfg.n_layer - 1)
        before = {il: eng.read_rows(il, 15, 25) for il in layers}
        eng.discard(4, 11)
        for il in layers:
            keys, values = eng.read_rows(il, 4, 25)
            assert values == before[il][1]
            assert (keys == before[il][0]) == (k_type != "f16"), (il, k_type)
        shifts = eng.key_shifts()
        want = [0] * 4 + [11] * 25 if k_type != "f16" else [0] * 29
        assert shifts.tolist() == want
        eng.forward([7, 8])  # written where they are
        assert eng.key_shifts().tolist() == want + [0, 0]
        eng.truncate(0)
        assert eng.key_shifts().tolist() == []


def _unrotated(eng, keys: np.ndarray) -> np.ndarray:
    """Keys as a q8_0 / q4_0 cache holds them (Walsh-Hadamard rotated), rotated back."""
    keys = keys.astype(np.float32)
    return hadamard(keys, eng._hadamard_k) if eng._hadamard_k else keys


def _effective_keys(m, shifts: np.ndarray) -> np.ndarray:
    """Layer 0's held keys rotated back by their shifts (float32 rotations: errors ~1e-7)."""
    cfg, keys = m.backend.cfg, _unrotated(m.backend, m.backend.k_cache[0][: len(shifts)])
    base, scale, factors = cfg.layer_rope_base(0), cfg.layer_rope_scale(0), m.backend._freq_factors
    cos, sin = rope_cos_sin(-shifts, cfg.n_rot, base, scale, factors)
    return apply_rope(keys, cos, sin, cfg.n_rot, cfg.rope_neox)


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.sqrt(((got - want) ** 2).mean() / (want**2).mean()))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # rotating pairs, rotating halves
def test_a_key_moved_seven_times_is_quantized_once(fixture_models, arch):
    """StreamingLLM's pattern: the sinks stay, every move drops the oldest 4 of the rest.
    Layer 0's keys depend on the token and its position only, so an f32 evaluation of the
    kept tokens afresh gives the exact keys at their new positions."""
    sinks, moves, step = 4, 7, 4
    tokens = _tokens(48 + moves * step, seed=11)
    opts = {"engine": "reference", "n_ctx": 64}
    with edgeinfer.load(fixture_models[arch], cache_type_k="q4_0", **opts) as m:
        m.backend.forward(tokens[:48])
        held = list(tokens[:48])
        for i in range(moves):
            m.backend.discard(sinks, step)
            del held[sinks : sinks + step]
            new = tokens[48 + i * step : 48 + (i + 1) * step]
            m.backend.forward(new)
            held += new
        shifts = m.backend.key_shifts()
        got = _effective_keys(m, shifts)
        oldest = slice(sinks, sinks + 16)  # moved by all seven drops
        stored = m.backend.k_cache[0][oldest].astype(np.float32)
        again = _requantized_at_every_move(stored, m.backend, moves, step)
    with edgeinfer.load(fixture_models[arch], kv_type="f32", **opts) as fresh:
        fresh.backend.forward(held)
        exact = fresh.backend.k_cache[0][: len(held)].astype(np.float32)
    assert (shifts[oldest] == moves * step).all() and (shifts[:sinks] == 0).all()
    unmoved = _relative_error(got[:sinks], exact[:sinks])
    moved = _relative_error(got[oldest], exact[oldest])
    assert 0.03 < unmoved < 0.3  # q4_0's own error
    assert moved < 1.3 * unmoved, (moved, unmoved)
    # rotating back and encoding again at each move (what the f16 cache does) compounds
    assert _relative_error(again, exact[oldest]) > 1.6 * unmoved


def _requantized_at_every_move(stored: np.ndarray, eng, moves: int, step: int) -> np.ndarray:
    """The keys as a cache that encodes them again at every move would hold them: from their
    first rotation, each move rotates them back by ``step`` and rounds them to q4_0 (in the
    Walsh-Hadamard rotated space the cache stores them in); returned rotated back from it."""
    cfg = eng.cfg
    base, scale, factors = cfg.layer_rope_base(0), cfg.layer_rope_scale(0), eng._freq_factors
    cos, sin = rope_cos_sin(np.full(len(stored), -step), cfg.n_rot, base, scale, factors)
    x = _unrotated(eng, stored)
    for _ in range(moves):
        moved = apply_rope(x, cos, sin, cfg.n_rot, cfg.rope_neox)
        x = _unrotated(eng, q4_0_values(_unrotated(eng, moved)))  # the rotation is its inverse
    return x


DROPS = [[(3, 5), (20, 7), (40, 2)], [(1, 2), (30, 9)], [(10, 1), (12, 1), (14, 3)]]


def _scattered(path, engine: str, types: tuple[str, str], isa: str | None = None) -> np.ndarray:
    """Scattered drops (h2o's kind) between prompt chunks and decoded tokens: every logit."""
    opts = {"n_ctx": 96, "n_batch": 8, "cache_type_k": types[0], "cache_type_v": types[1]}
    with edgeinfer.load(path, engine=engine, isa=isa, **opts) as m:
        eng, out = m.backend, []
        out.append(eng.forward(_tokens(60, seed=5)))
        for i, runs in enumerate(DROPS):
            eng.evict(runs)
            out.append(eng.forward(_tokens(9, seed=i)))
            out.extend(eng.forward([20 + i + j]) for j in range(3))
        assert eng.key_shifts().any()
        return np.stack(out)


@pytest.mark.parametrize("types", [("q4_0", "q8_0"), ("q8_0", "f16")], ids="/".join)
@pytest.mark.parametrize("arch", ["gemma3", "llama", "qwen3"])
def test_the_engines_give_the_same_bits_through_scattered_drops(fixture_models, arch, types):
    """gemma3: sliding-window rings, two rope bases, rotating halves, soft-capping; llama:
    grouped queries, rotating pairs; qwen3: q/k norms."""
    path = fixture_models[arch]
    want = _scattered(path, "reference", types)
    for isa in _native_isas():
        np.testing.assert_array_equal(_scattered(path, "native", types, isa), want, err_msg=isa)


def _logits_through(path, k_type: str, drops: list) -> np.ndarray:
    opts = {"n_ctx": 128, "cache_type_k": k_type, "cache_type_v": "f32"}
    with edgeinfer.load(path, engine="native", **opts) as m:
        eng, out = m.backend, [m.backend.forward(_tokens(60, seed=5))]
        for i, runs in enumerate(drops):
            eng.evict(runs)
            out.extend(eng.forward([20 + i + j]) for j in range(4))
        return np.stack(out)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_moved_quantized_keys_score_as_their_exact_keys(fixture_models, arch):
    """An f32 key cache rotates moved keys back all but exactly (errors ~3e-6): through the
    drops, a q8_0 cache stays as close to it as it is when nothing is dropped, which it would
    not if a query met a moved key at the wrong rotation."""
    path = fixture_models[arch]
    still = [[]] * len(DROPS)
    base = np.abs(_logits_through(path, "q8_0", still) - _logits_through(path, "f32", still)).max()
    moved = np.abs(_logits_through(path, "q8_0", DROPS) - _logits_through(path, "f32", DROPS))
    assert 0 < moved.max() < 3 * base, (moved.max(), base)


def test_a_fork_of_a_moved_sequence_goes_on_as_it_would(fixture_models):
    path, opts = fixture_models["gemma3"], {"n_ctx": 96, "n_batch": 8, "kv_type": "q4_0"}
    gguf, eng = _engine(path, n_seq_max=2, n_ctx=96, n_batch=8, cache_type_k="q4_0",
                        cache_type_v="q4_0")  # fmt: skip
    try:
        eng.forward(_tokens(60))
        eng.evict([(4, 9), (30, 3)])
        eng.fork(0, 1)
        assert eng.key_shifts(1).tolist() == eng.key_shifts(0).tolist()
        a, b = (eng.decode(Batch.sequence([9, 10], 48, s)) for s in (0, 1))
        eng.fork(0, 1, 20)  # a prefix: the shifts of its positions
        assert eng.key_shifts(1).tolist() == eng.key_shifts(0)[:20].tolist()
    finally:
        eng.close()
        gguf.close()
    with edgeinfer.load(path, engine="reference", **opts) as ref:
        ref.backend.forward(_tokens(60))
        ref.backend.evict([(4, 9), (30, 3)])
        want = ref.backend.forward([9, 10])
    np.testing.assert_array_equal(a[0], want)
    np.testing.assert_array_equal(b[0], want)


@pytest.mark.parametrize("engine", ENGINES)
def test_invalid_shifts_are_refused(fixture_models, engine):
    with edgeinfer.load(fixture_models["llama"], engine=engine, n_ctx=32, kv_type="q4_0") as m:
        eng = m.backend
        eng.forward([5, 6, 7])
        for shifts, why in (([0, -1], "rotated -1"), ([0, 0, 30], "rotated 30"),
                            ([0] * 33, "33 shifts")):  # fmt: skip
            with pytest.raises(errors.InvalidOptionError, match=why):
                eng.set_key_shifts(np.array(shifts))
        eng.set_key_shifts(np.array([0, 3, 29]))
        assert eng.key_shifts().tolist() == [0, 3, 29]
    with edgeinfer.load(fixture_models["llama"], engine=engine, n_ctx=32) as m:
        m.backend.forward([5, 6, 7])
        with pytest.raises(errors.InvalidOptionError, match="the f16 key cache rotates its keys"):
            m.backend.set_key_shifts(np.array([0, 1, 0]))


def test_the_native_shifts_call_checks_what_it_is_given(fixture_models):
    """The C boundary refuses what the Python layer would have caught first."""
    lib = library()
    for kv, shifts, why in (("q4_0", [0, 31], b"cannot hold a key rotated 31"),
                            ("f16", [0, 1], b"rotates its keys where they move")):  # fmt: skip
        with edgeinfer.load(fixture_models["llama"], engine="native", n_ctx=32, kv_type=kv) as m:
            arr = np.array(shifts, dtype=np.int32)
            status = lib.ei_engine_seq_key_shifts(
                m.backend._handle, 0, len(arr), arr.ctypes.data_as(ctypes.c_void_p), 1
            )
            assert status != 0 and why in lib.ei_last_error()
            assert lib.ei_engine_seq_key_shifts(m.backend._handle, 0, 33, None, 0) != 0
