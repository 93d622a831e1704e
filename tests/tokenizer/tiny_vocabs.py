"""Hand-built vocabularies small enough to work out expected token ids on paper."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.fixtures.vocab import (
    BYTE_CHARS,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_USER_DEFINED,
    VocabSpec,
)

TOKEN_UNKNOWN = 2
TOKEN_BYTE = 6

# SentencePiece: <unk> <s> </s>, 256 byte tokens, then pieces with their scores.
SPM_PIECES = [
    ("▁", -1.0),
    ("a", -2.0),
    ("b", -3.0),
    ("c", -4.0),
    ("▁a", -1.5),
    ("bc", -2.5),
    ("▁abc", -10.0),
    ("<user>", 0.0),
]
SPM_FIRST_PIECE = 3 + 256


def spm_id(piece: str) -> int:
    return SPM_FIRST_PIECE + [p for p, _ in SPM_PIECES].index(piece)


def spm_metadata() -> dict[str, Any]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [p for p, _ in SPM_PIECES]
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [s for _, s in SPM_PIECES]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256
    types += [TOKEN_NORMAL] * (len(SPM_PIECES) - 1) + [TOKEN_USER_DEFINED]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.asarray(scores, dtype=np.float32),
        "tokenizer.ggml.token_type": np.asarray(types, dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


# Byte-level BPE: the 256 byte characters, then three merges.
BPE_MERGES = ["a b", "ab c", "Ġ ab"]


def bpe_metadata(pre: str = "gpt-2") -> dict[str, Any]:
    tokens = sorted(BYTE_CHARS, key=ord) + ["ab", "abc", "Ġab", "<|end|>"]
    types = [TOKEN_NORMAL] * (len(tokens) - 1) + [TOKEN_CONTROL]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.asarray(types, dtype=np.int32),
        "tokenizer.ggml.merges": list(BPE_MERGES),
        "tokenizer.ggml.bos_token_id": len(tokens) - 1,
        "tokenizer.ggml.eos_token_id": len(tokens) - 1,
    }


def bpe_id(text: str) -> int:
    return bpe_metadata()["tokenizer.ggml.tokens"].index(text)


def as_spec(metadata: dict[str, Any]) -> VocabSpec:
    """The same vocabulary as a VocabSpec, to write it into a GGUF file."""
    k = "tokenizer.ggml."
    scores = metadata.get(k + "scores")
    return VocabSpec(
        model=metadata[k + "model"],
        pre=metadata.get(k + "pre", "default"),
        tokens=list(metadata[k + "tokens"]),
        token_types=[int(t) for t in metadata[k + "token_type"]],
        merges=list(metadata.get(k + "merges", [])),
        scores=None if scores is None else [float(s) for s in scores],
        special_ids={
            role: metadata[k + key]
            for role, key in (
                ("bos", "bos_token_id"),
                ("eos", "eos_token_id"),
                ("unk", "unknown_token_id"),
            )
            if k + key in metadata
        },
    )


# Tokens that only odd files contain: invalid UTF-8, characters outside GPT-2's byte
# alphabet, byte tokens in a BPE vocabulary, unused and unknown token types.
EXOTIC_TOKENS = [
    ("\udcff", TOKEN_NORMAL),
    ("a€", TOKEN_NORMAL),
    ("\udce2\udc82", TOKEN_NORMAL),
    ("<0x4a>", TOKEN_BYTE),
    ("<0xZZ>", TOKEN_BYTE),
    ("spare", 5),
    ("odd", 99),
    ("zero", 0),
    ("▁space▁", TOKEN_NORMAL),
    ("<ctl>", TOKEN_CONTROL),
    ("<user2>", TOKEN_USER_DEFINED),
    ("<unk2>", TOKEN_UNKNOWN),
]


def with_exotic_tokens(metadata: dict[str, Any]) -> dict[str, Any]:
    k = "tokenizer.ggml."
    md = dict(metadata)
    md[k + "tokens"] = list(md[k + "tokens"]) + [t for t, _ in EXOTIC_TOKENS]
    md[k + "token_type"] = np.concatenate(
        [md[k + "token_type"], np.asarray([t for _, t in EXOTIC_TOKENS], dtype=np.int32)]
    )
    if k + "scores" in md:
        md[k + "scores"] = np.concatenate(
            [md[k + "scores"], np.full(len(EXOTIC_TOKENS), -20.0, dtype=np.float32)]
        )
    return md
