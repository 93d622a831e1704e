"""Mistral's sliding window survives conversion and every engine attends through it.

The checkpoint is the mistral one of checkpoints.py with ``sliding_window`` 8 (the same random
weights as the cached windowless one) and the prompt six windows long. The reference is
transformers' MistralForCausalLM with eager attention, which masks keys more than the window
behind the query; the windowless checkpoint shows the window changes the logits beyond it,
so a file or an engine that dropped the window fails the comparison. llama.cpp reads no
window for GGUF ``llama`` files: the file must still load there and mean what it did before.
"""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from edgeinfer import errors as ei_errors
from edgeinfer.converters import errors
from edgeinfer.converters.architectures.base import kv
from edgeinfer.converters.architectures.llama import LlamaConverter, MistralConverter
from edgeinfer.gguf import GGUFFile, ValueType
from edgeinfer.models import config_from_gguf
from tests.converters.checkpoints import SPECS, write_checkpoint
from tests.converters.conftest import hf_logits, prompt_tokens
from tests.converters.test_bad_inputs import edit_json
from tests.e2e.parity import compare

WINDOW = 8
N_TOKENS = 6 * WINDOW
KEY = "llama.attention.sliding_window"
EXACT_KL_BAR = 1e-7  # test_hf_parity's bar for F32 files and an F32 cache


@pytest.fixture(scope="module")
def windowed(vocabs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("swa") / "mistral-swa"
    config = {**SPECS["mistral"].config, "sliding_window": WINDOW}
    return write_checkpoint(folder, "mistral", vocabs, config=config)


@pytest.fixture(scope="module")
def windowed_gguf(windowed, tmp_path_factory):
    from edgeinfer.converters.convert import ConvertOptions, convert

    path = tmp_path_factory.mktemp("swa-gguf") / "mistral-swa-f32.gguf"
    convert(windowed, path, ConvertOptions(type="f32"))
    return path


@pytest.fixture(scope="module")
def tokens(windowed_gguf):
    with GGUFFile(windowed_gguf) as f:
        return prompt_tokens(len(f.metadata["tokenizer.ggml.tokens"]), N_TOKENS)


@pytest.fixture(scope="module")
def hf_windowed(windowed, tokens):
    pytest.importorskip("transformers")
    return hf_logits(windowed, tokens)


@pytest.fixture(scope="module")
def hf_full(checkpoints, tokens):
    pytest.importorskip("transformers")
    return hf_logits(checkpoints["mistral"], tokens)


def _logits(path, engine: str, tokens: list[int]) -> np.ndarray:
    with edgeinfer.load(path, n_ctx=128, engine=engine, kv_type="f32") as model:
        return model.logits(tokens)


# --- the file and its config --------------------------------------------------------------


def test_the_window_is_written_and_read_back(windowed_gguf):
    with GGUFFile(windowed_gguf) as f:
        assert f.metadata[KEY] == WINDOW
        assert f.metadata_types[KEY] == ValueType.UINT32
        assert "llama.attention.sliding_window_pattern" not in f.metadata
        cfg = config_from_gguf(f)
    assert cfg.sliding_window == WINDOW
    for il in range(cfg.n_layer):
        assert cfg.layer_window(il) == WINDOW
        # the layers keep the file's rotary base and scaling (not Gemma's local-layer ones)
        assert cfg.layer_rope_base(il) == cfg.rope_base == 1000000.0
        assert cfg.layer_rope_scale(il) == cfg.rope_freq_scale == 1.0
    with edgeinfer.load(windowed_gguf, engine="reference") as model:
        assert model.config.sliding_window == WINDOW


def test_a_windowless_mistral_file_has_full_attention(converted):
    with GGUFFile(converted("mistral", "f32")) as f:
        assert KEY not in f.metadata
        cfg = config_from_gguf(f)
    assert cfg.sliding_window == 0
    assert all(cfg.layer_window(il) == 0 for il in range(cfg.n_layer))


# --- logits against transformers ----------------------------------------------------------


def test_the_window_changes_the_reference_beyond_its_length(hf_windowed, hf_full):
    """Without this, the comparisons below could not tell a window from none."""
    np.testing.assert_allclose(hf_windowed[:WINDOW], hf_full[:WINDOW], rtol=0, atol=1e-4)
    kl, _, _ = compare(hf_full[2 * WINDOW :], hf_windowed[2 * WINDOW :])
    assert kl > 1000 * EXACT_KL_BAR, kl


@pytest.mark.parametrize("engine", ["reference", "native"])
def test_logits_match_transformers_through_the_window(windowed_gguf, tokens, hf_windowed, engine):
    ours = _logits(windowed_gguf, engine, tokens)
    kl, top1, kl_max = compare(hf_windowed, ours)
    print(f"{engine}: mean KL {kl:.3e}, max {kl_max:.3e}, top-1 {top1:.3f}")
    assert kl < EXACT_KL_BAR and top1 >= 0.95


def test_engines_agree_bit_for_bit_and_decode_through_the_window(windowed_gguf, tokens):
    """One token at a time (decode) reads the cache past the window as the prompt does."""
    ref = _logits(windowed_gguf, "reference", tokens)
    with edgeinfer.load(windowed_gguf, n_ctx=128, engine="native", kv_type="f32") as nat:
        np.testing.assert_array_equal(nat.logits(tokens), ref)
        nat._engine.truncate(0)
        stepped = np.stack([nat._engine.forward([t]) for t in tokens])
    np.testing.assert_array_equal(stepped, ref)


def test_the_windowless_file_differs_beyond_the_window(windowed_gguf, converted, tokens):
    full = _logits(converted("mistral", "f32"), "reference", tokens)
    ours = _logits(windowed_gguf, "reference", tokens)
    np.testing.assert_allclose(ours[:WINDOW], full[:WINDOW], rtol=0, atol=1e-4)
    kl, _, _ = compare(full[2 * WINDOW :], ours[2 * WINDOW :])
    assert kl > 1000 * EXACT_KL_BAR, kl


def test_llama_cpp_ignores_the_key_as_it_always_has(windowed_gguf, converted, tokens, hf_full):
    """llama.cpp's ``llama`` loader reads no window: the file loads and attends to the whole
    context, bit for bit as the windowless file does (and as transformers without a window)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from tests.conftest import llama_cpp_model
    from tests.e2e.parity import llama_cpp_logits

    f32 = llama_cpp.GGML_TYPE_F32
    got = []
    for path in (windowed_gguf, converted("mistral", "f32")):
        llm = llama_cpp_model(path, n_ctx=128, type_k=f32, type_v=f32)
        try:
            got.append(llama_cpp_logits(llm, tokens))
        finally:
            llm.close()
    np.testing.assert_array_equal(got[0], got[1])
    kl, _, _ = compare(hf_full, got[0])
    assert kl < EXACT_KL_BAR, kl


@pytest.fixture(scope="module")
def windowed_onnx(windowed, tmp_path_factory):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from edgeinfer.converters.convert import ConvertOptions, convert

    out = tmp_path_factory.mktemp("swa-onnx") / "mistral-swa"
    convert(windowed, out, ConvertOptions(type="f32", format="onnx", kv_type="f32", n_ctx=128))
    return out


def test_the_onnx_export_attends_through_the_window(windowed_onnx, tokens, hf_windowed):
    """GroupQueryAttention with ``local_window_size``, as a whole prompt (onnxruntime alone)
    and one token at a time through edgeinfer's onnxruntime engine (the cache past the window)."""
    from tests.converters.onnx_support import ort_logits

    with edgeinfer.load(windowed_onnx, n_ctx=128) as model:
        stepped = np.stack([model._engine.forward([t]) for t in tokens])
    for ours in (ort_logits(windowed_onnx, tokens), stepped):
        kl, top1, _ = compare(hf_windowed, ours)
        assert kl < EXACT_KL_BAR and top1 >= 0.95, (kl, top1)


# --- what the converter keeps and refuses -------------------------------------------------


@pytest.mark.parametrize("window", [None, 32768, 40000])
def test_no_window_or_one_past_the_context_is_full_attention(copy_checkpoint, window):
    from edgeinfer.converters.convert import Conversion

    src = copy_checkpoint("mistral")
    edit_json(src / "config.json", sliding_window=window)
    conversion = Conversion(src)
    assert KEY not in {item[0] for item in conversion.metadata(0)}
    assert not any("sliding_window" in n for n in conversion.notes)


@pytest.mark.parametrize("window", [-1, 0, 8.5, "8", True, [8]])
def test_bad_windows_are_refused(copy_checkpoint, window):
    from edgeinfer.converters.convert import Conversion

    src = copy_checkpoint("mistral")
    edit_json(src / "config.json", sliding_window=window)
    with pytest.raises(errors.BadConfigError, match="sliding_window"):
        Conversion(src)


def test_llama_checkpoints_do_not_read_the_window(copy_checkpoint):
    """LlamaForCausalLM has no window in transformers: a stray key changes nothing."""
    from edgeinfer.converters.convert import Conversion

    src = copy_checkpoint("llama")
    edit_json(src / "config.json", sliding_window=WINDOW)
    assert KEY not in {item[0] for item in Conversion(src).metadata(0)}


# --- what the runtime accepts from other writers ------------------------------------------


def _file_with(monkeypatch, tmp_path, checkpoints, *items) -> GGUFFile:
    """The windowless mistral file with ``items`` added to its llama metadata."""
    from edgeinfer.converters.convert import ConvertOptions, convert

    def metadata(self):
        return LlamaConverter.metadata(self) + list(items)

    monkeypatch.setattr(MistralConverter, "metadata", metadata)
    path = tmp_path / "edited.gguf"
    convert(checkpoints["mistral"], path, ConvertOptions(type="f32"))
    return GGUFFile(path)


@pytest.mark.parametrize(
    ("item", "error", "match"),
    [(kv(KEY, ValueType.INT32, -1), ei_errors.AbsurdValueError, "out of range"),
     (kv(KEY, ValueType.FLOAT32, 8.0), ei_errors.MissingKeyError, "should be an integer"),
     (kv(KEY, ValueType.STRING, "8"), ei_errors.MissingKeyError, "should be an integer"),
     (kv(KEY, ValueType.BOOL, True), ei_errors.MissingKeyError, "should be an integer")],
)  # fmt: skip
def test_bad_window_values_are_typed_errors(monkeypatch, tmp_path, checkpoints, item, error, match):
    with (
        _file_with(monkeypatch, tmp_path, checkpoints, item) as f,
        pytest.raises(error, match=match),
    ):
        config_from_gguf(f)


@pytest.mark.parametrize("window", [0, 32768, 1 << 20])
def test_a_zero_window_or_one_past_the_context_is_full_attention(
    monkeypatch, tmp_path, checkpoints, window
):
    with _file_with(monkeypatch, tmp_path, checkpoints, kv(KEY, ValueType.UINT32, window)) as f:
        assert config_from_gguf(f).sliding_window == 0


def test_a_pattern_must_slide_on_every_layer(monkeypatch, tmp_path, checkpoints):
    window = kv(KEY, ValueType.UINT32, WINDOW)
    pattern_key = "llama.attention.sliding_window_pattern"
    every = kv(pattern_key, ValueType.ARRAY, [True, True], ValueType.BOOL)
    with _file_with(monkeypatch, tmp_path, checkpoints, window, every) as f:
        assert config_from_gguf(f).sliding_window == WINDOW
    some = kv(pattern_key, ValueType.ARRAY, [True, False], ValueType.BOOL)
    refused = pytest.raises(ei_errors.UnsupportedModelError, match="every layer")
    with _file_with(monkeypatch, tmp_path, checkpoints, window, some) as f, refused:
        config_from_gguf(f)
