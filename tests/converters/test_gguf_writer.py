"""edgeinfer.gguf.writer: what it writes reads back (through edgeinfer's reader and the
independent gguf-py one), what it refuses it refuses before writing, and a file appears
only when complete."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer import errors
from edgeinfer.converters import quantizers
from edgeinfer.gguf import GGUFFile
from edgeinfer.gguf.constants import GGMLType, ValueType
from edgeinfer.gguf.writer import GGUFWriter

V = ValueType


def _write(path, alignment=32, chunks=3):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 64)).astype(np.float32)
    b = rng.standard_normal((4, 256)).astype(np.float32)
    qb = quantizers.quantize(b, GGMLType.Q4_K)
    with GGUFWriter(path, alignment=alignment) as w:
        w.add_string("general.architecture", "llama")
        w.add_uint32("u32", 7)
        w.add_int32("i32", -7)
        w.add_float32("f32", 0.5)
        w.add_bool("flag", True)
        w.add("u64", V.UINT64, 2**40)
        w.add("f64", V.FLOAT64, 1e-300)
        w.add("i8", V.INT8, -128)
        w.add_array("ints", [1, 2, 3], V.INT32)
        w.add_array("floats", np.array([0.25, -1.0]), V.FLOAT32)
        w.add_array("bools", [True, False, True], V.BOOL)
        w.add_array("words", ["a", "", "日本", "\u2581x"], V.STRING)
        w.add_tensor_info("a", (64, 8), GGMLType.F32)
        w.add_tensor_info("b", (256, 4), GGMLType.Q4_K)
        w.write_header()
        w.write_tensor_data("a", np.array_split(a.reshape(-1), chunks))
        w.write_tensor_data("b", [qb])
    return a, qb


@pytest.mark.parametrize("alignment", [32, 64])
def test_round_trip(tmp_path, alignment):
    path = tmp_path / "t.gguf"
    a, qb = _write(path, alignment)
    with GGUFFile(path) as f:
        md = f.metadata
        assert md["general.architecture"] == "llama" and md["u32"] == 7 and md["i32"] == -7
        assert md["f32"] == 0.5 and md["flag"] is True and md["u64"] == 2**40 and md["i8"] == -128
        assert md["f64"] == 1e-300
        assert md["ints"].tolist() == [1, 2, 3] and md["floats"].tolist() == [0.25, -1.0]
        assert md["bools"].tolist() == [True, False, True]
        assert md["words"] == ["a", "", "日本", "\u2581x"]
        assert f.alignment == alignment
        assert f.tensors["a"].shape == (64, 8) and f.tensors["b"].ggml_type == GGMLType.Q4_K
        assert (f.tensor_data("a").view(np.float32).reshape(8, 64) == a).all()
        assert bytes(f.tensor_data("b")) == qb.tobytes()


def test_gguf_py_reads_it(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "t.gguf"
    a, _ = _write(path)
    r = gguf.GGUFReader(str(path))
    assert [t.name for t in r.tensors] == ["a", "b"]
    assert (np.asarray(r.tensors[0].data).reshape(8, 64) == a).all()
    assert r.fields["words"].contents() == ["a", "", "日本", "\u2581x"]


def test_file_size_is_known_before_writing(tmp_path):
    path = tmp_path / "t.gguf"
    w = GGUFWriter(path)
    w.add_string("k", "v")
    w.add_tensor_info("x", (32, 3), GGMLType.Q8_0)
    planned = w.file_size()
    w.write_header()
    w.write_tensor_data("x", [bytes(3 * 34)])
    w.commit()
    assert path.stat().st_size == planned


@pytest.mark.parametrize(
    "call, match",
    [(lambda w: w.add_uint32("k", -1), "uint32"), (lambda w: w.add_uint32("k", True), "uint32"),
     (lambda w: w.add_float32("k", float("nan")), "finite"), (lambda w: w.add_bool("k", 1), "bool"),
     (lambda w: w.add_string("k", 3), "string"),
     (lambda w: w.add_string("k", "a\ud800b"), "lone surrogate"),
     (lambda w: w.add_array("k", ["ok", "\udfff"], V.STRING), "lone surrogate"),
     (lambda w: w.add_array("k", [1, 2**40], V.INT32), "int32"),
     (lambda w: w.add_array("k", [[1]], V.ARRAY), "scalar"),
     (lambda w: w.add_string("", "v"), "key"),
     (lambda w: w.add_tensor_info("t", (33, 2), GGMLType.Q8_0), "blocks"),
     (lambda w: w.add_tensor_info("t", (0,), GGMLType.F32), "shape"),
     (lambda w: w.add_tensor_info("t" * 64, (4,), GGMLType.F32), "bytes"),
     (lambda w: w.add_tensor_info("t", (1, 1, 1, 1, 1), GGMLType.F32), "shape")],
)  # fmt: skip
def test_refusals(tmp_path, call, match):
    w = GGUFWriter(tmp_path / "t.gguf")
    with pytest.raises(errors.InvalidOptionError, match=match):
        call(w)


def test_duplicates(tmp_path):
    w = GGUFWriter(tmp_path / "t.gguf")
    w.add_string("k", "v")
    with pytest.raises(errors.DuplicateNameError):
        w.add_uint32("k", 1)
    w.add_tensor_info("t", (4,), GGMLType.F32)
    with pytest.raises(errors.DuplicateNameError):
        w.add_tensor_info("t", (4,), GGMLType.F32)


def test_misuse_while_writing_leaves_nothing(tmp_path):
    path = tmp_path / "t.gguf"
    with pytest.raises(errors.InvalidOptionError, match="bytes"), GGUFWriter(path) as w:
        w.add_tensor_info("t", (4,), GGMLType.F32)
        w.add_tensor_info("u", (4,), GGMLType.F32)
        w.write_header()
        with pytest.raises(errors.InvalidOptionError, match="order"):
            w.write_tensor_data("u", [bytes(16)])
        with pytest.raises(errors.InvalidOptionError, match="fixed"):
            w.add_string("late", "x")
        w.write_tensor_data("t", [bytes(20)])  # too many bytes
    assert list(tmp_path.iterdir()) == []


def test_incomplete_file_is_not_committed(tmp_path):
    path = tmp_path / "t.gguf"
    with pytest.raises(errors.InvalidOptionError, match="no data"), GGUFWriter(path) as w:
        w.add_tensor_info("t", (4,), GGMLType.F32)
        w.write_header()
    assert list(tmp_path.iterdir()) == []


def test_interrupt_removes_the_temporary_file(tmp_path):
    path = tmp_path / "t.gguf"
    path.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt), GGUFWriter(path) as w:
        w.add_tensor_info("t", (4,), GGMLType.F32)
        w.write_header()
        assert len(list(tmp_path.iterdir())) == 2  # the output and a hidden .part
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["t.gguf"] and path.read_bytes() == b"old"


def test_output_has_the_usual_mode(tmp_path):
    import os
    import stat

    path = tmp_path / "t.gguf"
    _write(path)
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
