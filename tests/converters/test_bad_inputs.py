"""Bad sources and impossible options give one clear, typed error and leave no output file
(nor a temporary one) behind; an existing output is left as it was."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from edgeinfer import errors as ei_errors
from edgeinfer.converters import errors
from edgeinfer.converters.convert import ConvertOptions, convert
from tests.converters.checkpoints import write_safetensors
from tests.converters.conftest import leftovers


def run(src: Path, out_dir: Path, **options) -> None:
    convert(src, out_dir / "model.gguf", ConvertOptions(**options))


def check_refused(src, out_dir, error, match, **options):
    with pytest.raises(error, match=match) as info:
        run(src, out_dir, **options)
    assert isinstance(info.value, ei_errors.EdgeInferError)
    assert "\n" not in str(info.value)
    assert leftovers(out_dir) == []
    return info.value


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


# --- missing files ---------------------------------------------------------------------------


def test_missing_folder(tmp_path, out_dir):
    check_refused(tmp_path / "nowhere", out_dir, errors.MissingSourceFileError, "no such folder")


@pytest.mark.parametrize(
    "remove, match",
    [(["config.json"], "config.json"), (["model.safetensors"], "safetensors"),
     (["tokenizer.json"], "no tokenizer")],
)  # fmt: skip
def test_missing_files(copy_checkpoint, out_dir, remove, match):
    src = copy_checkpoint("llama")
    for name in remove:
        (src / name).unlink()
    check_refused(src, out_dir, errors.MissingSourceFileError, match)


def test_pickle_weights_are_not_read(copy_checkpoint, out_dir):
    src = copy_checkpoint("llama")
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    check_refused(src, out_dir, errors.MissingSourceFileError, "pickle")


def test_missing_shard(copy_checkpoint, out_dir):
    src = copy_checkpoint("mistral")
    (src / "model-00002-of-00002.safetensors").unlink()
    check_refused(src, out_dir, errors.MissingSourceFileError, "00002")


def test_shard_index_disagrees_with_shards(copy_checkpoint, out_dir):
    src = copy_checkpoint("mistral")
    index = json.loads((src / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "model-00002-of-00002.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    check_refused(src, out_dir, errors.CorruptSafetensorsError, "not listed")


@pytest.mark.parametrize(
    "shard",
    [["model-00001-of-00002.safetensors"], "model\0.safetensors", "", "..", "../model.safetensors"],
)
def test_bad_shard_names_in_the_index(copy_checkpoint, out_dir, shard):
    # found by tests/fuzz/fuzz_hf_folder.py: a list escaped as TypeError, a NUL as ValueError
    src = copy_checkpoint("mistral")
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"][next(iter(index["weight_map"]))] = shard
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    check_refused(src, out_dir, errors.BadConfigError, "bad shard name")


def test_shards_without_index(copy_checkpoint, out_dir):
    src = copy_checkpoint("mistral")
    (src / "model.safetensors.index.json").unlink()
    check_refused(src, out_dir, errors.MissingSourceFileError, "index")


# --- architectures and configs ---------------------------------------------------------------


@pytest.mark.parametrize(
    "arch", ["GPT2LMHeadModel", "Gemma3ForConditionalGeneration", "MixtralForCausalLM"]
)
def test_unsupported_architecture_is_named(copy_checkpoint, out_dir, arch):
    src = copy_checkpoint("llama")
    edit_json(src / "config.json", architectures=[arch])
    e = check_refused(src, out_dir, errors.UnsupportedArchitectureError, arch)
    assert isinstance(e, ei_errors.UnknownArchitectureError)
    assert "LlamaForCausalLM" in str(e)  # and says what is supported


def test_config_without_architectures(copy_checkpoint, out_dir):
    src = copy_checkpoint("llama")
    edit_json(src / "config.json", architectures=None)
    check_refused(src, out_dir, errors.BadConfigError, "architectures")


def test_config_not_json(copy_checkpoint, out_dir):
    src = copy_checkpoint("llama")
    (src / "config.json").write_text("{'hidden_size': 256")
    check_refused(src, out_dir, errors.BadConfigError, "not valid JSON")


def test_config_nested_too_deep(copy_checkpoint, out_dir):
    # found by tests/fuzz/fuzz_hf_folder.py: json's RecursionError escaped untyped
    src = copy_checkpoint("llama")
    (src / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    check_refused(src, out_dir, errors.BadConfigError, "not valid JSON")


def test_chat_template_file_not_utf8(copy_checkpoint, out_dir):
    # found by tests/fuzz/fuzz_hf_folder.py: UnicodeDecodeError escaped untyped
    src = copy_checkpoint("llama")
    edit_json(src / "tokenizer_config.json", chat_template=None)
    (src / "chat_template.jinja").write_bytes(b"\xfb{{ messages }}")
    check_refused(src, out_dir, errors.TokenizerConversionError, "not UTF-8")


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip


# found by tests/fuzz/fuzz_hf_folder.py: each escaped as TypeError, ValueError, OverflowError,
# ZeroDivisionError or AttributeError, or (vocab_size) padded the vocabulary to 16 million
# tokens before the embedding's shape was checked
@pytest.mark.parametrize(
    "arch, file, changes, error, match",
    [("llama", "config.json", {"rms_norm_eps": 1e308}, errors.BadConfigError, "rms_norm_eps"),
     ("llama", "config.json", {"rope_theta": 1e300}, errors.BadConfigError, "rope_theta"),
     ("llama", "config.json", {"rope_scaling": {**_LLAMA3_ROPE, "high_freq_factor": 0}},
      errors.BadConfigError, "high_freq_factor"),
     ("llama", "config.json", {"rope_scaling": {**_LLAMA3_ROPE, "factor": "8"}},
      errors.BadConfigError, "factor"),
     ("llama", "config.json", {"vocab_size": 1 << 24}, errors.ShapeMismatchError, "embed_tokens"),
     ("gemma3", "config.json", {"final_logit_softcapping": "30"}, errors.BadConfigError,
      "final_logit_softcapping"),
     ("gemma3", "config.json", {"layer_types": [["sliding_attention"]] * 7},
      errors.UnsupportedFeatureError, "layer_types"),
     ("gemma3", "tokenizer_config.json", {"added_tokens_decoder": {"\u00b2": {"content": "x"}}},
      errors.TokenizerConversionError, "bad added token"),
     ("llama", "tokenizer.json", {"added_tokens": 5}, errors.TokenizerConversionError,
      "added_tokens"),
     ("llama", "tokenizer.json", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
         {"type": "Split", "pattern": {"Regex": ["x"]}},
         {"type": "ByteLevel", "use_regex": False}]}},
      errors.TokenizerConversionError, "regex")],
)  # fmt: skip
def test_values_of_the_wrong_type(copy_checkpoint, out_dir, arch, file, changes, error, match):
    src = copy_checkpoint(arch)
    edit_json(src / file, **changes)
    check_refused(src, out_dir, error, match)


@pytest.mark.parametrize(
    "post_processor",
    [{"type": "TemplateProcessing", "single": [{"SpecialToken": "x"}], "special_tokens": []},
     {"type": "TemplateProcessing", "single": {"a": 1}},
     {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": ["x"]}}],
      "special_tokens": {"x": []}},
     {"type": "Sequence", "processors": 3}],
)  # fmt: skip
def test_odd_post_processors_add_nothing(copy_checkpoint, post_processor):
    # found by tests/fuzz/fuzz_hf_folder.py: AttributeError, KeyError and TypeError escaped;
    # a post-processor edgeinfer does not understand says nothing about BOS and EOS
    from edgeinfer.converters.convert import plan_conversion

    src = copy_checkpoint("llama")
    edit_json(src / "tokenizer.json", post_processor=post_processor)
    edit_json(src / "tokenizer_config.json", add_bos_token=True)
    assert plan_conversion(src).tensors


def test_rope_parameters_without_full_attention(copy_checkpoint, out_dir):
    # found by tests/fuzz/fuzz_hf_folder.py: a KeyError escaped untyped
    src = copy_checkpoint("gemma3")
    sliding = {"rope_type": "default", "rope_theta": 10000.0}
    edit_json(src / "config.json", rope_parameters={"sliding_attention": sliding})
    check_refused(src, out_dir, errors.BadConfigError, "full_attention")


@pytest.mark.parametrize(
    "changes, match",
    [({"num_key_value_heads": 3}, "KV groups"), ({"hidden_size": "256"}, "hidden_size"),
     ({"rms_norm_eps": None, "num_hidden_layers": -1}, "num_hidden_layers")],
)  # fmt: skip
def test_bad_config_values(copy_checkpoint, out_dir, changes, match):
    src = copy_checkpoint("llama")
    edit_json(src / "config.json", **changes)
    check_refused(src, out_dir, errors.BadConfigError, match)


@pytest.mark.parametrize(
    "arch, changes, match",
    [("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
     ("llama", {"attention_bias": True}, "attention_bias"),
     ("llama", {"hidden_act": "gelu"}, "gelu"),
     ("qwen2", {"use_sliding_window": True}, "sliding"),
     ("gemma3", {"query_pre_attn_scalar": 100}, "query_pre_attn_scalar"),
     ("gemma3", {"attn_logit_softcapping": 50.0}, "softcapping")],
)  # fmt: skip
def test_unsupported_features(copy_checkpoint, out_dir, arch, changes, match):
    src = copy_checkpoint(arch)
    edit_json(src / "config.json", **changes)
    e = check_refused(src, out_dir, errors.UnsupportedFeatureError, match)
    assert isinstance(e, ei_errors.UnsupportedModelError)


# --- tensors ---------------------------------------------------------------------------------


def test_shape_mismatch(copy_checkpoint, out_dir):
    src = copy_checkpoint("llama")
    edit_json(src / "config.json", intermediate_size=768)
    check_refused(
        src, out_dir, errors.ShapeMismatchError, r"mlp\.gate_proj.*\[512, 256\].*\[768, 256\]"
    )


def _header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _rewrite(path: Path, header: dict, data: bytes, pad: bool = True) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_missing_and_unexpected_tensors(copy_checkpoint, out_dir):
    import numpy as np

    src = copy_checkpoint("qwen3")
    from edgeinfer.converters.safetensors_file import SafetensorsFile, read_rows

    f = SafetensorsFile(src / "model.safetensors")
    tensors = {n: read_rows(e, 0, e.n_rows).reshape(e.shape) for n, e in f.tensors.items()}
    extra = dict(tensors, **{"model.vision_tower.weight": np.zeros((4, 4), np.float32)})
    write_safetensors(src / "model.safetensors", extra)
    check_refused(src, out_dir, errors.UnexpectedTensorError, "vision_tower")
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    write_safetensors(src / "model.safetensors", tensors)
    check_refused(src, out_dir, errors.UnexpectedTensorError, "layers.1.self_attn.k_norm")


def _corrupt_cases():
    def huge_length(h, d):
        return struct.pack("<Q", 1 << 40) + b"{}"

    def not_json(h, d):
        return struct.pack("<Q", 6) + b"{nope}" + d

    def unknown_dtype(h, d):
        name = next(k for k in h if k != "__metadata__")
        h[name]["dtype"] = "Q4"
        raw = json.dumps(h).encode()
        return struct.pack("<Q", len(raw)) + raw + d

    def overlap(h, d):
        names = [k for k in h if k != "__metadata__"]
        h[names[1]]["data_offsets"] = h[names[0]]["data_offsets"]
        raw = json.dumps(h).encode()
        return struct.pack("<Q", len(raw)) + raw + d

    def wrong_size(h, d):
        name = next(k for k in h if k != "__metadata__")
        h[name]["shape"] = [h[name]["shape"][0] + 1] + h[name]["shape"][1:]
        raw = json.dumps(h).encode()
        return struct.pack("<Q", len(raw)) + raw + d

    def truncated(h, d):
        raw = json.dumps(h).encode()
        return struct.pack("<Q", len(raw)) + raw + d[: len(d) // 2]

    def duplicate_key(h, d):
        name = next(k for k in h if k != "__metadata__")
        raw = json.dumps(h).encode()
        raw = raw[:-1] + b", " + json.dumps({name: h[name]}).encode()[1:]
        return struct.pack("<Q", len(raw)) + raw + d

    def negative_offsets(h, d):
        name = next(k for k in h if k != "__metadata__")
        h[name]["data_offsets"] = [-4, h[name]["data_offsets"][1]]
        raw = json.dumps(h).encode()
        return struct.pack("<Q", len(raw)) + raw + d

    def empty(h, d):
        return b"\x01\x02"

    # found by tests/fuzz/fuzz_safetensors.py: each escaped as TypeError, RecursionError or
    # ValueError before it was refused as corrupt
    def dtype_not_a_name(h, d):
        name = next(k for k in h if k != "__metadata__")
        h[name]["dtype"] = ["F32"]
        raw = json.dumps(h).encode()
        return struct.pack("<Q", len(raw)) + raw + d

    def nested_too_deep(h, d):
        raw = b"{" + b'"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        return struct.pack("<Q", len(raw)) + raw + d

    def integer_too_long(h, d):
        shape = b'"shape": ['
        raw = json.dumps(h).encode().replace(shape, shape + b"1" * 5000 + b", ", 1)
        return struct.pack("<Q", len(raw)) + raw + d

    return {f.__name__: f for f in (huge_length, not_json, unknown_dtype, overlap, wrong_size,
                                     truncated, duplicate_key, negative_offsets,
                                     empty, dtype_not_a_name, nested_too_deep,
                                     integer_too_long)}  # fmt: skip


@pytest.mark.parametrize("case", list(_corrupt_cases()))
def test_corrupt_safetensors_header(copy_checkpoint, out_dir, case):
    src = copy_checkpoint("llama")
    path = src / "model.safetensors"
    header, data = _header(path)
    path.write_bytes(_corrupt_cases()[case](header, data))
    check_refused(src, out_dir, errors.CorruptSafetensorsError, "model.safetensors")


@pytest.mark.parametrize("row_length", [2**20, 2**40, 2**41, 2**70])
def test_no_row_of_an_empty_tensor_is_read(tmp_path, row_length):
    # found by tests/fuzz/fuzz_safetensors.py: a row of shape [0, 2**70] was "read" into a
    # buffer of 2**72 bytes (OverflowError; MemoryError for shorter rows), and no array of
    # shape (0, 2**62) can be made (ValueError)
    from edgeinfer.converters.safetensors_file import SafetensorsFile, read_rows

    raw = json.dumps({"e": {"dtype": "F32", "shape": [0, row_length], "data_offsets": [0, 0]}})
    path = tmp_path / "empty.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw.encode())
    if row_length > 2**40:
        with pytest.raises(errors.CorruptSafetensorsError, match="bad shape"):
            SafetensorsFile(path)
        return
    entry = SafetensorsFile(path).tensors["e"]
    assert read_rows(entry, 0, 0).shape == (0, row_length)
    with pytest.raises(errors.ShapeMismatchError):
        read_rows(entry, 0, 1)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer_config.json"])
def test_fifo_is_refused_without_blocking(copy_checkpoint, out_dir, name):
    # opening a FIFO for reading blocks until a writer comes: it must be refused unopened
    src = copy_checkpoint("llama")
    (src / name).unlink()
    os.mkfifo(src / name)
    e = check_refused(src, out_dir, errors.SourceError, "not a regular file")
    assert name in str(e)


def test_quantized_checkpoint_dtype_is_refused(copy_checkpoint, out_dir):
    src = copy_checkpoint("llama")
    path = src / "model.safetensors"
    header, data = _header(path)
    name = next(k for k in header if k != "__metadata__" and header[k]["dtype"] == "F32")
    header[name]["dtype"] = "I32"  # same size, so only the dtype is wrong
    _rewrite(path, header, data)
    check_refused(src, out_dir, errors.UnsupportedFeatureError, "I32")


# --- options ---------------------------------------------------------------------------------


def test_unknown_type(checkpoints, out_dir):
    e = check_refused(checkpoints["llama"], out_dir, errors.UnknownTypeError, "q3_xl", type="q3_xl")
    assert isinstance(e, ei_errors.InvalidOptionError) and "q4_k_m" in str(e)


def test_impossible_budget_says_by_how_much(checkpoints, out_dir):
    e = check_refused(
        checkpoints["llama"], out_dir, errors.BudgetError, "short by", max_memory="1MB", n_ctx=64
    )
    assert e.shortfall > 0 and e.needed == e.budget + e.shortfall and e.budget == 1_000_000


def test_recipe_over_budget(checkpoints, out_dir):
    e = check_refused(checkpoints["llama"], out_dir, errors.BudgetError, "f32 does not fit",
                      type="f32", max_memory="4MB", n_ctx=64)  # fmt: skip
    assert e.shortfall > 0


@pytest.mark.parametrize(
    "options, error, match",
    [({"max_memory": "lots", "n_ctx": 64}, errors.InvalidSizeError, "lots"),
     ({"max_memory": "1GiB"}, errors.InvalidSizeError, "--ctx"),
     ({"max_memory": "1GiB", "n_ctx": -5}, errors.InvalidSizeError, "ctx"),
     ({"max_memory": "1GiB", "n_ctx": 0}, errors.InvalidSizeError, "ctx"),
     ({"target": "toaster"}, errors.ProfileError, "rpi5"),
     ({"format": "onnx", "target": "rpi5"}, errors.NotAvailableError, "ONNX"),
     ({"format": "tflite"}, errors.UnknownTypeError, "tflite")],
)  # fmt: skip
def test_bad_options(checkpoints, out_dir, options, error, match):
    check_refused(checkpoints["llama"], out_dir, error, match, **options)


# --- interruption ----------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupted_write_leaves_no_file(checkpoints, out_dir, exc):
    def progress(stage, done, total):
        if stage == "write" and done == total // 2:
            raise exc()

    with pytest.raises(exc):
        convert(checkpoints["llama"], out_dir / "model.gguf", ConvertOptions(type="q8_0"), progress)
    assert leftovers(out_dir) == []


def test_failure_keeps_an_existing_output(checkpoints, out_dir):
    out = out_dir / "model.gguf"
    out.write_bytes(b"previous")

    def progress(stage, done, total):
        if stage == "write" and done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(checkpoints["llama"], out, ConvertOptions(type="f16"), progress)
    assert out.read_bytes() == b"previous"
    assert leftovers(out_dir) == ["model.gguf"]


def test_token_ids_beyond_the_embedding(copy_checkpoint, out_dir):
    src = copy_checkpoint("qwen2")
    tj = json.loads((src / "tokenizer.json").read_text())
    tj["added_tokens"][0]["id"] = 10**7  # would need ten million placeholder tokens
    (src / "tokenizer.json").write_text(json.dumps(tj))
    check_refused(src, out_dir, errors.TokenizerConversionError, "beyond the embedding")


def test_notes_say_what_is_not_kept(copy_checkpoint):
    from edgeinfer.converters.convert import plan_conversion

    src = copy_checkpoint("mistral")
    edit_json(src / "config.json", sliding_window=4096)
    notes = plan_conversion(src).notes
    assert any("sliding_window 4096" in n for n in notes)
