"""Every pre-tokenizer family we accept splits like llama.cpp, under several of its names."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from edgeinfer.errors import TokenizerError
from edgeinfer.gguf.reader import GGUFFile
from edgeinfer.tokenizer import Tokenizer
from edgeinfer.tokenizer.vocab import PRE_TOKENIZERS
from tests.fixtures.vocab import bpe_vocab, write_vocab_only_gguf
from tests.tokenizer.corpus import hand_written, long_text

# One or more names per family, including the ones that also change flags.
PRE_NAMES = [
    "default",
    "gpt-2",
    "mpt",
    "trillion",
    "roberta-bpe",
    "starcoder",
    "smollm",
    "command-r",
    "falcon",
    "llama3",
    "dbrx",
    "chatglm-bpe",
    "glm4",
    "qwen2",
    "stablelm2",
    "megrez",
    "qwen35",
]


def test_names_cover_every_family() -> None:
    assert {PRE_TOKENIZERS[name].family for name in PRE_NAMES} == {
        p.family for p in PRE_TOKENIZERS.values()
    }


@pytest.mark.parametrize("pre", PRE_NAMES)
def test_pre_tokenizer_matches_llama_cpp(tmp_path: Path, pre: str) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    path = write_vocab_only_gguf(tmp_path / "v.gguf", bpe_vocab("qwen2").with_pre(pre))
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_metadata(GGUFFile(path).metadata)
    bad = []
    for text, add, parse in itertools.product(
        hand_written() + [long_text()], (True, False), (True, False)
    ):
        ids = ref.tokenize(text.encode(), add_bos=add, special=parse)
        if ours.tokenize(text, add, parse) != ids:
            bad.append(repr(text[:40]))
    assert not bad, f"{len(bad)} differ: {bad[:8]}"


def test_unsupported_pre_tokenizer_is_named() -> None:
    md = bpe_vocab("qwen2").with_pre("deepseek-llm").metadata()
    with pytest.raises(TokenizerError, match="deepseek-llm"):
        Tokenizer.from_metadata(md)
