"""Vocabularies: converted byte-level BPE tokenizes as Hugging Face's tokenizers does, the
SentencePiece protobuf reads as the sentencepiece library reads it, and special tokens,
add-BOS/EOS flags, the chat template and padding land in the GGUF metadata."""

from __future__ import annotations

import json

import pytest

import edgeinfer
from edgeinfer.converters import errors
from edgeinfer.converters.hf_folder import HFCheckpoint
from edgeinfer.converters.sentencepiece_model import parse_sentencepiece
from edgeinfer.converters.vocab import convert_vocabulary, pre_tokenizer_name
from edgeinfer.gguf import GGUFFile
from tests.converters.checkpoints import CHAT_TEMPLATE
from tests.e2e.parity import PROMPTS

TEXTS = [
    *PROMPTS,
    "Hello world! It's 2024; we've 3 cats & 12345 dogs.\n\n  indented\tand tabs",
    "don't   stop... ÉCOLE naïve 東京 ñ 😀👍🏽 <|not special|>",
    "",
    " leading space and trailing   ",
]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_bpe_tokenizes_like_hf_tokenizers(arch, checkpoints, converted):
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(str(checkpoints[arch] / "tokenizer.json"))
    with edgeinfer.load(converted(arch, "q8_0"), n_ctx=64, engine="reference") as model:
        for text in TEXTS:
            assert (
                model.tokenize(text, add_special=False)
                == hf.encode(text, add_special_tokens=False).ids
            ), text
            assert model.tokenize(text) == hf.encode(text).ids, text


def test_sentencepiece_parse_matches_the_library(checkpoints):
    spm = pytest.importorskip("sentencepiece")
    for arch in ("mistral", "gemma3"):
        path = checkpoints[arch] / "tokenizer.model"
        ours = parse_sentencepiece(path)
        lib = spm.SentencePieceProcessor(model_file=str(path))
        assert ours.pieces == [lib.id_to_piece(i) for i in range(lib.get_piece_size())]
        assert ours.scores == [lib.get_score(i) for i in range(lib.get_piece_size())]
        for i, t in enumerate(ours.types):
            assert (t == 2) == lib.is_unknown(i) and (t == 3) == lib.is_control(i)
            assert (t == 6) == lib.is_byte(i) and (t == 5) == lib.is_unused(i)
        roles = ("bos", "eos", "unk", "pad")
        assert [ours.special_id(r) for r in roles] == [
            lib.bos_id(),
            lib.eos_id(),
            lib.unk_id(),
            lib.pad_id(),
        ]
        assert min(ours.special_id(r) for r in roles) >= 0


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])  # with and without a dummy prefix
def test_sentencepiece_vocabulary_tokenizes_like_sentencepiece(arch, checkpoints, converted):
    spm = pytest.importorskip("sentencepiece")
    lib = spm.SentencePieceProcessor(model_file=str(checkpoints[arch] / "tokenizer.model"))
    with edgeinfer.load(converted(arch, "q8_0"), n_ctx=64, engine="reference") as model:
        for text in TEXTS:
            assert model.tokenize(text, add_special=False) == lib.encode(text), text


def test_sentencepiece_vocabulary_tokenizes_like_llama_cpp(converted):
    from tests.conftest import llama_cpp_model

    path = converted("gemma3", "q8_0")
    llm = llama_cpp_model(path)
    try:
        with edgeinfer.load(path, n_ctx=64, engine="reference") as model:
            for text in TEXTS:
                assert model.tokenize(text) == llm.tokenize(
                    text.encode(), add_bos=True, special=False
                ), text
    finally:
        llm.close()


def test_metadata_of_a_sentencepiece_vocabulary(converted, vocabs):
    spm = vocabs["spm"]
    with GGUFFile(converted("mistral", "q8_0")) as f:
        md = f.metadata
        assert md["tokenizer.ggml.model"] == "llama" and md["tokenizer.ggml.pre"] == "default"
        assert md["tokenizer.ggml.tokens"] == spm.pieces
        assert md["tokenizer.ggml.token_type"].tolist() == spm.types
        assert md["tokenizer.ggml.bos_token_id"] == spm.ids["<bos>"]
        assert md["tokenizer.ggml.eos_token_id"] == spm.ids["<eos>"]
        assert md["tokenizer.ggml.padding_token_id"] == spm.ids["<pad>"]
        assert (
            md["tokenizer.ggml.add_bos_token"] is True
            and md["tokenizer.ggml.add_eos_token"] is False
        )
        assert md["tokenizer.ggml.add_space_prefix"] is True  # mistral's model says so
        assert md["tokenizer.chat_template"] == CHAT_TEMPLATE
    with GGUFFile(converted("gemma3", "q8_0")) as f:
        assert f.metadata["tokenizer.ggml.add_space_prefix"] is False
        assert len(f.metadata["tokenizer.ggml.tokens"]) == len(spm.pieces)  # cropped embedding
        assert f.tensors["token_embd.weight"].shape == (320, len(spm.pieces))


def test_metadata_of_a_bpe_vocabulary(converted, vocabs):
    v = vocabs["qwen2"]
    with GGUFFile(converted("qwen2", "q8_0")) as f:
        md = f.metadata
        tokens = md["tokenizer.ggml.tokens"]
        assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "qwen2"
        assert tokens[: len(v.tokens)] == v.tokens
        assert tokens[len(v.tokens) :] == [
            f"[PAD{i}]" for i in range(len(v.tokens), len(v.tokens) + 40)
        ]
        types = md["tokenizer.ggml.token_type"].tolist()
        assert types[len(v.tokens) :] == [5] * 40
        assert types[v.token_id("<|im_end|>")] == 3 and types[v.token_id("<tool_call>")] == 4
        assert md["tokenizer.ggml.merges"] == v.merges
        assert md["tokenizer.ggml.eos_token_id"] == v.token_id("<|im_end|>")
        assert md["tokenizer.ggml.add_bos_token"] is False
        assert f.tensors["token_embd.weight"].shape == (256, len(v.tokens) + 40)
    with GGUFFile(converted("llama", "q8_0")) as f:
        assert f.metadata["tokenizer.ggml.pre"] == "llama-bpe"
        assert f.metadata["tokenizer.ggml.add_bos_token"] is True


def _tj(pre: dict, clean: bool = True) -> str:
    return pre_tokenizer_name({"pre_tokenizer": pre}, clean, "tokenizer.json")


def test_pre_tokenizer_names():
    from tests.converters.checkpoints import LLAMA3_SPLIT_RE, QWEN2_SPLIT_RE

    byte_level = {"type": "ByteLevel", "use_regex": False}
    for regex, name in ((LLAMA3_SPLIT_RE, "llama-bpe"), (QWEN2_SPLIT_RE, "qwen2")):
        split = {"type": "Split", "pattern": {"Regex": regex}}
        assert _tj({"type": "Sequence", "pretokenizers": [split, byte_level]}) == name
    assert _tj({"type": "ByteLevel", "use_regex": True}) == "gpt-2"
    digits = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "use_regex": True},
    ]}  # fmt: skip
    assert _tj(digits, clean=False) == "smollm" and _tj(digits, clean=True) == "starcoder"
    other = {
        "type": "Sequence",
        "pretokenizers": [{"type": "Split", "pattern": {"Regex": "x+"}}, byte_level],
    }
    with pytest.raises(errors.TokenizerConversionError, match="regex"):
        _tj(other)
    with pytest.raises(errors.TokenizerConversionError, match="Metaspace"):
        _tj({"type": "Metaspace"})


def test_merges_with_spaces_and_chat_template_files(copy_checkpoint):
    src = copy_checkpoint("qwen2")
    tj = json.loads((src / "tokenizer.json").read_text())
    tj["model"]["merges"][0] = ["a b", "c"]
    (src / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((src / "tokenizer_config.json").read_text())
    del tc["chat_template"]
    (src / "tokenizer_config.json").write_text(json.dumps(tc))
    (src / "chat_template.jinja").write_text("{{ messages }}")
    vocab = convert_vocabulary(HFCheckpoint(src))
    assert vocab.merges[0] == "aĠb c"
    assert vocab.chat_templates == {"": "{{ messages }}"}
    tc["chat_template"] = [
        {"name": "default", "template": "A"},
        {"name": "tool_use", "template": "B"},
    ]
    (src / "tokenizer_config.json").write_text(json.dumps(tc))
    items = {k: v for k, _, v, _ in convert_vocabulary(HFCheckpoint(src)).metadata()}
    assert (
        items["tokenizer.chat_template"] == "A" and items["tokenizer.chat_template.tool_use"] == "B"
    )


def test_broken_tokenizer_files(copy_checkpoint):
    src = copy_checkpoint("qwen2")
    tj = json.loads((src / "tokenizer.json").read_text())
    tj["added_tokens"][0]["id"] = 5  # an id the vocabulary gives another token
    (src / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(errors.TokenizerConversionError, match="id 5"):
        convert_vocabulary(HFCheckpoint(src))
    src = copy_checkpoint("gemma3")
    (src / "tokenizer.model").write_bytes(b"\x0a\xff\xff\xff")
    with pytest.raises(errors.TokenizerConversionError, match="SentencePiece"):
        convert_vocabulary(HFCheckpoint(src))
