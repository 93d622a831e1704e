"""edgeinfer.quants against ggml itself: same bytes out of every quantizer, same bits out of
every dequantizer, same block sizes.

The reference is ggml-base's own code (``ggml_quantize_chunk``, ``quantize_row_q8_K_ref``,
``quantize_row_q8_1_ref``, the type traits' ``to_float``) reached through tests/ggml_ref.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer import quants
from edgeinfer.converters import quantizers
from edgeinfer.gguf.constants import BLOCK_LAYOUTS, GGMLType

ALL_TYPES = list(quants.QUANT_TYPES)
FLOAT_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16]
# types with an importance-weighted path in ggml, plus Q8_0 and the floats that ignore weights
WEIGHTED_TYPES = [t for t in ALL_TYPES if quantizers.QUANTIZERS[t].accepts_weights]


def _normal(rng, n):
    return rng.standard_normal(n)


FAMILIES = {
    "normal": _normal,
    "uniform": lambda rng, n: rng.uniform(-1, 1, n),
    "heavy_tailed": lambda rng, n: rng.standard_t(1.5, n),
    "positive": lambda rng, n: np.abs(rng.standard_normal(n)) + 0.1,
    "negative": lambda rng, n: -np.abs(rng.standard_normal(n)),
    "all_zero": lambda rng, n: np.zeros(n),
    "constant": lambda rng, n: np.full(n, 0.37),
    "negative_constant": lambda rng, n: np.full(n, -2.5),
    "tiny": lambda rng, n: rng.standard_normal(n) * 1e-30,
    "subnormal": lambda rng, n: rng.standard_normal(n) * 1e-40,
    "huge": lambda rng, n: rng.standard_normal(n) * 1e30,
    "near_float_max": lambda rng, n: rng.uniform(-3.4e38, 3.4e38, n),
    "sparse": lambda rng, n: rng.standard_normal(n) * (rng.random(n) < 0.1),
    "mixed_magnitudes": lambda rng, n: rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n)),
    "magnitude_ties": lambda rng, n: rng.choice([-4.0, -2.0, 2.0, 4.0], n),
    "halfway_points": lambda rng, n: (rng.integers(-64, 64, n) + 0.5) / 8,
    # max 127 makes Q8's scale exactly 1, so the quants round exact halves (away from zero)
    "exact_halves": lambda rng, n: np.where(
        np.arange(n) % 32 == 0, 127.0, rng.integers(-127, 127, n) + 0.5
    ),
    "one_outlier": lambda rng, n: np.where(np.arange(n) % 97 == 5, 1e4, rng.standard_normal(n)),
}


def make_values(ggml_type: GGMLType, family: str, seed: int = 0, rows: int = 4) -> np.ndarray:
    """(rows, row_len) float32 test data: two super-blocks or four 32-blocks per row."""
    block = BLOCK_LAYOUTS[ggml_type].block_size
    row_len = {1: 64, 32: 128, 256: 512}[block]
    rng = np.random.default_rng([seed, int(ggml_type), sum(map(ord, family))])
    return FAMILIES[family](rng, rows * row_len).astype(np.float32).reshape(rows, row_len)


def make_weights(row_len: int, seed: int = 0) -> np.ndarray:
    """An importance matrix: positive, spread over decades, with a few exact zeros."""
    rng = np.random.default_rng([seed, row_len])
    w = np.exp(rng.uniform(-3, 3, row_len))
    w[rng.random(row_len) < 0.05] = 0
    return w.astype(np.float32)


def assert_same_bytes(ours: np.ndarray, ref: np.ndarray, ggml_type: GGMLType) -> None:
    assert ours.shape == ref.shape and ours.dtype == ref.dtype == np.uint8
    blocks_bad = (ours != ref).reshape(-1, BLOCK_LAYOUTS[ggml_type].type_size).any(axis=1)
    bad = np.flatnonzero(blocks_bad)
    assert not bad.size, f"{bad.size} of {blocks_bad.size} blocks differ, first {bad[:8]}"


def assert_same_floats(ours: np.ndarray, ref: np.ndarray, nan_payload: bool = True) -> None:
    """Bit-identical float32; with nan_payload=False NaNs only have to be NaN in both."""
    assert ours.shape == ref.shape and ours.dtype == ref.dtype == np.float32
    ours_bits, ref_bits = ours.view(np.uint32), ref.view(np.uint32)
    if nan_payload:
        bad = np.flatnonzero(ours_bits != ref_bits)
    else:
        nan = np.isnan(ours)
        np.testing.assert_array_equal(nan, np.isnan(ref))
        bad = np.flatnonzero((ours_bits != ref_bits) & ~nan)
    assert not bad.size, (
        f"{bad.size} values differ, first at {bad[:8]}: "
        f"{ours.ravel()[bad[:4]]} vs ggml {ref.ravel()[bad[:4]]}"
    )


# --- sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ggml_type", list(GGMLType), ids=lambda t: t.name)
def test_block_layout_matches_ggml(ggml, ggml_type):
    layout = BLOCK_LAYOUTS[ggml_type]
    assert (layout.block_size, layout.type_size) == (
        ggml.blck_size(ggml_type),
        ggml.type_size(ggml_type),
    )
    assert ggml.traits(ggml_type).type_size == layout.type_size


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: t.name)
def test_row_nbytes_matches_ggml(ggml, ggml_type):
    block = BLOCK_LAYOUTS[ggml_type].block_size
    for n in (block, 7 * block, 4096):
        assert quants.row_nbytes(ggml_type, n) == ggml.row_size(ggml_type, n)
    assert quants.QUANT_TYPES[ggml_type].layout.itemsize == ggml.type_size(ggml_type)


# --- quantize ----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml(ggml, ggml_type, family):
    x = make_values(ggml_type, family)
    assert_same_bytes(quantizers.quantize(x, ggml_type), ggml.quantize(x, ggml_type), ggml_type)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("ggml_type", WEIGHTED_TYPES, ids=lambda t: t.name)
def test_weighted_quantize_matches_ggml(ggml, ggml_type, family):
    x = make_values(ggml_type, family, seed=1)
    w = make_weights(x.shape[1], seed=1)
    ours = quantizers.quantize(x, ggml_type, weights=w)
    assert_same_bytes(ours, ggml.quantize(x, ggml_type, imatrix=w), ggml_type)


@pytest.mark.parametrize("ggml_type", WEIGHTED_TYPES, ids=lambda t: t.name)
def test_uniform_weights_differ_from_no_weights_where_ggml_says_so(ggml, ggml_type):
    """The weighted path is really taken: for the types where ggml switches search, the bytes
    change, and they change exactly as ggml's do."""
    x = make_values(ggml_type, "normal", seed=2)
    w = np.ones(x.shape[1], np.float32)
    ours_plain = quantizers.quantize(x, ggml_type)
    ours_weighted = quantizers.quantize(x, ggml_type, w)
    ref_plain, ref_weighted = ggml.quantize(x, ggml_type), ggml.quantize(x, ggml_type, w)
    assert_same_bytes(ours_weighted, ref_weighted, ggml_type)
    assert np.array_equal(ours_plain, ours_weighted) == np.array_equal(ref_plain, ref_weighted)


@pytest.mark.parametrize("ggml_type", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_conversion_matches_ggml_on_special_values(ggml, ggml_type):
    """Every half rounding boundary, one ulp either side, infinities, NaNs of both signs."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(invalid="ignore"):
        mid = halves.view(np.float16).astype(np.float32).view(np.uint32).astype(np.int64)
    edges = [mid + k for k in (0x1000, 0x0FFF, 0x1001, 0x2000, 0x8000, -1, 1)]
    bits = np.concatenate(
        [mid, *edges, [0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0x00000001]]
    )
    x = (bits & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    x = x[: x.size // 64 * 64].reshape(-1, 64)
    assert_same_bytes(quantizers.quantize(x, ggml_type), ggml.quantize(x, ggml_type), ggml_type)


# --- dequantize --------------------------------------------------------------------------------

DEQUANT_TYPES = [t for t in ALL_TYPES if t != GGMLType.Q8_1]  # ggml has no Q8_1 to_float


@pytest.mark.parametrize("family", ["normal", "heavy_tailed", "sparse", "huge", "subnormal"])
@pytest.mark.parametrize("ggml_type", DEQUANT_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_ggml(ggml, ggml_type, family):
    x = make_values(ggml_type, family, seed=3)
    raw = ggml.quantize(x, ggml_type)
    ours = quants.dequantize(raw, ggml_type, x.shape)
    assert_same_floats(ours, ggml.dequantize(raw, ggml_type, x.size).reshape(x.shape))


@pytest.mark.parametrize("ggml_type", DEQUANT_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_ggml_on_random_bytes(ggml, ggml_type):
    """Any bit pattern: subnormal, infinite and NaN scales included. NaN payloads are only
    compared for the plain float types, where no arithmetic picks between two NaNs."""
    layout = BLOCK_LAYOUTS[ggml_type]
    rng = np.random.default_rng(int(ggml_type))
    n_blocks = 4096 if layout.block_size == 1 else 256
    raw = rng.integers(0, 256, n_blocks * layout.type_size, dtype=np.uint8)
    shape = (n_blocks * layout.block_size,)
    ours = quants.dequantize(raw, ggml_type, shape)
    ref = ggml.dequantize(raw, ggml_type, shape[0])
    assert_same_floats(ours, ref, nan_payload=ggml_type in FLOAT_TYPES)


# --- the tensor-level functions at chunk boundaries --------------------------------------------


@pytest.mark.parametrize(
    "ggml_type", [GGMLType.Q4_0, GGMLType.Q5_1, GGMLType.Q4_K, GGMLType.Q6_K], ids=lambda t: t.name
)
def test_chunked_tensors_match_ggml(ggml, monkeypatch, ggml_type):
    """Many rows through small chunks: rows split across chunks and the per-row statistics of
    the weighted legacy path must not leak from one row to the next."""
    monkeypatch.setattr(quants, "_CHUNK_VALUES", 4096)
    monkeypatch.setattr(quantizers, "_CHUNK_VALUES", 4096)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((37, 512)) * rng.uniform(0.01, 100, (37, 1))).astype(np.float32)
    w = make_weights(512, seed=5)
    for weights in (None, w):
        ours = quantizers.quantize(x, ggml_type, weights=weights)
        ref = ggml.quantize(x, ggml_type, imatrix=weights)
        assert_same_bytes(ours, ref, ggml_type)
        got = quants.dequantize(ours, ggml_type, x.shape)
        assert_same_floats(got, ggml.dequantize(ref, ggml_type, x.size).reshape(x.shape))


def test_block_api_with_rows_matches_ggml(ggml):
    """quantize_blocks with blocks_per_row is the same as ggml quantizing row by row."""
    x = make_values(GGMLType.Q4_1, "mixed_magnitudes", seed=6, rows=3)
    w = make_weights(x.shape[1], seed=6)
    blocks_per_row = x.shape[1] // 32
    per_block_w = np.tile(w.reshape(blocks_per_row, 32), (3, 1))
    ours = quantizers.Q4_1.quantize_blocks(x.reshape(-1, 32), per_block_w, blocks_per_row)
    assert_same_bytes(ours.reshape(3, -1), ggml.quantize(x, GGMLType.Q4_1, w), GGMLType.Q4_1)
