"""The Vulkan kernels (simd/gpu_vulkan/shaders/) against the scalar reference (simd/ref/) on
Mesa's lavapipe in CI: every weight type's decoder bit for bit (get_rows), the products
(gemm, the input quantized as the CPU quantizes it) within float32 rounding of the CPU's
vec_dot, in both the subgroup and the shared-memory variants; weights split over several
bindings; the steps between the products and attention; and the typed errors.
Without a Vulkan driver these skip, saying so; in CI they must run."""

from __future__ import annotations

import os

import numpy as np
import pytest

from edgeinfer import _native, errors
from edgeinfer.gguf.constants import GGMLType
from tests.simd.test_native_kernels import WEIGHT_TYPES, assert_same_floats, row_bytes, weight_rows

pytestmark = pytest.mark.skipif(not _native.available()[0], reason="no native library")

GPU_TYPES = WEIGHT_TYPES  # every type the CPU kernels decode
COLS = 768  # three K-quant super-blocks, 24 legacy blocks
ROWS = 67  # not a multiple of anything the shaders group by


def _open(monkeypatch: pytest.MonkeyPatch | None = None, **env: str) -> _native.VulkanKernels:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _native.VulkanKernels()
    except errors.UnsupportedModelError as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have a Vulkan driver (lavapipe): {e}")
        pytest.skip(f"no Vulkan driver here: {e}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def ref():
    return _native.Kernels("scalar")


@pytest.fixture(scope="module", params=["integer_dot", "subgroups", "shared"])
def gpu(request):
    """Each variant of the shaders: the products' packed int8 dot products (and subgroups),
    subgroups alone, and neither (shared memory and scalar int8 products)."""
    dot, sg = request.param == "integer_dot", request.param != "shared"
    ctx = _open(EDGEINFER_VULKAN_SUBGROUPS="1" if sg else "0",
                EDGEINFER_VULKAN_INTEGER_DOT="1" if dot else "0")  # fmt: skip
    info = ctx.info()
    if (sg and not info["subgroups"]) or (dot and not info["integer_dot"]):
        ctx.close()
        pytest.skip(f"this device lacks what the {request.param} variant needs")
    assert (info["subgroups"], info["integer_dot"]) == (sg, dot)
    yield ctx
    ctx.close()


def _decoded(ref, t: GGMLType, w: np.ndarray, cols: int) -> np.ndarray:
    return np.stack([ref.to_float(t, row, cols) for row in w])


@pytest.mark.parametrize("kind", ["quantized", "random"])
@pytest.mark.parametrize("t", GPU_TYPES, ids=lambda t: t.name)
def test_get_rows_decodes_like_the_reference(gpu, ref, t, kind):
    rng = np.random.default_rng(int(t) * 7 + len(kind))
    w = weight_rows(t, COLS, ROWS, kind, rng)
    ids = [4, 0, ROWS - 1, 4, 33]
    got = gpu.get_rows(t, w, ROWS, COLS, ids)
    want = _decoded(ref, t, w[ids], COLS)
    assert_same_floats(got.ravel(), want.ravel(), f"{t.name} rows {ids}")


def _cpu_products(ref, t: GGMLType, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """What the CPU engine computes: each row's vec_dot with the input quantized to the weight
    type's partner (q8_0, q8_1, q8_K, or rounded to f16 / bf16)."""
    pt = ref.partner_type(t)
    acts = [ref.from_float(pt, row, row_bytes(GGMLType(pt), x.shape[1])) for row in x]
    return np.array([[ref.vec_dot(t, x.shape[1], wr, a) for wr in w] for a in acts])


def _check_product(got: np.ndarray, want: np.ndarray, what: str):
    """The CPU's product to the bit: the same integer block dots of the same quantized input,
    and the double sum's rounding reproduced by float pairs (shaders/exact.glsl)."""
    assert_same_floats(got.ravel(), want.ravel(), what)


@pytest.mark.parametrize("n_tokens", [1, 3, 9])
@pytest.mark.parametrize("t", GPU_TYPES, ids=lambda t: t.name)
def test_gemm_matches_the_reference(gpu, ref, t, n_tokens):
    rng = np.random.default_rng(int(t) * 11 + n_tokens)
    w = weight_rows(t, COLS, ROWS, "quantized", rng)
    x = rng.standard_normal((n_tokens, COLS)).astype(np.float32)
    got = gpu.gemm(t, w, ROWS, COLS, x)
    want = _cpu_products(ref, t, w, x)
    _check_product(got, want, f"{t.name} x {n_tokens} tokens")


@pytest.mark.parametrize("t", [GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.F16], ids=lambda t: t.name)
def test_a_tokens_result_does_not_depend_on_the_batch(gpu, t):
    rng = np.random.default_rng(5)
    w = weight_rows(t, COLS, ROWS, "quantized", rng)
    x = rng.standard_normal((11, COLS)).astype(np.float32)
    batch = gpu.gemm(t, w, ROWS, COLS, x)
    for i in (0, 7, 8, 10):  # first and last of a tile of 8, and of the next one
        assert_same_floats(gpu.gemm(t, w, ROWS, COLS, x[i]).ravel(), batch[i], f"token {i}")


def test_weights_over_the_binding_limit_are_split_by_rows(ref):
    """A binding cap of 8 KiB (EDGEINFER_VULKAN_MAX_BUFFER) makes a Q4_0 weight of 67 rows of
    432 bytes four parts: the same results, bit for bit, as in one binding."""
    rng = np.random.default_rng(9)
    t = GGMLType.Q4_0
    w = weight_rows(t, COLS, ROWS, "quantized", rng)
    x = rng.standard_normal((3, COLS)).astype(np.float32)
    with _open() as whole, _open(EDGEINFER_VULKAN_MAX_BUFFER="8192") as split:
        assert split.info()["weight_part_bytes"] == 8192 < row_bytes(t, COLS) * ROWS
        assert whole.info()["weight_part_bytes"] >= row_bytes(t, COLS) * ROWS
        parts, one = split.gemm(t, w, ROWS, COLS, x), whole.gemm(t, w, ROWS, COLS, x)
        assert_same_floats(parts.ravel(), one.ravel(), "gemm")
        ids = [0, 17, 18, 66, 35, 36]  # on both sides of the part boundaries (18 rows a part)
        got = split.get_rows(t, w, ROWS, COLS, ids)
        assert_same_floats(got.ravel(), _decoded(ref, t, w[ids], COLS).ravel(), "get_rows")
        assert split.info()["allocated_bytes"] == 0  # every buffer freed


def test_bad_requests_give_typed_errors():
    with _open() as gpu:
        w = np.zeros(row_bytes(GGMLType.Q8_K, 256) * 2, np.uint8)
        with pytest.raises(errors.UnsupportedModelError, match="no kernel for type"):
            gpu.gemm(GGMLType.Q8_K, w, 2, 256, np.zeros((1, 256), np.float32))
        with pytest.raises(errors.UnsupportedModelError, match="40 columns"):
            w = np.zeros(2 * 40 * 4, np.uint8)
            gpu.gemm(GGMLType.F32, w, 2, 40, np.zeros((1, 40), np.float32))
        w = np.zeros(row_bytes(GGMLType.Q8_0, 64) * 3, np.uint8)
        with pytest.raises(errors.InvalidOptionError, match="row 3 of 3"):
            gpu.get_rows(GGMLType.Q8_0, w, 3, 64, [0, 3])
        with pytest.raises(errors.InvalidOptionError, match="inputs of 32 values"):
            gpu.gemm(GGMLType.Q8_0, w, 3, 64, np.zeros((1, 32), np.float32))
    with _open(EDGEINFER_VULKAN_MAX_BUFFER="4096") as small:
        w = np.zeros(row_bytes(GGMLType.F32, 2048) * 2, np.uint8)  # 8 KiB rows
        with pytest.raises(errors.UnsupportedModelError, match="storage binding limit"):
            small.gemm(GGMLType.F32, w, 2, 2048, np.zeros((1, 2048), np.float32))
        small.close()
        with pytest.raises(errors.InvalidOptionError, match="closed"):
            small.info()


# ---- the steps between the products ---------------------------------------------------------


@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_matches_the_reference(gpu, ref, weighted):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 640)) * [[1], [1e-3], [30], [1], [0.1]]).astype(np.float32)
    w = rng.standard_normal(640).astype(np.float32) if weighted else None
    got = gpu.rms_norm(x, w, 1e-6)
    want = np.stack([ref.rms_norm(row, w, 1e-6) for row in x])
    assert_same_floats(got.ravel(), want.ravel(), "rms_norm")


def test_head_norms_share_one_weight(gpu, ref):
    """q_norm / k_norm: rows of head_dim values (every head of every token) with one weight."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3 * 4, 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)
    want = np.stack([ref.rms_norm(row, w, 1e-6) for row in x])
    assert_same_floats(gpu.rms_norm(x, w, 1e-6).ravel(), want.ravel(), "head norms")


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_rot", [64, 32])
def test_rope_matches_the_reference_bit_for_bit(gpu, ref, neox, n_rot):
    rng = np.random.default_rng(n_rot + neox)
    n_tokens, n_heads, head_dim = 5, 4, 64
    x = rng.standard_normal((n_tokens, n_heads, head_dim)).astype(np.float32)
    angles = rng.uniform(-100, 100, (n_tokens, n_rot // 2))
    cs = np.stack([np.cos(angles), np.sin(angles)], axis=-1).reshape(n_tokens, n_rot)
    cs = cs.astype(np.float32)
    got = gpu.rope(x, cs, neox)
    want = np.stack([[ref.rope(x[t, h], cs[t], neox) for h in range(n_heads)] for t in range(5)])
    assert_same_floats(got.ravel(), want.ravel(), "rope")


def test_geglu_matches_the_reference_bit_for_bit(gpu, ref):
    """GELU through the CPU's fp16 table, the lookups rounded to nearest even as on the CPU:
    every fp16 value in (-10, 10) and halfway cases between them."""
    h = np.arange(0, 65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    h = h[np.isfinite(h) & (np.abs(h) < 12)]
    mid = (h[:-1] + np.nextafter(h[:-1], np.float32(np.inf))) / 2  # ties and near-ties
    g = np.concatenate([h, mid, [-10.0, 10.0, 1e-30, -3e-8]]).astype(np.float32)
    u = np.random.default_rng(2).standard_normal(g.size).astype(np.float32)
    assert_same_floats(gpu.glu(True, g, u), ref.glu(True, g, u), "geglu")


def test_swiglu_matches_the_reference_bit_for_bit(gpu, ref):
    """SiLU in float pairs rounds as the CPU's double: over the gate's range, near zero and
    where exp(-g) leaves the floats' range."""
    rng = np.random.default_rng(6)
    g = np.concatenate([rng.standard_normal(5000) * 6, rng.standard_normal(500) * 1e-4,
                        [0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 80.0, -80.0, 100.0]])  # fmt: skip
    g = g.astype(np.float32)
    u = rng.standard_normal(g.size).astype(np.float32)
    assert_same_floats(gpu.glu(False, g, u), ref.glu(False, g, u), "swiglu")


def test_elementwise_ops(gpu):
    rng = np.random.default_rng(8)
    y = (rng.standard_normal(1000) * 50).astype(np.float32)
    x = rng.standard_normal(1000).astype(np.float32)
    assert_same_floats(gpu.op("add", y, x), y + x, "add")
    assert_same_floats(gpu.op("scale", y, s=25.3), y * np.float32(25.3), "scale")
    # the engine's final soft-cap: (float)tanh((double)(y / cap)) * cap
    y[:50] = (rng.standard_normal(50) * 1e-3).astype(np.float32)  # tanh's series near zero
    want = (np.tanh((y / np.float32(30.0)).astype(np.float64)).astype(np.float32)) * np.float32(30)
    assert_same_floats(gpu.op("softcap", y, s=30.0), want, "softcap")
    with pytest.raises(errors.InvalidOptionError):
        gpu.op("softcap", y, s=0.0)


# ---- attention ------------------------------------------------------------------------------

CACHE_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_0]


def _cache_rows(ref, x: np.ndarray, t: GGMLType) -> np.ndarray:
    """(T, heads, d) floats as cache rows of type t: (T, heads * row bytes) uint8."""
    if t in (GGMLType.F32, GGMLType.F16):
        dtype = np.float32 if t == GGMLType.F32 else np.float16
        return np.ascontiguousarray(x.astype(dtype)).view(np.uint8).reshape(x.shape[0], -1)
    head = row_bytes(t, x.shape[2])
    flat = [ref.from_float(t, h, head) for row in x for h in row]
    return np.concatenate(flat).reshape(x.shape[0], -1)


@pytest.mark.parametrize("softcap", [0.0, 20.0])
@pytest.mark.parametrize("vt", CACHE_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("kt", CACHE_TYPES, ids=lambda t: t.name)
def test_attention_matches_the_reference(gpu, ref, kt, vt, softcap):
    """Four query heads over two KV heads, three runs of rows with gaps between them, as the
    CPU's scalar attention computes each head (the query rounded or quantized to the key type,
    the probabilities rounded to the value type), bit for bit: its double dots, exp, softmax
    and weighted sums reproduced in float pairs."""
    rng = np.random.default_rng(int(kt) * 17 + int(vt) + int(softcap))
    n_head, n_kv, hd, hv, rows = 4, 2, 64, 64, 72
    q = (rng.standard_normal((n_head, hd)) * 2).astype(np.float32)
    k = _cache_rows(ref, rng.standard_normal((rows, n_kv, hd)).astype(np.float32), kt)
    v = _cache_rows(ref, rng.standard_normal((rows, n_kv, hv)).astype(np.float32), vt)
    runs = [(0, 20), (25, 31), (60, 12)]
    got = gpu.attention(q, k, v, runs, 0.125, softcap, (kt, vt), (hd, hv), n_kv)
    kb, vb = k.shape[1] // n_kv, v.shape[1] // n_kv
    for h in range(n_head):
        g = h // (n_head // n_kv)
        want = ref.attention(
            q[h], k[:, g * kb : (g + 1) * kb], v[:, g * vb : (g + 1) * vb], runs, 0.125, softcap,
            types=(kt, vt), dims=(hd, hv),
        )  # fmt: skip
        assert_same_floats(got[h], want, f"head {h}")


# ---- a quantized cache's writes -------------------------------------------------------------


def _hadamard_reference(x: np.ndarray, block: int) -> np.ndarray:
    """simd/ref/ops.c's hadamard in numpy float32: scaled by 1 / sqrtf(block) first, then the
    butterflies (u + v, u - v) stage by stage, each a single float32 operation."""
    y = (x * (np.float32(1.0) / np.sqrt(np.float32(block)))).astype(np.float32)
    y = y.reshape(*x.shape[:-1], -1, block)
    length = 1
    while length < block:
        v = y.reshape(*y.shape[:-1], block // (2 * length), 2, length)
        a, b = v[..., 0, :].copy(), v[..., 1, :].copy()
        v[..., 0, :], v[..., 1, :] = a + b, a - b
        y = v.reshape(y.shape)
        length *= 2
    return y.reshape(x.shape)


@pytest.mark.parametrize("block", [64, 128, 256])
def test_hadamard_matches_the_reference_bit_for_bit(gpu, block):
    rng = np.random.default_rng(block)
    x = (rng.standard_normal((5, 512)) * 3).astype(np.float32)
    want = _hadamard_reference(x, block)
    assert_same_floats(gpu.hadamard(x, block).ravel(), want.ravel(), "hadamard")
    # rotating twice gives the rows back, to rounding: it is its own inverse
    np.testing.assert_allclose(gpu.hadamard(gpu.hadamard(x, block), block), x, atol=1e-5)


@pytest.mark.parametrize("t", CACHE_TYPES, ids=lambda t: t.name)
def test_cache_rows_are_written_as_the_cpu_writes_them(gpu, ref, t):
    """New keys and values into chosen rows of a cache, each row (two heads of 64) as the CPU's
    from_float stores it; the other rows untouched. Blocks with ties, zeros and a lone extreme
    test the quantizers' edges."""
    rng = np.random.default_rng(int(t))
    width, n_rows = 128, 9
    rb = row_bytes(t, width)
    x = (rng.standard_normal((4, width)) * [[1], [1e-3], [40], [1]]).astype(np.float32)
    x[3, :32] = 0.0  # an all-zero block
    x[3, 32:64] = np.float32(0.5)  # every value the extreme
    x[3, 64] = -7.0  # a negative extreme
    cache = rng.integers(0, 256, (n_rows, rb), dtype=np.uint8)
    rows = [6, 0, 3, 8]
    got = gpu.set_rows(t, x, rows, cache)
    want = cache.copy()
    for i, r in enumerate(rows):
        if t == GGMLType.F32:
            want[r] = x[i].view(np.uint8)
        elif t == GGMLType.F16:
            want[r] = x[i].astype(np.float16).view(np.uint8)
        else:
            want[r] = ref.from_float(t, x[i], rb)
    np.testing.assert_array_equal(got, want)
