"""The native kernels: every instruction-set variant this CPU runs against the scalar
reference, bit for bit, on inputs of several distributions and lengths; the reference
against the numpy codecs (edgeinfer.quants) and the numpy engine's activation quantizers;
block sizes against the C structs; and the standalone C checks (tests/simd/check_kernels.c
and a tile driver below), built natively for each x86 variant with the package's flags.

Float results compare as bits; two NaNs compare equal whatever their payloads (the
reference keeps a signalling NaN's payload where F16C hardware quiets it)."""

from __future__ import annotations

import ast
import math
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgeinfer import _native, quants
from edgeinfer.converters import quantizers
from edgeinfer.engines import reference
from edgeinfer.gguf.constants import BLOCK_LAYOUTS, GGMLType
from tests.simd.platform_gates import isa_params, missing_tool, runnable_isas, sanitizer_flags

ROOT = Path(__file__).resolve().parents[2]
SIMD = ROOT / "simd"
HERE = Path(__file__).resolve().parent

AVAILABLE, WHY = _native.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"native library: {WHY}")


# every variant but the reference, those this machine lacks as skips with the reason
VARIANTS = isa_params(name for name in _native.ISA_NAMES if name != "scalar")
SUPPORTED_VARIANTS = runnable_isas(name for name in _native.ISA_NAMES if name != "scalar")

WEIGHT_TYPES = [
    GGMLType.F32,
    GGMLType.F16,
    GGMLType.BF16,
    GGMLType.Q4_0,
    GGMLType.Q4_1,
    GGMLType.Q5_0,
    GGMLType.Q5_1,
    GGMLType.Q8_0,
    GGMLType.Q2_K,
    GGMLType.Q3_K,
    GGMLType.Q4_K,
    GGMLType.Q5_K,
    GGMLType.Q6_K,
]
PARTNER_TYPES = [GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q8_K, GGMLType.F16, GGMLType.BF16]
SCALE_FIELDS = ("d", "m", "dmin")  # fp16 fields of the block layouts, drawn as small floats


@pytest.fixture(scope="module")
def ref():
    return _native.Kernels("scalar")


@pytest.fixture(scope="module", params=VARIANTS)
def var(request):
    return _native.Kernels(request.param)


# ---- inputs ---------------------------------------------------------------------------------


def activations(n: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """float32 inputs of one distribution; blocks of 32 see the same shape everywhere."""
    g = rng.standard_normal(n).astype(np.float32)
    i = np.arange(n)
    if kind == "gaussian":
        x = g
    elif kind == "outliers":
        x = g * np.where(i % 37 == 0, 40.0, 1.0)
    elif kind == "tiny":  # fp16 subnormals for the scales
        x = g * 1e-6
    elif kind == "mixed":  # blocks many orders of magnitude apart
        x = g * 10.0 ** rng.uniform(-6, 4, size=(n + 31) // 32).repeat(32)[:n]
    elif kind == "ties":  # halves with amax 127: x * 127/amax lands on .5, rounded to even
        x = rng.integers(-254, 255, n) / 2.0
        x[::32] = 127.0
    elif kind == "negative_peak":  # the largest magnitude first met with a minus sign
        x = g.copy()
        x[::256] = -50.0
        x[128::256] = 50.0
    elif kind == "sparse":
        x = np.where(rng.random(n) < 0.05, g * 10, 0.0)
    elif kind == "constant":
        x = np.full(n, 0.5)
    else:
        x = np.zeros(n)
    return np.asarray(x, dtype=np.float32)


ACTIVATION_KINDS = [
    "gaussian",
    "outliers",
    "tiny",
    "mixed",
    "ties",
    "negative_peak",
    "sparse",
    "constant",
    "zeros",
]


def float_specials() -> np.ndarray:
    """Values where conversions round, overflow or keep signs and NaNs."""
    return np.array(
        [
            np.nan,
            -np.nan,
            np.inf,
            -np.inf,
            0.0,
            -0.0,
            65504.0,
            65519.99,
            65520.0,
            -65520.0,
            2.0**-24,
            2.0**-25,
            3 * 2.0**-26,
            2.0**-26,
            1e-30,
            1.0 + 2.0**-11,
            1.0 + 3 * 2.0**-11,
            1.0 + 2.0**-8,
            3.4e38,
            -1.17549435e-38,
            1.5e-45,
        ],
        dtype=np.float32,
    )


def weight_rows(t: GGMLType, n: int, rows: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """(rows, row bytes): quantized from floats, or random bytes whose scales are sane."""
    cls = quants.quant_type(t)
    if kind == "quantized":
        x = rng.standard_normal((rows, n)).astype(np.float32) * np.float32(0.05)
        return quantizers.quantize(x, t)
    raw = rng.integers(0, 256, size=(rows, n // cls.block_size * cls.type_size), dtype=np.uint8)
    blocks = raw.reshape(-1, cls.type_size).view(cls.layout)[:, 0]
    if t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        return quantizers.quantize(rng.standard_normal((rows, n)).astype(np.float32), t)
    for field in SCALE_FIELDS:
        if field in cls.layout.names:
            blocks[field] = quants.fp32_to_fp16_bits(
                rng.uniform(-0.01, 0.01, len(blocks)).astype(np.float32)
            )
    return raw


def assert_same_floats(got, want, what: str = "") -> None:
    got, want = (
        np.atleast_1d(np.asarray(got, np.float32)),
        np.atleast_1d(np.asarray(want, np.float32)),
    )
    assert got.shape == want.shape
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        i = int(np.argmin(same))
        pytest.fail(f"{what}: [{i}] got {got[i]!r} want {want[i]!r} ({int((~same).sum())} differ)")


def row_bytes(t: GGMLType, n: int) -> int:
    layout = BLOCK_LAYOUTS[t]
    return n // layout.block_size * layout.type_size


def block_lengths(t: GGMLType) -> list[int]:
    """Row lengths: partial groups of four blocks, odd counts, a model-sized row."""
    bs = BLOCK_LAYOUTS[t].block_size
    if bs == 1:
        return [1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 640, 1001]
    if bs == 32:
        return [32 * k for k in (1, 2, 3, 4, 5, 7, 8, 9, 13, 20, 64)]
    return [256 * k for k in (1, 2, 3, 5, 8)]


# ---- block sizes ----------------------------------------------------------------------------

C_TYPES = WEIGHT_TYPES + [GGMLType.Q8_1, GGMLType.Q8_K]

PROBE_C = r"""
#include <stdio.h>
#include "ei_kernels.h"
int main(void) {
    const int types[] = {%s};
    for (unsigned i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        const int bs = ei_block_size(types[i]);
        printf("%%d %%d %%zu\n", types[i], bs, ei_row_size(types[i], bs));
    }
    printf("structs %%zu %%zu %%zu %%zu %%zu %%zu %%zu %%zu %%zu %%zu %%zu %%zu\n",
           sizeof(block_q4_0), sizeof(block_q4_1), sizeof(block_q5_0), sizeof(block_q5_1),
           sizeof(block_q8_0), sizeof(block_q8_1), sizeof(block_q2_K), sizeof(block_q3_K),
           sizeof(block_q4_K), sizeof(block_q5_K), sizeof(block_q6_K), sizeof(block_q8_K));
    return 0;
}
"""


def _gcc() -> str:
    cc = shutil.which("gcc")
    if cc is None:
        missing_tool("gcc is not installed")
    return cc


def test_block_sizes_equal_the_c_structs(tmp_path):
    cc = _gcc()
    src = tmp_path / "probe.c"
    src.write_text(PROBE_C % ", ".join(str(int(t)) for t in C_TYPES))
    exe = tmp_path / "probe"
    subprocess.run(
        [
            cc,
            "-std=c11",
            f"-I{SIMD / 'common'}",
            str(src),
            str(SIMD / "common" / "types.c"),
            "-o",
            str(exe),
        ],
        check=True,
        capture_output=True,
    )
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split(
        "\n"
    )
    for line in lines[: len(C_TYPES)]:
        t, bs, size = (int(v) for v in line.split())
        assert (bs, size) == (
            BLOCK_LAYOUTS[GGMLType(t)].block_size,
            BLOCK_LAYOUTS[GGMLType(t)].type_size,
        ), GGMLType(t)
    structs = [int(v) for v in lines[len(C_TYPES)].split()[1:]]
    order = [
        GGMLType.Q4_0,
        GGMLType.Q4_1,
        GGMLType.Q5_0,
        GGMLType.Q5_1,
        GGMLType.Q8_0,
        GGMLType.Q8_1,
        GGMLType.Q2_K,
        GGMLType.Q3_K,
        GGMLType.Q4_K,
        GGMLType.Q5_K,
        GGMLType.Q6_K,
        GGMLType.Q8_K,
    ]
    assert structs == [BLOCK_LAYOUTS[t].type_size for t in order]


@pytest.mark.parametrize("t", WEIGHT_TYPES + [GGMLType.Q8_1, GGMLType.Q8_K], ids=lambda t: t.name)
def test_library_row_sizes_equal_the_layouts(ref, t):
    """The loaded library agrees (its ei_row_size is not exported): quantizers write every
    byte of a row and nothing after it; decoders and dot products take whole blocks only."""
    layout, lib = BLOCK_LAYOUTS[t], ref.lib
    n = 4 * layout.block_size
    size = row_bytes(t, n)
    raw = np.zeros(size + 64, dtype=np.uint8)
    out = np.zeros(n, dtype=np.float32)
    if t in PARTNER_TYPES:
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        rows = []
        for fill in (0x00, 0xFF):
            raw[:] = fill
            _native.check(
                lib.ei_kernel_from_float(ref.isa, int(t), x.ctypes.data, raw.ctypes.data, n)
            )
            assert (raw[size:] == fill).all()
            rows.append(raw[:size].copy())
        assert np.array_equal(rows[0], rows[1])
    if t in WEIGHT_TYPES:
        assert lib.ei_kernel_to_float(ref.isa, int(t), raw.ctypes.data, out.ctypes.data, n) == 0
        if layout.block_size > 1:
            assert (
                lib.ei_kernel_to_float(ref.isa, int(t), raw.ctypes.data, out.ctypes.data, n + 1)
                != 0
            )
            assert (
                lib.ei_kernel_vec_dot(
                    ref.isa, int(t), n + 1, raw.ctypes.data, raw.ctypes.data, out.ctypes.data
                )
                != 0
            )


# ---- activation quantizers ------------------------------------------------------------------


def quantizer_lengths(t: GGMLType) -> list[int]:
    if t == GGMLType.Q8_K:
        return [256, 512, 768, 2304]
    if t in (GGMLType.Q8_0, GGMLType.Q8_1):
        return [32, 64, 96, 160, 640, 2080]
    return [1, 7, 8, 9, 15, 16, 17, 33, 640, 1001]


@pytest.mark.parametrize("t", PARTNER_TYPES, ids=lambda t: t.name)
def test_quantizers_equal_the_reference(ref, var, t):
    rng = np.random.default_rng(int(t))
    for n in quantizer_lengths(t):
        for kind in ACTIVATION_KINDS:
            x = activations(n, kind, rng)
            nbytes = row_bytes(t, n)
            assert np.array_equal(
                var.from_float(int(t), x, nbytes), ref.from_float(int(t), x, nbytes)
            ), (n, kind)
    if t in (GGMLType.F16, GGMLType.BF16):
        x = np.concatenate([float_specials(), rng.standard_normal(11).astype(np.float32)])
        for n in (x.size, 16, 8):
            assert np.array_equal(
                var.from_float(int(t), x[:n], 2 * n), ref.from_float(int(t), x[:n], 2 * n)
            )


def _q8_blocks(raw: np.ndarray, t: GGMLType) -> np.ndarray:
    return raw.reshape(-1, BLOCK_LAYOUTS[t].type_size).view(quants.quant_type(t).layout)[:, 0]


@pytest.mark.parametrize("kind", ACTIVATION_KINDS)
def test_reference_quantizers_equal_the_numpy_engine(ref, kind):
    """q8_0 / q8_1 / q8_K blocks hold what edgeinfer.engines.reference feeds its products."""
    rng = np.random.default_rng(7)
    x = activations(2048, kind, rng)
    b0 = _q8_blocks(
        ref.from_float(int(GGMLType.Q8_0), x, row_bytes(GGMLType.Q8_0, 2048)), GGMLType.Q8_0
    )
    values = (
        b0["qs"].astype(np.float64) * quants.fp16_bits_to_fp32(b0["d"]).astype(np.float64)[:, None]
    )
    assert np.array_equal(values.reshape(-1), reference.act_q8_0(x))
    b1 = _q8_blocks(
        ref.from_float(int(GGMLType.Q8_1), x, row_bytes(GGMLType.Q8_1, 2048)), GGMLType.Q8_1
    )
    assert np.array_equal(b1["qs"], b0["qs"]) and np.array_equal(b1["d"], b0["d"])
    with np.errstate(over="ignore"):  # a block sum past fp16's range is inf on both sides
        assert np.array_equal(
            quants.fp16_bits_to_fp32(b1["s"]).astype(np.float64), reference.act_q8_1_sums(x)
        )
    rk = ref.from_float(int(GGMLType.Q8_K), x, row_bytes(GGMLType.Q8_K, 2048))
    assert np.array_equal(rk, quantizers.quantize(x, GGMLType.Q8_K).reshape(-1))
    bk = _q8_blocks(rk, GGMLType.Q8_K)
    assert np.array_equal(
        (bk["qs"].astype(np.float64) * bk["d"].astype(np.float64)[:, None]).reshape(-1),
        reference.act_q8_K(x),
    )


@pytest.mark.parametrize("t", [GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_reference_float_conversions_equal_numpy(ref, t):
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), float_specials(), activations(640, "tiny", rng)])
    got = ref.from_float(int(t), x, 2 * x.size).view(np.uint16)
    want = quantizers.quantize(x, t).reshape(-1).view(np.uint16)
    nan = np.isnan(x)  # numpy writes one NaN; the library keeps the payload's top bits
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(quants.dequantize(got[nan].view(np.uint8), t, (int(nan.sum()),))).all()


# ---- decoders -------------------------------------------------------------------------------


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_decoders_equal_the_reference_and_numpy(ref, t):
    rng = np.random.default_rng(100 + int(t))
    for kind in ("quantized", "random"):
        for n in block_lengths(t)[:6]:
            raw = weight_rows(t, n, 1, kind, rng).reshape(-1)
            want = ref.to_float(int(t), raw, n)
            assert_same_floats(
                want, quants.dequantize(raw, t, (n,)), f"scalar vs numpy {kind} n={n}"
            )
            for isa in SUPPORTED_VARIANTS:
                assert_same_floats(
                    _native.Kernels(isa).to_float(int(t), raw, n), want, f"{isa} {kind} n={n}"
                )


def test_half_decoders_cover_every_bit_pattern(ref, var):
    h = np.arange(65536, dtype=np.uint16).view(np.uint8)
    for t in (GGMLType.F16, GGMLType.BF16):
        assert_same_floats(var.to_float(int(t), h, 65536), ref.to_float(int(t), h, 65536), t.name)
        assert_same_floats(
            ref.to_float(int(t), h, 65536), quants.dequantize(h, t, (65536,)), f"numpy {t.name}"
        )


# ---- dot products ---------------------------------------------------------------------------


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_dot_products_equal_the_reference(ref, var, t):
    rng = np.random.default_rng(200 + int(t))
    pt = GGMLType(ref.partner_type(int(t)))
    for n in block_lengths(t):
        for wkind in ("quantized", "random"):
            w = weight_rows(t, n, 1, wkind, rng).reshape(-1)
            for kind in ("gaussian", "outliers", "mixed", "ties", "zeros"):
                y = ref.from_float(int(pt), activations(n, kind, rng), row_bytes(pt, n))
                assert_same_floats(
                    var.vec_dot(int(t), n, w, y),
                    ref.vec_dot(int(t), n, w, y),
                    f"{wkind} {kind} n={n}",
                )


def test_dot_product_is_the_exact_sum_rounded_once(ref):
    """Q8_0 terms are exact in double: with few blocks the double sum is exact too, so the
    result is the exact rational value rounded once to float."""
    from fractions import Fraction

    rng = np.random.default_rng(5)
    for _ in range(20):
        w = weight_rows(GGMLType.Q8_0, 128, 1, "quantized", rng).reshape(-1)
        x = activations(128, "gaussian", rng)
        y = ref.from_float(int(GGMLType.Q8_0), x, row_bytes(GGMLType.Q8_0, 128))
        bw, by = _q8_blocks(w, GGMLType.Q8_0), _q8_blocks(y, GGMLType.Q8_0)
        dw, dy = quants.fp16_bits_to_fp32(bw["d"]), quants.fp16_bits_to_fp32(by["d"])
        exact = sum(
            Fraction(float(dw[i]))
            * Fraction(float(dy[i]))
            * int(np.dot(bw["qs"][i].astype(np.int64), by["qs"][i]))
            for i in range(4)
        )
        assert np.float32(ref.vec_dot(int(GGMLType.Q8_0), 128, w, y)) == np.float32(float(exact))


# ---- float operations -----------------------------------------------------------------------

NORM_LENGTHS = [1, 7, 8, 9, 15, 16, 17, 255, 256, 640, 1001, 2048]


def test_rms_norm(ref, var):
    rng = np.random.default_rng(11)
    for n in NORM_LENGTHS:
        for kind in ("gaussian", "outliers", "tiny", "mixed", "zeros"):
            x = activations(n, kind, rng)
            w = rng.standard_normal(n).astype(np.float32)
            for weight in (w, None):
                for eps in (1e-6, 1e-5):
                    assert_same_floats(
                        var.rms_norm(x, weight, eps), ref.rms_norm(x, weight, eps), f"n={n} {kind}"
                    )


def test_rope(ref, var):
    rng = np.random.default_rng(12)
    for n_rot in (2, 6, 8, 10, 16, 18, 32, 34, 64, 128, 256):
        theta = rng.uniform(-100, 100, n_rot // 2)
        cs = np.stack([np.cos(theta), np.sin(theta)], axis=1).astype(np.float32).reshape(-1)
        for kind in ("gaussian", "outliers", "mixed"):
            x = activations(n_rot + 10, kind, rng)  # rotated dimensions first, the rest untouched
            for neox in (False, True):
                assert_same_floats(
                    var.rope(x, cs, neox), ref.rope(x, cs, neox), f"n_rot={n_rot} neox={neox}"
                )


def test_gated_units(ref, var):
    rng = np.random.default_rng(13)
    edges = np.array(
        [-10.0, 10.0, -9.999, 9.999, -10.001, 10.001, 0.0, -0.0, 1e-8, 65504.0, -1e6, np.nan],
        dtype=np.float32,
    )
    for n in (1, 7, 8, 9, 17, 640, 2048, 2049):
        for kind in ("gaussian", "outliers", "tiny", "mixed"):
            g = activations(n, kind, rng) * np.float32(3)
            g[: min(n, edges.size)] = edges[: min(n, edges.size)]
            u = rng.standard_normal(n).astype(np.float32)
            for gelu in (True, False):
                assert_same_floats(
                    var.glu(gelu, g, u), ref.glu(gelu, g, u), f"n={n} gelu={gelu} {kind}"
                )


def test_attention(ref, var):
    rng = np.random.default_rng(14)
    for hd in (64, 80, 128, 256):
        for t1 in (1, 7, 8, 9, 17, 100):
            for dtype in (np.float16, np.float32):
                k = (rng.standard_normal((t1, hd)) * rng.choice([0.01, 1, 30])).astype(dtype)
                v = rng.standard_normal((t1, hd)).astype(dtype)
                q = activations(hd, rng.choice(["gaussian", "outliers", "mixed"]), rng)
                for t0 in sorted({0, t1 // 2, t1 - 1}):
                    for scale, softcap in ((1 / np.sqrt(hd), 0.0), (1.0, 50.0), (0.0625, 0.0)):
                        span = [(t0, t1 - t0)]
                        got = var.attention(q, k, v, span, float(scale), softcap)
                        want = ref.attention(q, k, v, span, float(scale), softcap)
                        assert_same_floats(got, want, f"hd={hd} t0={t0} t1={t1} {dtype.__name__}")


CACHE_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0)


def cache_rows(kern, t: GGMLType, x: np.ndarray) -> np.ndarray:
    """Rows of x (T, d) as the engine stores them in a cache of type t (its from_float)."""
    nb = row_bytes(t, x.shape[1])
    return np.stack([kern.from_float(int(t), row, nb) for row in x])


@pytest.mark.parametrize("kt", CACHE_TYPES, ids=lambda t: f"K{t.name}")
def test_attention_on_every_cache_type_and_runs(ref, var, kt):
    """Every value type with these keys, one run or a ring's two (the window wraps)."""
    rng = np.random.default_rng(18)
    for hd, hv in ((64, 64), (256, 256), (128, 96)):
        t = 45
        k = (rng.standard_normal((t, hd)) * rng.choice([0.1, 1, 20])).astype(np.float32)
        v = rng.standard_normal((t, hv)).astype(np.float32)
        q = activations(hd, "gaussian", rng)
        for vt in CACHE_TYPES:
            kr, vr = cache_rows(ref, kt, k), cache_rows(ref, vt, v)
            for runs in ([(0, t)], [(7, 30)], [(30, 15), (0, 12)], [(44, 1), (0, 1)]):
                for softcap in (0.0, 30.0):
                    args = (q, kr, vr, runs, 0.125, softcap, (int(kt), int(vt)), (hd, hv))
                    assert_same_floats(
                        var.attention(*args), ref.attention(*args), f"{hd} {vt.name} {runs}"
                    )


@pytest.mark.parametrize("kt", CACHE_TYPES[2:], ids=lambda t: f"K{t.name}")
def test_quantized_attention_against_numpy(ref, kt):
    """The scalar reference on quantized rows against a float64 computation from GGML's block
    values (edgeinfer.quants) and the q8_0 query (the numpy engine's act_q8_0)."""
    rng = np.random.default_rng(19)
    hd, t = 128, 50
    k = rng.standard_normal((t, hd)).astype(np.float32)
    v = rng.standard_normal((t, hd)).astype(np.float32)
    q = rng.standard_normal(hd).astype(np.float32)
    kr, vr = cache_rows(ref, kt, k), cache_rows(ref, kt, v)
    kd = quants.dequantize(kr.reshape(-1), kt, (t, hd)).astype(np.float64)
    vd = quants.dequantize(vr.reshape(-1), kt, (t, hd)).astype(np.float64)
    # near the values (q4_0 clips the extreme opposite the block's maximum by up to a step)
    assert np.abs(kd - k).max() < (0.02 if kt == GGMLType.Q8_0 else 0.5)
    runs = [(20, 30), (0, 10)]
    rows = np.r_[20:50, 0:10]
    scores = (reference.act_q8_0(q).astype(np.float64) @ kd[rows].T).astype(
        np.float32
    ) * np.float32(0.1)
    w = np.exp((scores - scores.max()).astype(np.float64))
    p = (w / w.sum()).astype(np.float32).astype(np.float64)
    want = (p @ vd[rows]).astype(np.float32)
    got = ref.attention(q, kr, vr, runs, 0.1, 0.0, (int(kt), int(kt)), (hd, hd))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def cancelling(
    n: int, rng: np.random.Generator, tiny: float = 1e-4
) -> tuple[np.ndarray, np.ndarray]:
    """Two vectors whose products are tiny but for giant pairs that cancel: terms added while
    a giant is in the running double sum are rounded to its ulp, so a sum in any order other
    than the reference's shows in the float result. The giants sit at the same places in
    every pair drawn for a given n."""
    a = rng.choice([-1.0, 1.0], n) * tiny * rng.uniform(1, 10, n)
    b = rng.choice([-1.0, 1.0], n) * tiny * rng.uniform(1, 10, n)
    for lo in range(1, n - 1, 37):
        hi = min(n - 1, lo + 1 + lo * 7 % 30)
        a[lo], a[hi], b[lo], b[hi] = 200.0, -200.0, 256.0, 256.0
    return a.astype(np.float32), b.astype(np.float32)


def softmax_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """Scores of every length up to 40 and some longer; spreads from flat to one-hot; NaN,
    infinities, and differences from the maximum where exp underflows to subnormals and 0."""
    out = []
    for n in [*range(1, 41), 63, 100, 257, 513]:
        for spread in (0.01, 3.0, 80.0):
            out.append((rng.standard_normal(n) * spread).astype(np.float32))
    special = np.array(
        [0.0, -0.0, -700.0, -708.5, -720.0, -744.0, -745.1, -745.9, -746.0, -746.5, -1e30, np.nan,
         -np.inf, 1.5, -0.34657359, 0.34657359, -1e-40],
        dtype=np.float32,
    )  # fmt: skip
    out.append(special)
    out.append(np.r_[special, np.float32(np.inf)])  # every difference from +inf is NaN or -inf
    out.append(np.full(9, np.nan, dtype=np.float32))  # no maximum: -inf
    return out


def test_softmax_matches_the_reference(ref, var):
    """Every variant's vector exp and its partial sums give the scalar reference's weights and
    sum bit for bit, tails of every length included."""
    for scores in softmax_inputs(np.random.default_rng(23)):
        (w, total), (w0, total0) = var.softmax(scores), ref.softmax(scores)
        n = len(scores)
        same = (w.view(np.int64) == w0.view(np.int64)) | (np.isnan(w) & np.isnan(w0))
        assert same.all(), f"weights, n={n}: {int((~same).sum())} differ"
        assert total == total0 or (np.isnan(total) and np.isnan(total0)), f"sum, n={n}"


def test_softmax_is_the_numpy_engines(ref):
    """The scalar softmax is the numpy engine's ei_exp and softmax_sum bit for bit (its
    partial sums in order, unlike numpy's pairwise sum); the sum of weights whose exps were
    flushed or are NaN included."""
    for scores in softmax_inputs(np.random.default_rng(29)):
        w0, total0 = ref.softmax(scores)
        top = scores[~np.isnan(scores)].max(initial=-np.inf)
        with np.errstate(invalid="ignore"):  # inf - inf: NaN, as in C
            w = reference.ei_exp((scores - np.float32(top)).astype(np.float64))
        assert np.array_equal(w.view(np.int64), w0.view(np.int64)), f"n={len(scores)}"
        total = reference.softmax_sum(w, np.ones(len(w), bool))
        assert total == total0 or (np.isnan(total) and np.isnan(total0)), f"n={len(scores)}"


def test_exp_is_within_an_ulp_of_libm():
    """ei_exp against libm's exp (math.exp, correctly rounded but for rare cases) over the whole
    range where it is finite and nonzero, subnormal results included, and its edges."""
    rng = np.random.default_rng(31)
    x = np.concatenate(
        [rng.uniform(-745.0, 709.7, 40000), rng.uniform(-0.5, 0.5, 20000),
         rng.uniform(-745.0, -708.0, 10000), np.arange(-745, 710, 0.25)]
    )  # fmt: skip
    got = reference.ei_exp(x)
    want = np.array([math.exp(v) for v in x])
    ulps = np.abs(got - want) / np.spacing(np.abs(want))
    assert ulps.max() <= 1.0, f"{ulps.max()} ulp at x={x[np.argmax(ulps)]!r}"
    edges = np.array([0.0, -0.0, np.nan, -np.inf, np.inf, -746.0, -746.5, 709.78, 710.0, 710.5])
    want = [1.0, 1.0, np.nan, 0.0, np.inf, math.exp(-746.0), 0.0, math.exp(709.78), np.inf, np.inf]
    np.testing.assert_array_equal(reference.ei_exp(edges), want)


def test_attention_sums_keep_the_reference_order(ref, var):
    """Scores of ~1e-9 where the order of the double sum changes them by percents; scaled up
    so that the changes survive the softmax and the fp16 rounding of its weights."""
    rng = np.random.default_rng(16)
    for hd in (64, 200, 256):
        for dtype in (np.float16, np.float32):
            q, _ = cancelling(hd, rng, tiny=1e-5)
            k = np.stack([cancelling(hd, rng, tiny=1e-5)[1] for _ in range(21)]).astype(dtype)
            v = np.stack([cancelling(hd, rng)[1] for _ in range(21)]).astype(dtype)
            for scale in (1e8, 1e9, 1e10):
                got, want = (
                    var.attention(q, k, v, [(0, 21)], scale),
                    ref.attention(q, k, v, [(0, 21)], scale),
                )
                assert_same_floats(got, want, f"hd={hd} {dtype.__name__} scale={scale}")


@pytest.mark.parametrize("t", [GGMLType.F32, GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_float_dot_products_keep_the_reference_order(ref, var, t):
    rng = np.random.default_rng(17)
    for n in (37, 64, 100, 640):
        w, x = cancelling(n, rng)
        wr, y = quantizers.quantize(w, t).reshape(-1), ref.from_float(int(t), x, row_bytes(t, n))
        assert_same_floats(var.vec_dot(int(t), n, wr, y), ref.vec_dot(int(t), n, wr, y), f"n={n}")


def test_attention_value_width_may_differ(ref, var):
    rng = np.random.default_rng(15)
    q = rng.standard_normal(128).astype(np.float32)
    k = rng.standard_normal((40, 128)).astype(np.float16)
    for hv in (1, 4, 16, 20, 96, 256):
        v = rng.standard_normal((40, hv)).astype(np.float16)
        assert_same_floats(
            var.attention(q, k, v, [(3, 37)], 0.1),
            ref.attention(q, k, v, [(3, 37)], 0.1),
            f"hv={hv}",
        )


# ---- standalone C checks, built natively ----------------------------------------------------


def _setup_literal(name: str):
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise LookupError(name)


X86_FOLDERS = {"avx2": "x86_avx2", "avx512": "x86_avx512"}
# the x86 variants' C checks are built here with gcc; on another machine they are skips
X86_HERE = (
    isa_params(X86_FOLDERS)
    if platform.machine().lower() in ("x86_64", "amd64")
    else [
        pytest.param(v, id=v, marks=pytest.mark.skip(reason=f"{v} is x86-64 only"))
        for v in X86_FOLDERS
    ]
)


def _flags(variant: str) -> list[str]:
    flags = _setup_literal("GCC_BASE") + _setup_literal("X86_VARIANTS")[X86_FOLDERS[variant]][0]
    return flags + sanitizer_flags()


@pytest.fixture(scope="module")
def variant_objects(tmp_path_factory):
    """The reference and each variant's sources, compiled once (in parallel) per variant."""
    cc, built = _gcc(), {}

    def objects(variant: str) -> list[Path]:
        if variant not in built:
            out = tmp_path_factory.mktemp(f"obj_{variant}")
            sources = [SIMD / "common" / "numeric.c", SIMD / "common" / "types.c",
                       *sorted((SIMD / "ref").glob("*.c")),
                       *sorted((SIMD / X86_FOLDERS[variant]).glob("*.c"))]  # fmt: skip
            jobs = []
            for i, src in enumerate(sources):
                obj = out / f"{i}.o"
                cmd = [cc, *_flags(variant), "-c", str(src), "-o", str(obj)]
                jobs.append((subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True), obj))
            for job, _ in jobs:
                _, err = job.communicate()
                assert job.returncode == 0, err[-4000:]
            built[variant] = [obj for _, obj in jobs]
        return built[variant]

    return objects


def build(tmp_path: Path, variant: str, main_source: Path, objects: list[Path]) -> Path:
    """main_source linked with the reference and one variant, compiled with setup.py's flags."""
    exe = tmp_path / f"{main_source.stem}_{variant}"
    cmd = [_gcc(), *_flags(variant), f"-DEI_CHECK_INIT=ei_kernels_init_{variant}",
           str(main_source), *map(str, objects), "-o", str(exe), "-lm"]  # fmt: skip
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return exe


def run_check(exe: Path) -> str:
    done = subprocess.run([str(exe)], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and " 0 failed" in done.stdout, done.stdout[-4000:]
    return done.stdout


@pytest.mark.parametrize("variant", X86_HERE)
def test_check_driver_native(tmp_path, variant, variant_objects):
    out = run_check(build(tmp_path, variant, HERE / "check_kernels.c", variant_objects(variant)))
    assert out.startswith(f"checking {variant}")


@pytest.mark.parametrize("variant", X86_HERE)
def test_edge_driver_native(tmp_path, variant, variant_objects):
    """check_edges.c on this CPU's own variants (SIMDe and qemu run it for the others)."""
    out = run_check(build(tmp_path, variant, HERE / "check_edges.c", variant_objects(variant)))
    assert out.startswith(f"edge cases of {variant}"), out[:200]


@pytest.mark.parametrize("variant", X86_HERE)
def test_guard_driver_native(tmp_path, variant, variant_objects):
    """check_guard.c on this CPU's own variants: no kernel reads past rows, interleaved copies
    or activations that end at an inaccessible page (SIMDe and qemu run it for the others)."""
    if platform.system() not in ("Linux", "Darwin"):
        pytest.skip("guard pages need mmap")
    out = run_check(build(tmp_path, variant, HERE / "check_guard.c", variant_objects(variant)))
    assert out.startswith(f"guard pages for {variant}"), out[:200]


TILE_DRIVER = r"""
/* Tiles of every shape (nr, nc <= EI_TILE) and the in-place float ops of one variant
 * against the reference, on rows of several block counts with odd strides. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../common/ei_kernels.h"
void EI_CHECK_INIT(ei_kernels *k);

enum { MAX_N = 80 * 256 + 3 };
static unsigned long long st = 0x2545F4914F6CDD1Dull;
static unsigned rnd(void) {
    st ^= st << 13; st ^= st >> 7; st ^= st << 17;
    return (unsigned)(st >> 17);
}
static float gauss(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) s += (rnd() & 0xffff) / 65536.0f - 0.5f;
    return s;
}

static int passed, failed;
static void same(const char *what, int type, int a, int b, const float *x, const float *y, int n) {
    if (memcmp(x, y, sizeof(float) * n) == 0) { passed++; return; }
    failed++;
    printf("FAIL %s type %d (%d, %d)\n", what, type, a, b);
}

/* byte offsets of a block's fp16 scale fields, -1 when absent */
static void scale_fields(int type, int off[2]) {
    off[0] = 0; off[1] = -1;
    if (type == EI_TYPE_Q4_1 || type == EI_TYPE_Q5_1) off[1] = 2;
    if (type == EI_TYPE_Q4_K || type == EI_TYPE_Q5_K) off[1] = 2;
    if (type == EI_TYPE_Q2_K) { off[0] = 80; off[1] = 82; }
    if (type == EI_TYPE_Q3_K) off[0] = 108;
    if (type == EI_TYPE_Q6_K) off[0] = 208;
}

/* tiny values but for giant pairs that cancel in a dot with another such vector: a sum in
 * any order but the reference's shows (float rows only) */
static void cancelling(float *x, int n, float giant_lo, float giant_hi) {
    for (int i = 0; i < n; i++) x[i] = gauss() * 1e-4f;
    for (int lo = 1; lo < n - 1; lo += 37) {
        const int hi = lo + 1 + lo * 7 % 30 < n ? lo + 1 + lo * 7 % 30 : n - 1;
        x[lo] = giant_lo;
        x[hi] = giant_hi;
    }
}

/* EI_TILE weight rows of n values, wr bytes apart: float types from gaussians (or cancelling
 * giants), blocks from random bytes with small scales */
static void weights(int type, int n, uint8_t *w, size_t wr, const ei_kernels *ref, int giants) {
    const int bs = ei_block_size(type);
    static float x[MAX_N];
    for (size_t i = 0; i < EI_TILE * wr; i++) w[i] = (uint8_t)rnd();
    for (int r = 0; r < EI_TILE; r++) {
        if (bs == 1) {
            if (giants) cancelling(x, n, 200.0f, -200.0f);
            else for (int i = 0; i < n; i++) x[i] = gauss();
            ref->from_float[type](x, w + r * wr, n);
            continue;
        }
        int off[2];
        scale_fields(type, off);
        const size_t block = ei_row_size(type, bs);
        for (size_t b = 0; b + block <= ei_row_size(type, n); b += block)
            for (int j = 0; j < 2; j++)
                if (off[j] >= 0) {
                    const ei_f16 h = ei_fp32_to_fp16(gauss() * 0.02f);
                    memcpy(w + r * wr + b + off[j], &h, 2);
                }
    }
}

int main(void) {
    ei_kernels ref, var;
    ei_kernels_init_ref(&ref);
    EI_CHECK_INIT(&var);
    printf("tiles of %s against %s\n", var.name, ref.name);
    const int types[] = {EI_TYPE_Q4_0, EI_TYPE_Q4_1, EI_TYPE_Q5_0, EI_TYPE_Q5_1, EI_TYPE_Q8_0,
                         EI_TYPE_Q2_K, EI_TYPE_Q3_K, EI_TYPE_Q4_K, EI_TYPE_Q5_K, EI_TYPE_Q6_K,
                         EI_TYPE_F16, EI_TYPE_BF16, EI_TYPE_F32};
    const int counts[] = {1, 2, 3, 5, 8, 13, 80};
    /* float rows (interleaved by value, any length): odd lengths, and past chunks of 64 */
    const int float_lengths[] = {1, 3, 17, 43, 64, 105, 642};
    /* rows padded past their length, by 8 bytes so that every block's fields stay aligned as
     * in a GGUF file (UBSan: a 7-byte pad put block_q8_0.d at odd addresses); output
     * columns SS floats apart */
    enum { PAD = 8, SS = EI_TILE + 1 };
    for (unsigned ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
    for (int giants = 0; giants < 2; giants++) {
        const int type = types[ti], pt = ei_partner_type(type), bs = ei_block_size(type);
        if (!var.gemm[type] || (giants && bs > 1)) continue;
        for (unsigned ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            const int n = counts[ci] * (bs == 1 ? 8 : bs) + (bs == 1 ? (int)ci % 4 : 0);
            const size_t wr = ei_row_size(type, n) + PAD, ar = ei_row_size(pt, n) + PAD;
            uint8_t *w = malloc(EI_TILE * wr), *act = malloc(EI_TILE * ar);
            static float x[MAX_N];
            weights(type, n, w, wr, &ref, giants);
            for (int c = 0; c < EI_TILE; c++) {
                if (giants) cancelling(x, n, 256.0f, 256.0f);
                else for (int i = 0; i < n; i++) x[i] = gauss() * (c == 2 && i % 29 == 0 ? 30.0f : 1);
                ref.from_float[pt](x, act + c * ar, n);
            }
            for (int nr = 1; nr <= EI_TILE; nr++)
                for (int nc = 1; nc <= EI_TILE; nc++) {
                    float got[EI_TILE * SS], want[EI_TILE * SS];
                    for (int i = 0; i < EI_TILE * SS; i++) got[i] = want[i] = -12345.0f;
                    var.gemm[type](n, nr, nc, got, SS, w, wr, act, ar);
                    for (int c = 0; c < nc; c++)
                        for (int r = 0; r < nr; r++)
                            ref.vec_dot[type](n, &want[c * SS + r], w + r * wr, act + c * ar);
                    /* and nothing written outside the tile */
                    same("gemm", type, nr, nc, got, want, EI_TILE * SS);
                }
            free(w);
            free(act);
        }
    }
    /* interleaved groups of EI_X16 rows (the engine's packed copies) against the rows as stored:
     * the scalar reference of the layout, and the variant's kernel where it has one */
    for (unsigned ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const int type = types[ti], pt = ei_partner_type(type), bs = ei_block_size(type);
        const ei_gemm_x16_fn ref_x16 = ei_ref_gemm_x16(type);
        if (!ref_x16) {
            if (var.gemm_x16[type]) { printf("FAIL gemm_x16 type %d has no reference\n", type); failed++; }
            continue;
        }
        for (unsigned ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            const int n = bs > 1 ? counts[ci] * bs : float_lengths[ci];
            const size_t wr = ei_row_size(type, n) + PAD, ar = ei_row_size(pt, n) + PAD;
            uint8_t *w = malloc(EI_X16 * wr), *packed = malloc(ei_x16_size(type, n)), *act = malloc(EI_X16_TILE_MAX * ar);
            static float x[MAX_N];
            for (int g = 0; g < EI_X16; g += EI_TILE) weights(type, n, w + g * wr, wr, &ref, 0);
            if (!ei_pack_x16(type, w, wr, n, packed)) { printf("FAIL pack_x16 type %d\n", type); failed++; }
            if (ei_x16_unpacks(type)) { /* every row back as stored, byte for byte */
                uint8_t *back = malloc(wr);
                for (int r = 0; r < EI_X16; r++) {
                    const int ok = ei_unpack_x16_row(type, packed, r, n, back) &&
                                   memcmp(back, w + r * wr, ei_row_size(type, n)) == 0;
                    if (!ok) { printf("FAIL unpack_x16_row type %d n %d row %d\n", type, n, r); failed++; }
                }
                free(back);
            }
            for (int c = 0; c < EI_X16_TILE_MAX; c++) {
                for (int i = 0; i < n; i++) x[i] = gauss() * (c == 2 && i % 29 == 0 ? 30.0f : 1);
                ref.from_float[pt](x, act + c * ar, n);
            }
            const size_t group = ei_x16_size(type, n);
            uint8_t *span = malloc(3 * group), *backwards = malloc(EI_X16 * wr);
            for (int r = 0; r < EI_X16; r++) memcpy(backwards + r * wr, w + (EI_X16 - 1 - r) * wr, wr);
            memcpy(span, packed, group);
            ei_pack_x16(type, backwards, wr, n, span + group);
            memcpy(span + 2 * group, packed, group);
            free(backwards);
            const int x16_tile = var.x16_tile ? var.x16_tile : EI_TILE;
            for (int nc = 1; nc <= x16_tile; nc++) {
                enum { S16 = EI_X16 + 3 };
                float got[EI_X16_TILE_MAX * S16], want[EI_X16_TILE_MAX * S16];
                for (int i = 0; i < EI_X16_TILE_MAX * S16; i++) got[i] = want[i] = -12345.0f;
                for (int c = 0; c < nc; c++)
                    for (int r = 0; r < EI_X16; r++)
                        ref.vec_dot[type](n, &want[c * S16 + r], w + r * wr, act + c * ar);
                ref_x16(n, nc, got, S16, packed, act, ar);
                same("ref gemm_x16", type, EI_X16, nc, got, want, EI_X16_TILE_MAX * S16);
                if (!var.gemm_x16[type]) continue;
                for (int i = 0; i < EI_X16_TILE_MAX * S16; i++) got[i] = -12345.0f;
                var.gemm_x16[type](n, nc, got, S16, packed, act, ar);
                same("gemm_x16", type, EI_X16, nc, got, want, EI_X16_TILE_MAX * S16);
                if (!var.gemm_x16_span[type]) continue;
                /* a span of three groups: these rows, the same rows backwards, these again */
                enum { S48 = 3 * EI_X16 + 3 };
                float got3[EI_X16_TILE_MAX * S48], want3[EI_X16_TILE_MAX * S48];
                for (int i = 0; i < EI_X16_TILE_MAX * S48; i++) got3[i] = want3[i] = -12345.0f;
                for (int c = 0; c < nc; c++)
                    for (int g = 0; g < 3; g++)
                        for (int r = 0; r < EI_X16; r++)
                            want3[c * S48 + g * EI_X16 + r] = want[c * S16 + (g == 1 ? EI_X16 - 1 - r : r)];
                var.gemm_x16_span[type](n, 3, nc, got3, S48, span, act, ar);
                same("gemm_x16_span", type, 3 * EI_X16, nc, got3, want3, EI_X16_TILE_MAX * S48);
            }
            free(w);
            free(packed);
            free(span);
            free(act);
        }
    }
    for (int n = 1; n <= 70; n += (n < 20 ? 1 : 17)) {
        float a[70], b[70], x[70];
        for (int i = 0; i < n; i++) { a[i] = b[i] = gauss() * 100.0f; x[i] = gauss(); }
        ref.add(n, a, x); var.add(n, b, x);
        same("add", 0, n, 0, a, b, n);
        ref.scale(n, a, 0.37f); var.scale(n, b, 0.37f);
        same("scale", 0, n, 0, a, b, n);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
"""  # noqa: E501 (C source, held to the style of simd/, not to the Python line length)


@pytest.mark.parametrize("variant", X86_HERE)
def test_tiles_and_in_place_ops_native(tmp_path, variant, variant_objects):
    driver = tmp_path / "tiles.c"
    driver.write_text(
        TILE_DRIVER.replace('"../common/ei_kernels.h"', f'"{SIMD / "common" / "ei_kernels.h"}"')
    )
    run_check(build(tmp_path, variant, driver, variant_objects(variant)))
