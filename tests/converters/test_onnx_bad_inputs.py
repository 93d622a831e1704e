"""ONNX export and the onnxruntime backend on bad input: one typed, one-line error, and no
output folder (nor its temporary) left behind; an existing output is left as it was. Also the
CLI round trip: ``edgeinfer convert --format onnx``, then ``edgeinfer run`` on the folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import edgeinfer
from edgeinfer import errors as ei_errors
from edgeinfer.converters import errors
from edgeinfer.converters.convert import ConvertOptions, convert

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def export(src: Path, out: Path, progress=None, **options) -> None:
    options = {"format": "onnx", "n_ctx": 128, **options}
    if progress is None:
        convert(src, out, ConvertOptions(**options))
    else:
        convert(src, out, ConvertOptions(**options), progress)


def check_refused(src, out_dir, error, match, **options):
    with pytest.raises(error, match=match) as info:
        export(src, out_dir / "model", **options)
    assert isinstance(info.value, ei_errors.EdgeInferError)
    assert "\n" not in str(info.value)
    assert list(out_dir.iterdir()) == []
    return info.value


# --- sources -----------------------------------------------------------------------------------


def test_missing_folder(tmp_path, out_dir):
    check_refused(tmp_path / "nowhere", out_dir, errors.MissingSourceFileError, "no such folder")


def test_unsupported_architecture(copy_checkpoint, out_dir):
    src = copy_checkpoint("llama")
    config = json.loads((src / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (src / "config.json").write_text(json.dumps(config))
    check_refused(src, out_dir, errors.UnsupportedArchitectureError, "GPT2LMHeadModel")


def test_shape_mismatch(copy_checkpoint, out_dir):
    src = copy_checkpoint("qwen3")
    config = json.loads((src / "config.json").read_text())
    config["intermediate_size"] = 768
    (src / "config.json").write_text(json.dumps(config))
    check_refused(src, out_dir, errors.ShapeMismatchError, "gate_proj")


def test_corrupt_safetensors(copy_checkpoint, out_dir):
    src = copy_checkpoint("llama")
    path = src / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated data
    check_refused(src, out_dir, errors.CorruptSafetensorsError, "model.safetensors")


def test_missing_tokenizer(copy_checkpoint, out_dir):
    src = copy_checkpoint("qwen2")
    (src / "tokenizer.json").unlink()
    check_refused(src, out_dir, errors.MissingSourceFileError, "tokenizer")


# --- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, error, match",
    [({"type": "q4_k_m"}, errors.UnknownTypeError, "int4"),
     ({"block_size": 48}, errors.UnknownTypeError, "block-size"),
     ({"kv_type": "fp8"}, errors.UnknownTypeError, "kv-type"),
     ({"target": "rpi5"}, errors.NotAvailableError, "--target"),
     ({"max_memory": "1GiB", "n_ctx": 64}, errors.NotAvailableError, "--max-memory"),
     ({"n_ctx": 0}, errors.InvalidSizeError, "ctx"),
     ({"kv_type": "int8", "calib": "/nonexistent.txt"}, errors.MissingSourceFileError,
      "calibration")],
)  # fmt: skip
def test_bad_options(checkpoints, out_dir, options, error, match):
    e = check_refused(checkpoints["llama"], out_dir, error, match, **options)
    if error is errors.UnknownTypeError:
        assert isinstance(e, ei_errors.InvalidOptionError)


def test_existing_output_is_kept(checkpoints, out_dir):
    out = out_dir / "model"
    out.mkdir()
    (out / "mine.txt").write_text("previous")
    with pytest.raises(errors.ConversionError, match="already exists"):
        export(checkpoints["llama"], out)
    assert [p.name for p in out_dir.iterdir()] == ["model"]
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_missing_parent(checkpoints, tmp_path):
    with pytest.raises(errors.ConversionError, match="no such folder"):
        export(checkpoints["llama"], tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupted_export_leaves_nothing(checkpoints, out_dir, exc):
    def progress(stage, done, total):
        if stage == "write" and done == total // 2:
            raise exc()

    with pytest.raises(exc):
        export(checkpoints["gemma3"], out_dir / "model", progress, type="int4", kv_type="int8")
    assert list(out_dir.iterdir()) == []


def test_late_failure_leaves_nothing(checkpoints, out_dir, monkeypatch):
    """A failure after every weight is written (here: writing genai_config.json)."""
    from edgeinfer.converters.onnx import genai_config

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(genai_config, "genai_config", fail)
    with pytest.raises(OSError):
        export(checkpoints["qwen2"], out_dir / "model")
    assert list(out_dir.iterdir()) == []


# --- loading a bad folder ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_folder(checkpoints, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("onnx-good") / "model"
    export(checkpoints["qwen2"], out, type="int4")
    return out


def damaged(good_folder: Path, tmp_path: Path, damage) -> Path:
    folder = tmp_path / "damaged"
    shutil.copytree(good_folder, folder)
    damage(folder)
    return folder


def _edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "genai_config.json").read_text())
    edit(config)
    (folder / "genai_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "damage, error, match",
    [(lambda f: (f / "genai_config.json").unlink(), ei_errors.ModelFileError,
      "not an ONNX model folder"),
     (lambda f: (f / "genai_config.json").write_text("{"), ei_errors.ModelFileError, "unreadable"),
     (lambda f: _edit_config(f, lambda c: c["model"].update(type="gpt2")),
      ei_errors.UnknownArchitectureError, "gpt2"),
     (lambda f: _edit_config(f, lambda c: c["model"]["decoder"].update(num_hidden_layers=-1)),
      ei_errors.AbsurdValueError, "n_layer"),
     (lambda f: _edit_config(f, lambda c: c["model"]["decoder"].update(filename="../model.onnx")),
      ei_errors.ModelFileError, "filename"),
     (lambda f: (f / "model.onnx").unlink(), ei_errors.ModelFileError, "missing"),
     (lambda f: (f / "model.onnx").write_bytes(b"\x08\x07garbage" * 100),
      ei_errors.ModelFileError, "cannot load"),
     (lambda f: (f / "model.onnx.data").write_bytes(b"\0" * 100),
      ei_errors.ModelFileError, "cannot load"),
     (lambda f: (f / "tokenizer.json").unlink(), ei_errors.TokenizerError, "tokenizer")],
)  # fmt: skip
def test_bad_folder_is_refused(good_folder, tmp_path, damage, error, match):
    folder = damaged(good_folder, tmp_path, damage)
    with pytest.raises(error, match=match) as info:
        edgeinfer.load(folder)
    assert "\n" not in str(info.value)


def test_bad_load_options(good_folder):
    with pytest.raises(ei_errors.InvalidOptionError, match="onnxruntime"):
        edgeinfer.load(good_folder, engine="native")
    with pytest.raises(ei_errors.InvalidOptionError, match="exported for"):
        edgeinfer.load(good_folder, n_ctx=4096)
    with edgeinfer.load(good_folder, n_ctx=16) as model:
        with pytest.raises(ei_errors.ContextOverflowError):
            model.generate(list(range(1, 20)), max_tokens=4)
        with pytest.raises(ei_errors.InvalidOptionError):
            model.logits([model.n_vocab])


# --- the command line ----------------------------------------------------------------------------


def test_cli_converts_and_runs(checkpoints, out_dir, capsys):
    from edgeinfer.apps.cli import main

    out = out_dir / "m"
    args = ["convert", str(checkpoints["gemma3"]), "-o", str(out), "--format", "onnx",
            "--type", "int8", "--block-size", "64", "--ctx", "256",
            "--kv-type", "int8"]  # fmt: skip
    assert main(args) == 0
    assert "wrote" in capsys.readouterr().err and (out / "genai_config.json").is_file()
    assert main(["run", str(out), "-p", "Once upon a time", "-n", "6", "--temp", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "generated" in captured.err
    assert main(["convert", str(checkpoints["llama"]), "--format", "onnx", "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "MatMulNBits int4 b32" in plan and "GatherBlockQuantized" in plan
    assert main(["convert", str(checkpoints["llama"]), "-o", str(out), "--format", "onnx"]) == 1
    assert "already exists" in capsys.readouterr().err
