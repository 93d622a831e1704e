"""Fixtures of the converter tests: the vocabularies, the tiny HF checkpoints (kept under
tests/.cache/, keyed on the code that writes them), their conversions, and the two references
(transformers and llama.cpp)."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import gguf_writing_sources, keyed_cache
from tests.converters.checkpoints import SPECS, SpmVocab, write_checkpoint

ARCHS = list(SPECS)
# llama.cpp against edgeinfer on a quantized conversion, F16 cache: llama.cpp's int8 activation
# roundings flip with summation order, so the bar is loose; a wrong tensor or hyper-parameter
# is far beyond it (mean KL over the positions, and the share of equal argmaxes)
QUANTIZED_KL_BAR = 0.02
QUANTIZED_TOP1_BAR = 0.85


@pytest.fixture(scope="session")
def vocabs(gemma_path) -> dict:
    from tests.fixtures.models import GemmaSubsetVocab
    from tests.fixtures.vocab import bpe_vocab

    g = GemmaSubsetVocab(gemma_path)
    types = list(g.types)
    types[g.ids["<unk>"]] = 2  # a SentencePiece model has one UNKNOWN piece (the GGUF says control)
    return {
        "llama3": bpe_vocab("llama3"),
        "qwen2": bpe_vocab("qwen2"),
        "spm": SpmVocab(g.tokens, g.scores, types, dict(g.ids)),
    }


def checkpoint_sources() -> list:
    """What the HF folders are made with: checkpoints.py, and what the GGUF fixtures are made
    with (the vocabularies, the Gemma file's reader)."""
    return [Path(__file__).parent / "checkpoints.py", *gguf_writing_sources()]


@pytest.fixture(scope="session")
def checkpoints(vocabs) -> dict[str, Path]:
    """One HF folder per architecture; never modified by the tests."""
    root = keyed_cache("hf-checkpoints", checkpoint_sources())
    out = {}
    for arch in ARCHS:
        folder = root / arch
        if not (folder / ".complete").exists():
            shutil.rmtree(folder, ignore_errors=True)
            write_checkpoint(folder, arch, vocabs)
            (folder / ".complete").write_text("")
        out[arch] = folder
    return out


@pytest.fixture
def make_checkpoint(vocabs, tmp_path):
    """Writes a checkpoint variant into a fresh folder: make_checkpoint("llama", n_layer=3)."""

    def make(arch: str, name: str = "src", **overrides) -> Path:
        return write_checkpoint(tmp_path / name, arch, vocabs, **overrides)

    return make


@pytest.fixture
def copy_checkpoint(checkpoints, tmp_path):
    """A copy of a cached checkpoint that a test may damage."""

    def copy(arch: str) -> Path:
        dst = tmp_path / f"{arch}-copy"
        shutil.copytree(checkpoints[arch], dst)
        return dst

    return copy


@pytest.fixture(scope="session")
def converted(checkpoints, tmp_path_factory):
    """converted(arch, type, pure=False) -> GGUF path, converted once per session."""
    from edgeinfer.converters.convert import ConvertOptions, convert

    root = tmp_path_factory.mktemp("converted")
    done: dict[tuple[str, str, bool], Path] = {}

    def get(arch: str, type_name: str, pure: bool = False) -> Path:
        key = (arch, type_name, pure)
        if key not in done:
            path = root / f"{arch}-{type_name}{'-pure' if pure else ''}.gguf"
            convert(checkpoints[arch], path, ConvertOptions(type=type_name, pure=pure))
            done[key] = path
        return done[key]

    return get


def hf_model(folder: Path):
    """transformers' float32 model of a checkpoint, eager attention (the reference)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def hf_logits(folder: Path, tokens: list[int]) -> np.ndarray:
    """transformers' float32 logits at every position (the reference)."""
    import torch

    model = hf_model(folder)
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].numpy()


def prompt_tokens(n_vocab: int, n: int = 48, seed: int = 0) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(0, n_vocab, n)]


def ggml_quantize(src: Path, dst: Path, ftype: int, pure: bool) -> None:
    """llama.cpp's own quantizer (llama_model_quantize) on an F32 GGUF file."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.pure, params.nthread = ftype, pure, 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed ({rc})"


def leftovers(folder: Path) -> list[str]:
    """Files a failed conversion must not leave: outputs and temporary files."""
    return sorted(
        p.name for p in folder.iterdir() if p.suffix in (".gguf", ".part") or p.name.startswith(".")
    )


@pytest.fixture
def out_dir(tmp_path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
