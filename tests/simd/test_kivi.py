"""The KIVI cache kernels (simd/*/kivi.c): every instruction set this machine runs against
the numpy oracle (edgeinfer.kivi) bit for bit, on plain inputs and on the roundings' corner
cases; the oracle against KIVI's own quantizer formula written in torch, and against the
reconstruction bound; block sizes of the library and the oracle; typed refusals.

The NEON and AVX-512 variants are also checked against the scalar reference by the C drivers
(check_kernels.c, check_edges.c) under qemu and SIMDe: test_neon_qemu.py, test_avx512_simde.py.
Float results compare as bits; two NaNs compare equal whatever their payloads."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer import _native, errors, kivi
from tests.simd.platform_gates import isa_params

AVAILABLE, WHY = _native.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"native library: {WHY}")

BITS = (2, 4)
GROUPS = (32, 64, 128)
HDS = (16, 64, 72, 256)  # 72: a vector tail on every instruction set
HDVS = (6, 16, 20, 24, 64, 128, 256)  # 6, 20, 24: groups of one head below G, odd sizes
SPECIAL_KINDS = 12


@pytest.fixture(scope="module", params=isa_params(_native.ISA_NAMES))
def kern(request):
    return _native.Kernels(request.param)


def assert_same_floats(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, what
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        i = int(np.argmin(same.reshape(-1)))
        pytest.fail(f"{what}: [{i}] got {got.reshape(-1)[i]!r} want {want.reshape(-1)[i]!r}")


def special(kind: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n float16 inputs of one of the roundings' corner cases (as check_edges.c draws them)."""
    g = rng.standard_normal(n).astype(np.float32)
    i = np.arange(n)
    bits: np.ndarray | None = None
    if kind == 0:  # a constant: scale 0, every code 0
        x = np.full(n, 0.75)
    elif kind == 1:  # one NaN, coded 0
        x = np.where(i == 3, np.nan, g)
    elif kind == 2:  # +inf: an infinite scale, every code 0
        x = np.where(i == 1, np.inf, g)
    elif kind == 3:
        x = np.where(i == 0, -np.inf, g)
    elif kind == 4:  # range 2^-24: the scale rounds to fp16 zero
        bits = (i % 2).astype(np.uint16)
    elif kind == 5:  # NaNs only
        bits = (0x7E00 | (i & 0xFF)).astype(np.uint16)
    elif kind == 6:
        x = np.where(i % 2 == 1, np.inf, -np.inf)
    elif kind == 7:  # equal infinities: a NaN range
        x = np.full(n, np.inf)
    elif kind == 8:  # signed zeros and ones
        bits = np.choose(i % 3, [0x8000, 0x0000, 0x3C00]).astype(np.uint16)
    elif kind == 9:  # halves: ties to even
        x = (i % 31) * 0.5
    elif kind == 10:  # a tiny but usable range
        x = 1.0 + (i % 5) * 2.0**-10
    else:
        x = g * 3.0
    if bits is not None:
        return bits.view(np.float16)
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def key_rows(kind: str, group: int, hd: int, rng: np.random.Generator) -> np.ndarray:
    """(G, hd) float16 keys: gaussian, with outlier channels (KIVI's motivation), or channel d
    of special kind d % SPECIAL_KINDS."""
    if kind == "special":
        cols = [special(d % SPECIAL_KINDS, group, rng) for d in range(hd)]
        return np.ascontiguousarray(np.stack(cols, axis=1))
    x = rng.standard_normal((group, hd)).astype(np.float32)
    if kind == "outliers":
        x[:, ::7] *= 30.0
    return x.astype(np.float16)


def value_rows(kind: str, m: int, hdv: int, rng: np.random.Generator) -> np.ndarray:
    """(m, hdv) float16 values: gaussian, or row j of special kind j % SPECIAL_KINDS."""
    if kind == "special":
        return np.stack([special(j % SPECIAL_KINDS, hdv, rng) for j in range(m)])
    return (rng.standard_normal((m, hdv)) * 2.0).astype(np.float16)


KEY_KINDS = ("gaussian", "outliers", "special")
SLICES = ((0, None), (5, 9), (30, 2), (0, 1), (-1, 1), (17, 0))  # (t0, n); t0 < 0: from the end


# ---- sizes and refusals ---------------------------------------------------------------------


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group", GROUPS)
def test_sizes_equal_the_library(kern, bits, group):
    for hd in (*HDS, 1, 3, 512):
        assert kern.kivi_k_block_bytes(bits, group, hd) == kivi.k_block_bytes(bits, group, hd)
        assert kivi.k_block_bytes(bits, group, hd) == hd * 4 + hd * group * bits // 8
    for hdv in (*HDVS, 2, 4, 40, 96, 512, 513, 0):
        native = kern.kivi_v_row_bytes(bits, group, hdv)
        try:
            want = kivi.v_row_bytes(bits, group, hdv)
        except errors.InvalidOptionError:
            want = 0
        assert native == want, hdv


def test_bits_per_value():
    assert kivi.bits_per_value_k(4, 32) == 5.0
    assert kivi.bits_per_value_k(4, 64) == 4.5
    assert kivi.bits_per_value_k(2, 128) == 2.25
    assert kivi.bits_per_value_v(4, 32, 128) == 5.0
    assert kivi.bits_per_value_v(2, 128, 64) == 2.5  # gv = min(G, hdv) = 64
    # the bits per value are the bytes per value of the formats
    assert kivi.k_block_bytes(4, 64, 128) * 8 == 4.5 * 64 * 128
    assert kivi.v_row_bytes(4, 32, 128) * 8 == 5.0 * 128


def test_refusals_are_typed(kern):
    rows = np.zeros((32, 16), dtype=np.float16)
    with pytest.raises(errors.InvalidOptionError):
        kern.kivi_quantize_k(3, rows)
    with pytest.raises(errors.InvalidOptionError):
        kern.kivi_quantize_k(4, np.zeros((48, 16), dtype=np.float16))  # G = 48
    with pytest.raises(errors.InvalidOptionError):
        kern.kivi_quantize_k(4, np.zeros((32, 513), dtype=np.float16))
    block = kern.kivi_quantize_k(4, rows)
    q = np.zeros(16, dtype=np.float32)
    for t0, n in ((-1, 2), (0, 33), (31, 2)):
        with pytest.raises(errors.InvalidOptionError):
            kern.kivi_k_dots(4, 32, 16, block, q, t0, n)
    for bits, hdv in ((4, 40), (2, 6), (4, 3), (4, 1024)):  # 40 % 32, 6 * 2 bits, odd, too wide
        with pytest.raises(errors.InvalidOptionError):
            kern.kivi_quantize_v(bits, 32, np.zeros(hdv, dtype=np.float16))
        with pytest.raises(errors.InvalidOptionError):
            kivi.v_row_bytes(bits, 32, hdv)
    with pytest.raises(errors.InvalidOptionError):
        kern.kivi_decode_v(4, 32, 64, np.zeros((2, 10), dtype=np.uint8))  # rows shorter than 40
    # the library's own checks, past the wrapper's: V rows closer than a row, too many tokens
    raw, out = np.zeros(100, dtype=np.uint8), np.zeros(128, dtype=np.float32)
    lib = kern.lib
    assert lib.ei_kernel_kivi_decode_v(kern.isa, 4, 32, 64, raw.ctypes.data, 39, 2,
                                       out.ctypes.data) == 1  # fmt: skip
    assert lib.ei_kernel_kivi_decode_v(kern.isa, 4, 32, 64, raw.ctypes.data, 40, 2,
                                       out.ctypes.data) == 0  # fmt: skip
    assert lib.ei_kernel_kivi_k_dots(kern.isa, 4, 32, 16, block.ctypes.data, 1, 32,
                                     q.ctypes.data, out.ctypes.data) == 1  # fmt: skip
    assert lib.ei_kernel_kivi_quantize_k(kern.isa, 4, 32, 16, rows.ctypes.data, 30,
                                         block.ctypes.data) == 1  # fmt: skip
    assert b"overlap" in lib.ei_last_error()


# ---- native == oracle, bit for bit ----------------------------------------------------------


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group", GROUPS)
def test_key_blocks_and_dots_equal_the_oracle(kern, bits, group):
    rng = np.random.default_rng(bits * 1000 + group)
    for hd in HDS:
        for kind in KEY_KINDS:
            rows = key_rows(kind, group, hd, rng)
            want = kivi.quantize_k(rows, bits)
            got = kern.kivi_quantize_k(bits, rows)
            assert np.array_equal(got, want), (hd, kind)
            # the same keys as part of wider rows (a cache row holds every KV head)
            wide = np.zeros((group, hd + 40), dtype=np.float16)
            wide[:, 8 : 8 + hd] = rows
            assert np.array_equal(kern.kivi_quantize_k(bits, wide[:, 8:], hd), want), (hd, kind)
            q = rng.standard_normal(hd).astype(np.float32)
            dots = kivi.k_dots(want, bits, group, hd, q)
            for t0, n in SLICES:
                t0 = t0 % group
                n = group - t0 if n is None else n
                assert_same_floats(
                    kern.kivi_k_dots(bits, group, hd, want, q, t0, n),
                    dots[t0 : t0 + n],
                    f"dots hd {hd} {kind} tokens {t0}+{n}",
                )
                assert_same_floats(
                    kivi.k_dots(want, bits, group, hd, q, t0, n), dots[t0 : t0 + n], "slice"
                )


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group", GROUPS)
def test_value_rows_and_decoding_equal_the_oracle(kern, bits, group):
    rng = np.random.default_rng(bits * 7 + group)
    m = SPECIAL_KINDS
    for hdv in HDVS:
        if bits == 2 and min(group, hdv) * 2 % 8:
            continue  # no whole bytes: refused (test_refusals_are_typed)
        rb = kivi.v_row_bytes(bits, group, hdv)
        for kind in ("gaussian", "special"):
            x = value_rows(kind, m, hdv, rng)
            want = np.stack([kivi.quantize_v(r, bits, group) for r in x])
            got = np.stack([kern.kivi_quantize_v(bits, group, r) for r in x])
            assert np.array_equal(got, want), (hdv, kind)
            decoded = kivi.decode_v(want, bits, group, hdv)
            assert_same_floats(kern.kivi_decode_v(bits, group, hdv, want), decoded, f"{hdv}")
            padded = np.zeros((m, rb + 13), dtype=np.uint8)  # rows further apart than a row
            padded[:, :rb] = want
            got_padded = kern.kivi_decode_v(bits, group, hdv, padded[:, :rb])
            assert_same_floats(got_padded, decoded, f"{hdv} padded rows")
            two = kern.kivi_decode_v(bits, group, hdv, want[3:5])
            assert_same_floats(two, decoded[3:5], f"{hdv} rows 3, 4")


def test_corner_cases_are_coded_as_documented(kern):
    """What each corner case of simd/common/kivi.h stores, on a K block of 4-bit codes."""
    rng = np.random.default_rng(5)
    rows = key_rows("special", 32, SPECIAL_KINDS, rng)
    block = kern.kivi_quantize_k(4, rows)
    scale, zero, codes = kivi.split_k(block, 4, 32, SPECIAL_KINDS)
    f16 = np.array([0.0, -np.inf, np.inf], dtype=np.float16).view(np.uint16)
    plus0, minus_inf, plus_inf = (int(v) for v in f16)
    assert scale[0] == plus0 and zero[0] == int(np.float16(0.75).view(np.uint16))
    assert (codes[0] == 0).all()
    assert (kivi.decode_k(block, 4, 32, SPECIAL_KINDS)[:, 0] == 0.75).all()  # exactly
    assert codes[1][3] == 0 and codes[1].max() > 0  # the NaN alone is coded 0
    assert scale[2] == plus_inf and (codes[2] == 0).all()
    assert scale[3] == plus_inf and (codes[3] == 0).all() and zero[3] == minus_inf
    assert scale[4] == plus0 and (codes[4] == 0).all()  # 2^-24 / 15 rounds to fp16 zero
    assert scale[5] == minus_inf and zero[5] == plus_inf and (codes[5] == 0).all()  # no number
    assert scale[7] == 0x7E00 and (codes[7] == 0).all()  # inf - inf
    fifteenth = int(np.float16(np.float32(1) / np.float32(15)).view(np.uint16))
    assert zero[8] == plus0 and scale[8] == fifteenth  # the zero of {-0, +0, 1} is +0
    assert (codes[8][::3] == 0).all() and (codes[8][2::3] == 15).all()
    halves = np.asarray(rows[:, 9], dtype=np.float32)  # mn 0, mx 15, s' 1: halves tie to even
    assert np.array_equal(codes[9], np.minimum(np.rint(halves), 15))


# ---- the oracle against KIVI's formula and the error bound ----------------------------------


def kivi_paper_quantize(x: np.ndarray, bits: int, dim: int) -> tuple[np.ndarray, ...]:
    """KIVI's quantizer (its reference code, in torch): min and max along dim, scale =
    (mx - mn) / (2^b - 1), code = ((x - mn) / scale).clamp(0, 2^b - 1).round(), decoded
    code * scale + mn. Returns the decoded values, the codes and the scale."""
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(np.asarray(x, dtype=np.float32))
    mn = torch.amin(t, dim=dim, keepdim=True)
    mx = torch.amax(t, dim=dim, keepdim=True)
    scale = (mx - mn) / (2**bits - 1)
    code = ((t - mn) / scale).clamp(0, 2**bits - 1).round()
    return (code * scale + mn).numpy(), code.numpy(), scale.numpy()


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group", GROUPS)
def test_decoded_values_match_kivi_and_the_error_bound(bits, group):
    rng = np.random.default_rng(group + bits)
    ref = _native.Kernels("scalar")
    hd = 128
    keys = key_rows("outliers", group, hd, rng)  # (G, hd): per channel, over the tokens
    values = value_rows("gaussian", 8, hd, rng)  # (8, hd): per token, groups of channels
    gv = kivi.v_group(bits, group, hd)
    block = ref.kivi_quantize_k(bits, keys)
    rows = np.stack([ref.kivi_quantize_v(bits, group, v) for v in values])
    theirs_k, codes_k, s_k = kivi_paper_quantize(keys, bits, 0)
    theirs_v, codes_v, s_v = kivi_paper_quantize(values.reshape(8, hd // gv, gv), bits, 2)
    _, _, k_codes = kivi.split_k(block, bits, group, hd)
    _, _, v_codes = kivi.split_v(rows, bits, group, hd)
    cases = [
        ("keys", keys, kivi.decode_k(block, bits, group, hd), k_codes.T, theirs_k, codes_k,
         np.broadcast_to(s_k, keys.shape)),
        ("values", values, kivi.decode_v(rows, bits, group, hd), v_codes,
         theirs_v.reshape(8, hd), codes_v.reshape(8, hd), np.repeat(s_v[..., 0], gv, axis=1)),
    ]  # fmt: skip
    for what, x16, ours, our_codes, theirs, their_codes, s in cases:
        x = x16.astype(np.float32)
        s_stored = s.astype(np.float16).astype(np.float32)  # s' (the scales are all normal)
        slack = 2.0**-20 * (np.abs(x) + np.abs(ours))
        # our codes are KIVI's but for values within the fp16 scale's error of a half step
        assert (np.abs(ours - theirs) <= (s + s_stored) / 2 * (1 + 2**-10) + slack).all(), what
        assert (np.abs(our_codes.astype(np.int32) - their_codes) <= 1).all(), what
        assert (our_codes == their_codes).mean() >= 0.97, what
        # the reconstruction bound: half a step of the stored scale
        assert (np.abs(x - ours) <= s_stored / 2 * (1 + 2**-10) + slack).all(), what
