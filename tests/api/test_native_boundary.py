"""The boundary between Python and the native library (edgeinfer/_native.py): the library is
used only when its API version, the size of every struct Python mirrors and its layer tensor
order all match, and each refusal says why and where the library was looked for. Also the C
API's own promises: cache types it cannot read are refused with a status, and clearing a
sequence frees its cache."""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest

import edgeinfer
from edgeinfer import _native, errors
from edgeinfer.gguf import GGUFFile
from edgeinfer.gguf.constants import GGMLType
from edgeinfer.kv_cache import CacheType
from edgeinfer.models import config_from_gguf
from edgeinfer.models.base import LayerTensors

if not _native.available()[0]:
    pytest.skip(f"native library unavailable: {_native.available()[1]}", allow_module_level=True)

UNSUPPORTED = 3  # EI_ERR_UNSUPPORTED
INVALID = 1  # EI_ERR_INVALID


@pytest.fixture
def reload(monkeypatch):
    """Lets a test change what the loader compares against, then load afresh; afterwards
    every change is undone and the real library is loaded again."""
    _native.reset_for_tests()
    yield monkeypatch
    monkeypatch.undo()
    _native.reset_for_tests()
    assert _native.available() == (True, "loaded")


def test_the_built_library_matches_every_mirrored_struct():
    lib = _native.library()
    for which, struct in enumerate(_native._STRUCTS):
        assert lib.ei_struct_size(which) == ctypes.sizeof(struct), struct.__name__
    assert lib.ei_struct_size(len(_native._STRUCTS)) == 0  # no struct the mirror lacks
    assert _native.library_path_looked_for().exists()


def test_layer_tensors_come_from_one_list():
    lib = _native.library()
    names = [lib.ei_layer_tensor_name(i).decode() for i in range(len(_native._LAYER_TENSORS))]
    assert lib.ei_layer_tensor_name(len(names)) is None
    assert names == [f.name for f in dataclasses.fields(LayerTensors)]
    assert [f[0] for f in _native.LayerDesc._fields_][: len(names)] == names


def test_a_struct_of_another_size_is_refused(reload):
    class EngineParamsWithExtraField(ctypes.Structure):
        _fields_ = [*_native.EngineParams._fields_, ("extra", ctypes.c_int64)]

    structs = list(_native._STRUCTS)
    structs[structs.index(_native.EngineParams)] = EngineParamsWithExtraField
    reload.setattr(_native, "_STRUCTS", tuple(structs))
    ok, why = _native.available()
    native = ctypes.sizeof(_native.EngineParams)
    assert not ok
    assert f"EngineParamsWithExtraField is {native} bytes" in why
    assert f"mirror is {ctypes.sizeof(EngineParamsWithExtraField)}" in why
    assert str(_native.library_path_looked_for()) in why
    with pytest.raises(errors.BackendError, match="EngineParamsWithExtraField"):
        _native.library()


def test_another_api_version_is_refused(reload):
    reload.setattr(_native, "API_VERSION", _native.API_VERSION + 1)
    ok, why = _native.available()
    assert not ok and f"API version {_native.API_VERSION - 1}" in why


def test_another_layer_tensor_order_is_refused(reload):
    reload.setattr(_native, "_LAYER_TENSORS", tuple(reversed(_native._LAYER_TENSORS)))
    ok, why = _native.available()
    assert not ok and "layer tensors" in why


def test_an_empty_folder_gives_a_clear_reason(reload, tmp_path):
    reload.setenv(_native.NATIVE_DIR_ENV, str(tmp_path))
    ok, why = _native.available()
    assert not ok
    looked_for = _native.library_path_looked_for()
    assert looked_for.parent == tmp_path and looked_for.name.startswith("_edgeinfer_native")
    assert why == f"the native library was not built: no {looked_for.name} in {tmp_path}"


def test_attention_on_a_cache_type_it_cannot_read_is_a_status():
    lib = _native.library()
    q = np.ones(32, np.float32)
    rows = np.zeros((4, 64), np.uint8)  # wider than a Q5_0 or F16 row of 32 values
    out = np.zeros(32, np.float32)
    runs = np.array([0, 4], np.int32)  # rows [0, 4)
    for k_type, v_type in ((GGMLType.Q5_0, GGMLType.F16), (GGMLType.F16, GGMLType.Q5_0)):
        status = lib.ei_kernel_attn(
            0, 32, 32, 1, runs.ctypes.data, int(k_type), int(v_type), 64, 64, 1.0, 0.0,
            q.ctypes.data, rows.ctypes.data, rows.ctypes.data, out.ctypes.data,
        )  # fmt: skip
        assert status == UNSUPPORTED
        assert "attention reads no cache" in lib.ei_last_error().decode()


def test_a_cache_type_the_engine_lacks_is_an_option_error(fixture_models):
    q5 = CacheType("q5_0", GGMLType.Q5_0)  # a GGML type, not a cache type of the engine
    with pytest.raises(errors.InvalidOptionError, match=r"unknown kv_type 'q5_0'"):
        edgeinfer.load(fixture_models["llama"], engine="native", kv_type="q5_0")
    why = (
        r"cache_type_v q5_0 is not supported by the native engine "
        r"\(one of f16, f32, q8_0, q4_0, kivi4, kivi2\)"
    )
    with (
        GGUFFile(fixture_models["llama"]) as gguf,
        pytest.raises(errors.InvalidOptionError, match=why),
    ):
        _native.NativeEngine(gguf, config_from_gguf(gguf), 16, n_threads=1, cache_type_v=q5)


def _run(lib, handle, tokens: list[int], n_vocab: int, seq: int = 0) -> np.ndarray:
    """Logits of every token, decoded on sequence seq from position 0."""
    n = len(tokens)
    tok = np.asarray(tokens, np.int32)
    pos, seqs, mask = np.arange(n, dtype=np.int32), np.full(n, seq, np.int32), np.ones(n, np.int8)
    logits = np.zeros((n, n_vocab), np.float32)
    _native.check(lib.ei_engine_decode(
        handle, n, tok.ctypes.data, pos.ctypes.data, seqs.ctypes.data, mask.ctypes.data,
        logits.ctypes.data,
    ))  # fmt: skip
    return logits


def test_clearing_a_sequence_frees_its_cache(fixture_models):
    lib = _native.library()
    path = fixture_models["llama"]
    with edgeinfer.load(path, engine="native", n_ctx=64) as used, \
            edgeinfer.load(path, engine="native", n_ctx=64) as fresh:  # fmt: skip
        handle, n_vocab = used._engine._handle, used._engine.cfg.n_vocab
        before = lib.ei_engine_memory(handle)
        _run(lib, handle, [5, 9, 11, 3, 7, 2], n_vocab)
        assert lib.ei_engine_memory(handle) > before  # the cache was allocated
        _native.check(lib.ei_engine_seq_clear(handle, 0))
        assert lib.ei_engine_memory(handle) == before
        again = _run(lib, handle, [8, 4, 6], n_vocab)
        want = _run(lib, fresh._engine._handle, [8, 4, 6], n_vocab)
        np.testing.assert_array_equal(again, want)
        assert lib.ei_engine_seq_clear(handle, 1) == INVALID  # n_seq_max is 1
