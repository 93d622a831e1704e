"""The vocabulary as llama.cpp loads it from ``tokenizer.ggml.*`` metadata.

Everything that changes tokenizer results is decided here, once, in the order llama.cpp's
``llama_vocab::impl::load`` decides it: model and pre-tokenizer defaults, then the file's
flags, then token attributes adjusted by token text (end-of-generation and fill-in-the-middle
tokens become control tokens, control tokens named "unused" become unused, ...).

We are stricter than llama.cpp about malformed files: arrays whose lengths disagree, special
token ids outside the vocabulary and duplicate token texts raise :class:`TokenizerError`
where llama.cpp would warn, fall back to a default, or abort the process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer.errors import TokenizerError

# llama_token_attr bits
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

# tokenizer.ggml.token_type value -> attribute (llama_token_type order); others: undefined
_TYPE_TO_ATTR = np.array(
    [
        ATTR_UNDEFINED,
        ATTR_NORMAL,
        ATTR_UNKNOWN,
        ATTR_CONTROL,
        ATTR_USER_DEFINED,
        ATTR_UNUSED,
        ATTR_BYTE,
    ],
    dtype=np.int32,
)

KEY = "tokenizer.ggml."

# Vocabulary models llama.cpp knows but edgeinfer does not implement, with their names.
_UNSUPPORTED_MODELS = {
    "bert": "WPM (BERT WordPiece)",
    "t5": "UGM (T5 unigram)",
    "rwkv": "RWKV",
    "plamo2": "PLaMo-2",
    "gemma4": "Gemma 4 BPE",
    "hybriddna": "HybridDNA",
    "whitespace": "whitespace BPE",
    "no_vocab": "no vocabulary",
    "none": "no vocabulary",
    "test": "test",
}


@dataclass(frozen=True)
class _Pre:
    """What a ``tokenizer.ggml.pre`` value selects: a split family and flag changes."""

    family: str
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False
    add_sep: bool = False
    no_bos: bool = False


def _pre_table() -> dict[str, _Pre]:
    table: dict[str, _Pre] = {"default": _Pre("default")}
    for name in (
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "jina-v5-nano",
    ):
        table[name] = _Pre("llama3", ignore_merges=True, add_bos=True)
    table["dbrx"] = table["smaug-bpe"] = _Pre("llama3")
    table["chatglm-bpe"] = _Pre("llama3", no_bos=True)
    table["glm4"] = table["glm5"] = _Pre("llama3", no_bos=True, ignore_merges=True)
    for name in (
        "qwen2",
        "deepseek-r1-qwen",
        "kormo",
        "f2llmv2",
        "hunyuan",
        "solar-open",
        "grok-2",
    ):
        table[name] = _Pre("qwen2", clean_spaces=False)
    table["megrez"] = table["stablelm2"] = _Pre("qwen2")
    table["qwen35"] = _Pre("qwen35", clean_spaces=False)
    for name in (
        "gpt-2",
        "phi-2",
        "jina-es",
        "jina-de",
        "gigachat",
        "jina-v2-es",
        "jina-v2-de",
        "a.x-4.0",
        "mellum",
        "modern-bert",
        "exaone4",
        "mpt",
        "olmo",
        "jais",
    ):
        table[name] = _Pre("gpt2")
    for name in ("jina-v1-en", "jina-v2-code", "roberta-bpe"):
        table[name] = _Pre("gpt2", add_sep=True)
    table["trillion"] = table["granite-docling"] = _Pre("gpt2", clean_spaces=False)
    for name in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"):
        table[name] = _Pre("starcoder")
    table["command-r"] = table["smollm"] = _Pre("starcoder", clean_spaces=False)
    table["falcon"] = _Pre("falcon")
    return table


PRE_TOKENIZERS = _pre_table()

# Special-id keys in the order llama.cpp reads them; the deprecated spellings come last and win.
_SPECIAL_KEYS = (
    ("bos_token_id", "bos"),
    ("eos_token_id", "eos"),
    ("eot_token_id", "eot"),
    ("eom_token_id", "eom"),
    ("unknown_token_id", "unk"),
    ("seperator_token_id", "sep"),
    ("padding_token_id", "pad"),
    ("mask_token_id", "mask"),
    ("fim_pre_token_id", "fim_pre"),
    ("fim_suf_token_id", "fim_suf"),
    ("fim_mid_token_id", "fim_mid"),
    ("fim_pad_token_id", "fim_pad"),
    ("fim_rep_token_id", "fim_rep"),
    ("fim_sep_token_id", "fim_sep"),
    ("prefix_token_id", "fim_pre"),
    ("suffix_token_id", "fim_suf"),
    ("middle_token_id", "fim_mid"),
)

# Token texts llama.cpp uses to find special tokens a file does not name.
_EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
)
_FIM_TEXTS = {
    "eom": ("<|eom_id|>",),
    "fim_pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
)
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


@dataclass
class Vocab:
    """A validated vocabulary; attributes mirror llama.cpp's ``llama_vocab`` fields."""

    model: str  # tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    pre: str  # tokenizer.ggml.pre as written ("" when absent)
    family: str | None  # split family for BPE, None for SPM
    tokens: list[str]  # (n_vocab,) texts; invalid UTF-8 kept as surrogate escapes
    token_to_id: dict[str, int]
    scores: np.ndarray  # (n_vocab,) float32
    attrs: np.ndarray  # (n_vocab,) int32 llama_token_attr bits
    merges: list[str]  # BPE merges "left right", rank = position; empty for SPM
    special: dict[str, int | None] = field(default_factory=dict)
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    add_space_prefix: bool = False
    ignore_merges: bool = False
    clean_spaces: bool = False
    eog_ids: frozenset[int] = frozenset()

    @property
    def is_spm(self) -> bool:
        return self.model == "llama"

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


def _get(metadata: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = metadata.get(KEY + name)
    if value is None:
        return None
    if kind is bool:
        ok = isinstance(value, (bool, np.bool_))
    elif kind is int:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise TokenizerError(f"{KEY}{name} ({what}) has type {type(value).__name__}")
    return kind(value) if kind in (bool, int) else value


def _numeric_array(metadata: dict[str, Any], name: str, n: int, dtypes: tuple[str, ...]) -> Any:
    value = metadata.get(KEY + name)
    if value is None:
        return None
    if isinstance(value, list):
        try:
            value = np.asarray(value)
        except (TypeError, ValueError):
            raise TokenizerError(f"{KEY}{name} is not a numeric array") from None
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in dtypes:
        raise TokenizerError(f"{KEY}{name} is not a one-dimensional numeric array")
    if len(value) != n:
        raise TokenizerError(f"{KEY}{name} has {len(value)} entries but {KEY}tokens has {n}")
    return value


def load_vocab(metadata: dict[str, Any]) -> Vocab:
    """Build a :class:`Vocab` from GGUF metadata, or raise :class:`TokenizerError`."""
    model = _get(metadata, "model", str, "vocabulary type")
    if model is None:
        raise TokenizerError(f"{KEY}model is missing: the file has no tokenizer")
    if model in _UNSUPPORTED_MODELS:
        raise TokenizerError(
            f"vocabulary type {model!r} ({_UNSUPPORTED_MODELS[model]}) is not supported; "
            "edgeinfer reads 'llama' (SentencePiece) and 'gpt2' (byte-level BPE) vocabularies"
        )
    if model not in ("llama", "gpt2"):
        raise TokenizerError(f"unknown vocabulary type {model!r} in {KEY}model")
    pre = _get(metadata, "pre", str, "pre-tokenizer") or ""

    tokens = _tokens(metadata)
    n = len(tokens)
    vocab = Vocab(
        model=model,
        pre=pre,
        family=None,
        tokens=tokens,
        token_to_id={},
        scores=_scores(metadata, n),
        attrs=_attrs(metadata, n),
        merges=[],
    )
    if model == "llama":
        vocab.add_space_prefix = True
        vocab.add_bos = True
        defaults = {"bos": 1, "eos": 2, "unk": 0}
    else:
        defaults = _configure_bpe(vocab, metadata)
    prefix = _get(metadata, "add_space_prefix", bool, "flag")
    if prefix is not None:
        vocab.add_space_prefix = prefix

    vocab.token_to_id = dict(zip(tokens, range(n), strict=True))
    if len(vocab.token_to_id) != n:
        raise TokenizerError(f"{KEY}tokens holds the same token text twice")
    _check_byte_tokens(vocab)
    _read_special_ids(vocab, metadata, defaults)
    for flag in ("add_bos", "add_eos", "add_sep"):
        value = _get(metadata, flag + "_token", bool, "flag")
        if value is not None:
            setattr(vocab, flag, value)
    _mark_special_by_text(vocab)
    _apply_model_quirks(vocab, metadata)
    return vocab


def _tokens(metadata: dict[str, Any]) -> list[str]:
    tokens = metadata.get(KEY + "tokens")
    if tokens is None:
        raise TokenizerError(f"{KEY}tokens is missing: the file has no vocabulary")
    if not isinstance(tokens, list) or (tokens and set(map(type, tokens)) != {str}):
        raise TokenizerError(f"{KEY}tokens is not an array of strings")
    if not tokens:
        raise TokenizerError(f"{KEY}tokens is empty")
    if "" in tokens:
        # llama.cpp renames empty tokens so that they cannot collide
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    return tokens


def _scores(metadata: dict[str, Any], n: int) -> np.ndarray:
    scores = _numeric_array(metadata, "scores", n, ("f", "i"))
    if scores is None:
        return np.zeros(n, dtype=np.float32)
    if scores.dtype.kind == "f" and scores.dtype != np.float32:
        raise TokenizerError(f"{KEY}scores must be float32 or int32, not {scores.dtype}")
    return scores.astype(np.float32, copy=False)


def _attrs(metadata: dict[str, Any], n: int) -> np.ndarray:
    types = _numeric_array(metadata, "token_type", n, ("i", "u"))
    if types is None:
        return np.full(n, ATTR_NORMAL, dtype=np.int32)
    types = types.astype(np.int64)
    known = (types >= 0) & (types < len(_TYPE_TO_ATTR))
    return np.where(known, _TYPE_TO_ATTR[np.where(known, types, 0)], ATTR_UNDEFINED).astype(
        np.int32
    )


def _configure_bpe(vocab: Vocab, metadata: dict[str, Any]) -> dict[str, int]:
    """Apply the BPE defaults and the pre-tokenizer's flags; return the default special ids."""
    merges = metadata.get(KEY + "merges")
    if merges is None:
        raise TokenizerError(f"{KEY}merges is missing: a 'gpt2' vocabulary needs its merges")
    if not isinstance(merges, list) or (merges and set(map(type, merges)) != {str}):
        raise TokenizerError(f"{KEY}merges is not an array of strings")
    vocab.merges = merges
    name = vocab.pre or "default"
    pre = PRE_TOKENIZERS.get(name)
    if pre is None:
        raise TokenizerError(
            f"pre-tokenizer {name!r} ({KEY}pre) is not supported; supported: "
            + ", ".join(sorted(PRE_TOKENIZERS))
        )
    vocab.family = pre.family
    vocab.clean_spaces = pre.clean_spaces
    vocab.ignore_merges = pre.ignore_merges
    vocab.add_bos = pre.add_bos
    vocab.add_sep = pre.add_sep
    return {"eos": 11} if pre.no_bos else {"bos": 11, "eos": 11}


def _check_byte_tokens(vocab: Vocab) -> None:
    for i in np.nonzero(vocab.attrs & ATTR_BYTE)[0]:
        if len(vocab.tokens[i].encode("utf-8", "surrogateescape")) < 3:
            raise TokenizerError(
                f"byte token {int(i)} has text {vocab.tokens[i]!r}, not the form <0xXX>"
            )


def _read_special_ids(vocab: Vocab, metadata: dict[str, Any], defaults: dict[str, int]) -> None:
    n = vocab.n_vocab
    special: dict[str, int | None] = {name: None for _, name in _SPECIAL_KEYS}
    for name, default in defaults.items():
        special[name] = default if default < n else None
    for key, name in _SPECIAL_KEYS:
        value = _get(metadata, key, int, "token id")
        if value is None:
            continue
        if not 0 <= value < n:
            raise TokenizerError(f"{KEY}{key} is {value}, outside the vocabulary of {n} tokens")
        special[name] = value
    vocab.special = special


def _mark_special_by_text(vocab: Vocab) -> None:
    """Find end-of-turn and fill-in-the-middle tokens by text, as llama.cpp does.

    llama.cpp takes the first match in hash-map order when several texts match one role; we
    take the lowest id. Only the chosen token becomes a control token here.
    """
    t2i, attrs, special = vocab.token_to_id, vocab.attrs, vocab.special
    roles = {"eot": _EOT_TEXTS, **_FIM_TEXTS}
    for role, texts in roles.items():
        if special[role] is not None:
            continue
        found = [t2i[t] for t in texts if t in t2i]
        if found:
            special[role] = min(found)
            attrs[special[role]] |= ATTR_CONTROL


def _apply_model_quirks(vocab: Vocab, metadata: dict[str, Any]) -> None:
    """End-of-generation set and the per-model attribute fixes llama.cpp hard-codes."""
    t2i, attrs, special = vocab.token_to_id, vocab.attrs, vocab.special
    eog = {i for r in ("fim_pad", "fim_rep", "fim_sep") if (i := special[r]) is not None}
    for text in _EOG_TEXTS:
        if text in t2i:
            eog.add(t2i[text])
            attrs[t2i[text]] |= ATTR_CONTROL
    for text in _ALWAYS_RENDERED:
        if text in t2i:
            attrs[t2i[text]] = ATTR_USER_DEFINED
    eog |= {i for r in ("eos", "eot", "eom") if (i := special[r]) is not None}

    texts = {vocab.tokens[i]: i for i in eog}
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        # o200k_harmony and solar-open: <|end|> ends a message, not the generation
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = ATTR_NORMAL
    vocab.eog_ids = frozenset(int(i) for i in eog)
    _strip_attributes(vocab, metadata)


def _general_string(metadata: dict[str, Any], key: str) -> str:
    """A ``general.*`` string the quirks are chosen by; "" when absent."""
    value = metadata.get(key, "")
    if not isinstance(value, str):
        # llama.cpp refuses a key of the wrong type ("wrong type array but expected string")
        raise TokenizerError(f"{key} should be a string, not {type(value).__name__}")
    return value


def _strip_attributes(vocab: Vocab, metadata: dict[str, Any]) -> None:
    """The lstrip/rstrip attributes llama.cpp assigns by model name or architecture."""
    t2i, attrs = vocab.token_to_id, vocab.attrs
    name = _general_string(metadata, "general.name").lower()
    arch = _general_string(metadata, "general.architecture")

    def set_attr(text: str, bit: int, on: bool) -> None:
        if text not in t2i:
            raise TokenizerError(f"this model's vocabulary needs the token {text!r}")
        attrs[t2i[text]] = attrs[t2i[text]] | bit if on else attrs[t2i[text]] & ~bit

    if any(p in vocab.pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        a in arch for a in ("nomic-bert-moe", "jina-bert-v3")
    ):
        if "<mask>" in t2i:
            set_attr("<mask>", ATTR_LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        special = (attrs & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) != 0
        attrs[special] |= ATTR_RSTRIP
        set_attr("</s>", ATTR_RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, ATTR_RSTRIP, False)
    elif "modern-bert" in name and "[MASK]" in t2i:
        set_attr("[MASK]", ATTR_LSTRIP, True)
