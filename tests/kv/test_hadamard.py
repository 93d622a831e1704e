"""q8_0 / q4_0 caches store each head's rows Walsh-Hadamard rotated, as llama.cpp does
(attn_rot_k / attn_rot_v): the keys, and the queries that meet them, in blocks of the largest
power of two dividing the head; the values in blocks of 64, the attention output rotated back.
tests/kv/test_llama_cpp_cache.py measures what that buys against llama.cpp on Gemma 3.

- The numpy rotation is the orthonormal Sylvester-Hadamard matrix (built here with kron), and
  its own inverse.
- The block each cache type and head size gets.
- A q8_0 cache's rows, decoded and rotated back, are the f32 cache's keys and values up to
  q8_0's own error; unrotated they are not (the rotation is really there, in both engines).
- A head that is no multiple of 64 is stored unrotated, and both engines still give the same
  bits (the fixtures' heads, 64 and 128, are all rotated).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import edgeinfer
from edgeinfer.engines.reference import hadamard
from edgeinfer.kv_cache import CACHE_TYPES
from edgeinfer.quants import dequantize
from tests.kv.test_kivi_cache import _native_isas


def _sylvester(n: int) -> np.ndarray:
    h = np.array([[1.0]])
    while len(h) < n:
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    return h / np.sqrt(n)


@pytest.mark.parametrize("block", [64, 128, 256])
def test_the_rotation_is_the_orthonormal_hadamard_matrix(block):
    x = np.random.default_rng(block).standard_normal((5, 2 * block)).astype(np.float32)
    want = (x.reshape(5, 2, block).astype(np.float64) @ _sylvester(block).T).reshape(x.shape)
    got = hadamard(x, block)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(hadamard(got, block), x, rtol=0, atol=1e-5 * np.abs(x).max())


@pytest.mark.parametrize(
    ("name", "head_dim", "keys", "want"),
    [
        ("q8_0", 256, True, 256), ("q8_0", 256, False, 64), ("q4_0", 128, True, 128),
        ("q4_0", 192, True, 64), ("q8_0", 64, True, 64), ("q8_0", 96, True, 0),
        ("q4_0", 32, False, 0), ("f16", 256, True, 0), ("f32", 128, False, 0),
        ("kivi4", 128, True, 0), ("kivi2", 64, False, 0),
    ],
)  # fmt: skip
def test_the_block_of_each_cache_type(name, head_dim, keys, want):
    assert CACHE_TYPES[name].hadamard_block(head_dim, keys=keys) == want


def _layer0_rows(path, engine: str, kv: str, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    with edgeinfer.load(path, engine=engine, n_ctx=64, kv_type=kv) as m:
        eng, cfg = m.backend, m.config
        eng.forward(tokens)
        k, v = eng.read_rows(0, 0, len(tokens))
        ggml_type = CACHE_TYPES[kv].ggml_type
        shape = (len(tokens), cfg.n_head_kv)
        keys = dequantize(np.frombuffer(k, np.uint8), ggml_type, (*shape, cfg.head_dim))
        values = dequantize(np.frombuffer(v, np.uint8), ggml_type, (*shape, cfg.head_dim_v))
        return keys.astype(np.float32), values.astype(np.float32)


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.sqrt(((got - want) ** 2).mean() / (want**2).mean()))


@pytest.mark.parametrize("engine", ["native", "reference"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # heads of 64 and 128
def test_quantized_rows_are_stored_rotated(fixture_models, engine, arch):
    tokens = [int(t) for t in np.random.default_rng(2).integers(3, 200, 24)]
    keys, values = _layer0_rows(fixture_models[arch], engine, "q8_0", tokens)
    exact_k, exact_v = _layer0_rows(fixture_models[arch], engine, "f32", tokens)
    hk = CACHE_TYPES["q8_0"].hadamard_block(keys.shape[-1], keys=True)
    assert hk == keys.shape[-1]
    assert _relative_error(hadamard(keys, hk), exact_k) < 0.01  # q8_0's own error
    assert _relative_error(hadamard(values, 64), exact_v) < 0.01
    assert _relative_error(keys, exact_k) > 0.5 and _relative_error(values, exact_v) > 0.5


@pytest.fixture(scope="module")
def head_of_32(tmp_path_factory, gemma_path) -> str:
    """The llama fixture with heads of 32 values (8 query heads, 4 KV heads)."""
    from tests.fixtures.models import FIXTURES, write_model
    from tests.fixtures.vocab import bpe_vocab

    spec = replace(FIXTURES["llama"], head_dim=32)
    path = tmp_path_factory.mktemp("head32") / "llama-head32.gguf"
    write_model(path, spec, bpe_vocab(spec.vocab))
    return str(path)


def test_a_head_of_32_is_stored_unrotated_and_the_engines_agree(head_of_32):
    tokens = [int(t) for t in np.random.default_rng(4).integers(3, 200, 40)]
    keys, values = _layer0_rows(head_of_32, "reference", "q4_0", tokens)
    exact_k, exact_v = _layer0_rows(head_of_32, "reference", "f32", tokens)
    assert _relative_error(keys, exact_k) < 0.2 and _relative_error(values, exact_v) < 0.2
    opts = {"n_ctx": 64, "cache_type_k": "q4_0", "cache_type_v": "q8_0"}
    with edgeinfer.load(head_of_32, engine="reference", **opts) as m:
        assert m.config.head_dim == 32
        want = m.backend.forward(tokens)
    for isa in _native_isas():
        with edgeinfer.load(head_of_32, engine="native", isa=isa, **opts) as m:
            np.testing.assert_array_equal(m.backend.forward(tokens), want, err_msg=isa)
