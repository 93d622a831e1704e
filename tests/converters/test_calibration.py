"""--calib: activation statistics from edgeinfer's own engine on the source model; they
reach the quantizers exactly as llama.cpp's importance matrix does (byte-identical files),
lower the activation-weighted error, and steer the fitter."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from edgeinfer.converters.calibration import ActivationStats, collect_stats
from edgeinfer.converters.convert import Conversion, ConvertOptions, convert, plan_conversion
from edgeinfer.converters.fitting import quantization_error, sample_rows
from edgeinfer.gguf import GGUFFile
from tests.converters.conftest import ggml_quantize  # noqa: F401 (a fixture)
from tests.e2e.parity import PROMPTS

CALIB_TEXT = "\n\n".join(PROMPTS * 2)


@pytest.fixture(scope="module")
def stats(checkpoints):
    return collect_stats(Conversion(checkpoints["llama"]), CALIB_TEXT, max_tokens=600, n_ctx=256)


def test_every_matrix_has_statistics(stats, checkpoints):
    conv = Conversion(checkpoints["llama"])
    for t in conv.tensors:
        if t.is_matrix and t.name != "token_embd.weight":  # a lookup, not a product
            imp = stats.importance(t.name, t.row_length)
            assert imp is not None and imp.shape == (t.row_length,) and (imp > 0).all(), t.name
    assert stats.counts["blk.0.attn_q.weight"] == 600


def test_saved_statistics_round_trip(stats, tmp_path, checkpoints, out_dir):
    path = tmp_path / "stats.npz"
    stats.save(path)
    back = ActivationStats.load(path)
    assert back.counts == stats.counts
    assert all((back.sums[k] == v).all() for k, v in stats.sums.items())
    text = tmp_path / "calib.txt"
    text.write_text(CALIB_TEXT)
    a = plan_conversion(
        checkpoints["llama"], ConvertOptions(calib=path, max_memory=6_000_000, n_ctx=64)
    )
    assert a.total_bytes <= 6_000_000


def test_calibrated_quantization_is_llama_cpps_imatrix_path(
    stats, checkpoints, converted, tmp_path
):
    """Our calibrated q4_k_m equals llama-quantize given the same importance matrix."""
    import llama_cpp

    path = tmp_path / "stats.npz"
    stats.save(path)
    ours = tmp_path / "ours.gguf"
    convert(checkpoints["llama"], ours, ConvertOptions(type="q4_k_m", calib=path))
    names = sorted(stats.sums)
    arrays = [
        np.ascontiguousarray(stats.sums[n] / stats.counts[n], dtype=np.float32) for n in names
    ]
    entries = (llama_cpp.llama_model_imatrix_data * (len(names) + 1))()
    for e, n, a in zip(entries, names, arrays, strict=False):
        e.name, e.data, e.size = (
            n.encode(),
            a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            a.size,
        )
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = 15, 1
    params.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    theirs = tmp_path / "ggml.gguf"
    rc = llama_cpp.llama_model_quantize(
        str(converted("llama", "f32")).encode(), str(theirs).encode(), ctypes.byref(params)
    )
    assert rc == 0
    with (
        GGUFFile(ours) as a,
        GGUFFile(theirs) as b,
        GGUFFile(converted("llama", "q4_k_m")) as plain,
    ):
        for name in b.tensors:
            assert bytes(a.tensor_data(name)) == bytes(b.tensor_data(name)), name
        differs = [n for n in b.tensors if bytes(a.tensor_data(n)) != bytes(plain.tensor_data(n))]
        assert "blk.0.attn_q.weight" in differs  # the statistics did change the quantization


def test_calibration_lowers_the_weighted_error(stats, checkpoints):
    from edgeinfer import quants
    from edgeinfer.converters import quantizers

    conv = Conversion(checkpoints["llama"])
    t = next(t for t in conv.tensors if t.name == "blk.1.ffn_down.weight")
    imp = stats.importance(t.name, t.row_length)
    rows = sample_rows(t, 10_000)
    s = imp.astype(np.float64)

    def weighted(raw):
        back = quants.dequantize(raw.reshape(-1), quants.GGMLType.Q4_K, rows.shape)
        return float(((back - rows) ** 2 @ s).sum())

    plain = weighted(quantizers.quantize(rows, quants.GGMLType.Q4_K))
    guided = weighted(quantizers.quantize(rows, quants.GGMLType.Q4_K, weights=imp))
    assert guided < plain
    assert quantization_error(rows, quants.GGMLType.Q4_K, imp) == pytest.approx(
        guided / float((rows**2 @ s).sum()), rel=1e-6
    )


def test_calibration_from_a_text_file(checkpoints, tmp_path, out_dir):
    text = tmp_path / "calib.txt"
    text.write_text(CALIB_TEXT)
    options = ConvertOptions(calib=text, calib_tokens=300, max_memory=5_000_000, n_ctx=64)
    plan = convert(checkpoints["qwen2"], out_dir / "m.gguf", options)
    assert plan.total_bytes <= 5_000_000
    assert sorted(p.name for p in out_dir.iterdir()) == ["m.gguf"]  # the F16 copy is gone
