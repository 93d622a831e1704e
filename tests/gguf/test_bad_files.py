"""Hostile GGUF files: every corruption gives a typed error, fast, with bounded memory."""

from __future__ import annotations

import struct
import time
import tracemalloc

import numpy as np
import pytest

from edgeinfer import errors
from edgeinfer.gguf import GGUFFile
from edgeinfer.models import config_from_gguf
from tests.gguf.craft import ARRAY, F32, STRING, U8, U32, U64, Tensor, tiny_llama_spec

HANG = 30.0  # seconds: a hang, not a speed bar


def _open(tmp_path, data: bytes, name: str = "m.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    t0 = time.perf_counter()
    tracemalloc.start()
    try:
        with GGUFFile(p) as f:
            config_from_gguf(f)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        elapsed = time.perf_counter() - t0
        assert elapsed < HANG, f"took {elapsed:.2f} s"
        assert peak < 64 << 20, f"allocated {peak >> 20} MB"


def _expect(tmp_path, data: bytes, error: type, match: str | None = None) -> str:
    with pytest.raises(error, match=match) as e:
        _open(tmp_path, data)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_valid_file_loads(tmp_path):
    _open(tmp_path, tiny_llama_spec().build())


def test_bad_magic(tmp_path):
    data = tiny_llama_spec().build()
    _expect(tmp_path, b"GGML" + data[4:], errors.BadMagicError, "magic")
    _expect(tmp_path, b"\x7fELF" + data[4:], errors.BadMagicError)


@pytest.mark.parametrize("version", [0, 1, 4, 0x03000000])
def test_unsupported_version(tmp_path, version):
    spec = tiny_llama_spec()
    spec.version = version
    msg = _expect(tmp_path, spec.build(), errors.UnsupportedVersionError, "version")
    if version == 0x03000000:
        assert "big-endian" in msg


def test_empty_and_tiny_files(tmp_path):
    _expect(tmp_path, b"", errors.TruncatedFileError)
    _expect(tmp_path, b"GG", errors.TruncatedFileError)
    _expect(tmp_path, b"GGUF\x03\x00", errors.TruncatedFileError)


def test_every_truncation_point_is_a_typed_error(tmp_path):
    data = tiny_llama_spec().build()
    header_end = GGUFFile_header_size(tmp_path, data)
    cuts = list(range(4, header_end, 7)) + [header_end + 5, len(data) - 1, len(data) // 2]
    for cut in cuts:
        with pytest.raises(errors.ModelFileError) as e:
            _open(tmp_path, data[:cut])
        assert isinstance(e.value, (errors.TruncatedFileError, errors.TensorOutOfBoundsError,
                                    errors.AbsurdValueError)), (cut, e.value)  # fmt: skip


def GGUFFile_header_size(tmp_path, data: bytes) -> int:
    p = tmp_path / "full.gguf"
    p.write_bytes(data)
    with GGUFFile(p) as f:
        return f.data_offset


def test_tensor_data_out_of_bounds(tmp_path):
    spec = tiny_llama_spec()
    spec.tensors[-1].offset = 1 << 40
    _expect(tmp_path, spec.build(), errors.TensorOutOfBoundsError, "ffn_down")
    # a truncated data section is caught the same way
    data = tiny_llama_spec().build()
    _expect(tmp_path, data[:-100], errors.TensorOutOfBoundsError, "beyond the end")


def test_misaligned_offset(tmp_path):
    spec = tiny_llama_spec()
    spec.tensors[1].offset = 32 * 1000 + 4
    _expect(tmp_path, spec.build(), errors.MisalignedTensorError, "alignment")


def test_bad_alignment_value(tmp_path):
    spec = tiny_llama_spec()
    spec.add("general.alignment", U32, 24)
    _expect(tmp_path, spec.build(), errors.AbsurdValueError, "power of two")


@pytest.mark.parametrize("field", ["n_kv", "n_tensors"])
def test_absurd_counts(tmp_path, field):
    spec = tiny_llama_spec()
    setattr(spec, field, 1 << 60)
    _expect(tmp_path, spec.build(), errors.AbsurdValueError, "count")


def test_absurd_string_and_array_lengths(tmp_path):
    data = tiny_llama_spec().build()
    # the first key's length field sits right after the 24-byte header
    huge = data[:24] + struct.pack("<Q", 1 << 62) + data[32:]
    _expect(tmp_path, huge, errors.AbsurdValueError, "length")
    spec = tiny_llama_spec()
    spec.add("general.tags", ARRAY, (U8, []))
    blob = spec.build()
    # rewrite that array's element count (u32 type + u64 count follow the key and its type)
    key = b"general.tags"
    at = blob.index(key) + len(key) + 4 + 4
    blob = blob[:at] + struct.pack("<Q", 1 << 61) + blob[at + 8 :]
    _expect(tmp_path, blob, errors.AbsurdValueError, "general.tags")
    spec = tiny_llama_spec()
    spec.kv[1] = ("general.name", STRING, "x")
    blob = spec.build()
    at = blob.index(b"general.name") + len(b"general.name") + 4
    blob = blob[:at] + struct.pack("<Q", 1 << 50) + blob[at + 8 :]
    _expect(tmp_path, blob, errors.AbsurdValueError, "general.name")


def test_absurd_dimensions(tmp_path):
    spec = tiny_llama_spec()
    spec.tensors[0] = Tensor("token_embd.weight", (1 << 40, 1 << 40), 0, b"")
    _expect(tmp_path, spec.build(), errors.AbsurdValueError, "token_embd")
    spec = tiny_llama_spec()
    spec.tensors[0] = Tensor("token_embd.weight", (1,) * 9, 0, b"")
    _expect(tmp_path, spec.build(), errors.AbsurdValueError, "dimensions")


def test_duplicate_names(tmp_path):
    spec = tiny_llama_spec()
    spec.add("general.name", STRING, "again")
    _expect(tmp_path, spec.build(), errors.DuplicateNameError, "general.name")
    spec = tiny_llama_spec()
    spec.tensors.append(spec.tensors[3])
    _expect(tmp_path, spec.build(), errors.DuplicateNameError, spec.tensors[3].name)


def test_unknown_tensor_type(tmp_path):
    spec = tiny_llama_spec()
    spec.tensors[1].ggml_type = 99
    _expect(tmp_path, spec.build(), errors.UnknownTensorTypeError, "type code 99")


def test_known_type_the_engines_cannot_run(tmp_path):
    spec = tiny_llama_spec()
    t = spec.tensors[2]  # blk.0.attn_norm.weight, 32 floats
    spec.tensors[2] = Tensor(t.name, (256,), 16, b"\0" * 66)  # IQ2_XXS: one block
    _expect(tmp_path, spec.build(), errors.MissingTensorError)  # wrong shape is caught first
    spec = tiny_llama_spec()
    emb = spec.tensors[0]
    spec.tensors[0] = Tensor(emb.name, emb.shape, 20, b"\0" * (emb.shape[1] * 18))  # IQ4_NL
    _expect(tmp_path, spec.build(), errors.UnknownTensorTypeError, "IQ4_NL")


def test_unknown_value_type(tmp_path):
    blob = tiny_llama_spec().build()
    at = blob.index(b"general.name") + len(b"general.name")
    blob = blob[:at] + struct.pack("<I", 77) + blob[at + 4 :]
    _expect(tmp_path, blob, errors.UnknownValueTypeError, "77")


def test_unknown_architecture(tmp_path):
    spec = tiny_llama_spec()
    spec.kv[0] = ("general.architecture", STRING, "mamba9")
    _expect(tmp_path, spec.build(), errors.UnknownArchitectureError, "mamba9")


@pytest.mark.parametrize("key", ["llama.embedding_length", "llama.block_count",
                                 "llama.attention.head_count", "general.architecture"])  # fmt: skip
def test_missing_required_key(tmp_path, key):
    spec = tiny_llama_spec()
    spec.kv = [kv for kv in spec.kv if kv[0] != key]
    _expect(tmp_path, spec.build(), errors.MissingKeyError, key)


def test_wrong_key_type(tmp_path):
    spec = tiny_llama_spec()
    spec.kv = [
        (k, STRING, "640") if k == "llama.embedding_length" else (k, t, v) for k, t, v in spec.kv
    ]
    _expect(tmp_path, spec.build(), errors.MissingKeyError, "integer")


def test_missing_and_misshapen_tensors(tmp_path):
    spec = tiny_llama_spec()
    spec.tensors = [t for t in spec.tensors if t.name != "blk.0.ffn_up.weight"]
    _expect(tmp_path, spec.build(), errors.MissingTensorError, "ffn_up")
    spec = tiny_llama_spec()
    spec.tensors[3] = Tensor("blk.0.attn_q.weight", (32, 31), 0, b"\0" * 32 * 31 * 4)
    _expect(tmp_path, spec.build(), errors.MissingTensorError, "shape")


def test_nonsense_hyperparameters(tmp_path):
    spec = tiny_llama_spec()
    spec.kv = [
        (k, U32, 3) if k == "llama.attention.head_count_kv" else (k, t, v) for k, t, v in spec.kv
    ]
    _expect(tmp_path, spec.build(), errors.AbsurdValueError, "KV groups")
    spec = tiny_llama_spec()
    spec.kv = [(k, U64, 1 << 40) if k == "llama.block_count" else (k, t, v) for k, t, v in spec.kv]
    _expect(tmp_path, spec.build(), errors.AbsurdValueError, "block_count")
    spec = tiny_llama_spec()
    spec.kv = [
        (k, F32, float("nan")) if k == "llama.rope.freq_base" else (k, t, v) for k, t, v in spec.kv
    ]
    _expect(tmp_path, spec.build(), errors.AbsurdValueError, "freq_base")
    for factor in (1e-40, 0.0, float("inf")):  # a subnormal factor made 1/factor inf
        spec = tiny_llama_spec()
        spec.kv += [("llama.rope.scaling.type", STRING, "linear"),
                    ("llama.rope.scaling.factor", F32, factor)]  # fmt: skip
        _expect(tmp_path, spec.build(), errors.AbsurdValueError, "rope.scaling.factor|rope scaling")


def test_directory_and_missing_path(tmp_path):
    with pytest.raises(errors.ModelFileError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(errors.ModelFileError, match="directory"):
        GGUFFile(tmp_path)


def test_random_byte_flips_never_crash(tmp_path):
    data = bytearray(tiny_llama_spec().build())
    with GGUFFile_from(tmp_path, bytes(data)) as f:
        header = f.data_offset
    rng = np.random.default_rng(1234)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(300):
        corrupt = bytearray(data)
        for pos in rng.integers(0, header, size=rng.integers(1, 4)):
            corrupt[pos] = int(rng.integers(0, 256))
        try:
            _open(tmp_path, bytes(corrupt))
            outcomes["ok"] += 1
        except errors.EdgeInferError:
            outcomes["error"] += 1
    assert outcomes["error"] > 50  # the corruption really reached the parser


def GGUFFile_from(tmp_path, data: bytes) -> GGUFFile:
    p = tmp_path / "src.gguf"
    p.write_bytes(data)
    return GGUFFile(p)


def test_data_is_not_copied_at_load(tmp_path):
    spec = tiny_llama_spec()
    spec.tensors.append(Tensor("extra.weight", (1024, 1024), 0, b"\1" * (4 << 20)))
    p = tmp_path / "big.gguf"
    p.write_bytes(spec.build())
    tracemalloc.start()
    with GGUFFile(p) as f:
        view = f.tensor_data("extra.weight")
        _, peak = tracemalloc.get_traced_memory()
        assert view.nbytes == 4 << 20 and view[0] == 1
        assert not view.flags.owndata and not view.flags.writeable
        del view
    tracemalloc.stop()
    assert peak < 1 << 20


def _block_count(spec, n: int):
    spec.kv = [(k, U32, n) if k == "llama.block_count" else (k, t, v) for k, t, v in spec.kv]
    return spec


def test_layers_beyond_block_count_are_refused(tmp_path):
    spec = _block_count(tiny_llama_spec(n_layer=3), 1)
    msg = _expect(tmp_path, spec.build(), errors.UnusedTensorError, "'blk.1.attn_norm.weight'")
    assert "block_count is 1" in msg
    # one stray tensor of a later layer is enough, whatever its name and position
    spec = tiny_llama_spec(n_layer=1)
    spec.add_f32_tensor("blk.7.extra.weight", np.ones(32))
    _expect(tmp_path, spec.build(), errors.UnusedTensorError, "'blk.7.extra.weight'")
    spec = tiny_llama_spec(n_layer=1)
    spec.add_f32_tensor("blk." + "9" * 5000 + ".weight", np.ones(32))  # past int()'s digits
    _expect(tmp_path, spec.build(), errors.UnusedTensorError, "block_count is 1")


def test_only_layer_numbers_past_block_count_count(tmp_path):
    spec = tiny_llama_spec(n_layer=2)
    for name in ("blk.1.extra.weight", "blk.x.weight", "blkfoo.2.weight", "xblk.5.weight"):
        spec.add_f32_tensor(name, np.ones(32))
    _open(tmp_path, spec.build())


def test_real_files_have_no_unused_layers(gemma_path, fixture_models):
    for path in [gemma_path, *fixture_models.values()]:
        with GGUFFile(path) as f:
            cfg = config_from_gguf(f)
            assert cfg.n_layer == f.metadata[f"{cfg.arch}.block_count"]


@pytest.mark.parametrize("values", [[float("nan")], [float("inf")], [2.5]])
def test_per_layer_values_must_be_integers(tmp_path, values):
    # a float array made int() raise ValueError (NaN) or OverflowError (inf), or cut 2.5 to 2
    spec = tiny_llama_spec()
    key = "llama.attention.head_count_kv"
    spec.kv = [(k, ARRAY, (F32, values)) if k == key else (k, t, v) for k, t, v in spec.kv]
    _expect(tmp_path, spec.build(), errors.MissingKeyError, "should be integers")
