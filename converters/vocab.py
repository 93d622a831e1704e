"""Tokenizer files -> GGUF ``tokenizer.ggml.*`` metadata, as llama.cpp's converter writes it.

Two kinds of vocabulary:

* byte-level BPE from ``tokenizer.json`` (GGUF model ``gpt2``): tokens, merges, token types
  (added special tokens are control tokens, other added tokens user-defined), and the
  pre-tokenizer's llama.cpp name, recognised from the pre-tokenizer's structure and regex
  (llama.cpp hashes a test string's tokens instead, which needs the tokenizer to run);
* SentencePiece from ``tokenizer.model`` (GGUF model ``llama``): pieces, scores and types.

Then what both share: special token ids (from tokenizer_config.json, falling back to
config.json and generation_config.json), whether BOS/EOS are added, and the chat template.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.converters import errors
from edgeinfer.converters.architectures.base import MetadataItem, kv
from edgeinfer.converters.hf_folder import HFCheckpoint, read_json, read_text
from edgeinfer.converters.sentencepiece_model import parse_sentencepiece
from edgeinfer.gguf.constants import ValueType

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPECIAL_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
_GGUF_ID_KEYS = {
    "bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
    "sep": "seperator_token_id", "pad": "padding_token_id", "cls": "cls_token_id",
    "mask": "mask_token_id", "eot": "eot_token_id",
}  # fmt: skip

# Split regexes of the byte-level pre-tokenizers, as tokenizer.json spells them
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLIT_NAMES = {LLAMA3_SPLIT: "llama-bpe", QWEN2_SPLIT: "qwen2"}


@dataclass
class Vocabulary:
    """Every ``tokenizer.ggml.*`` value of one converted vocabulary."""

    model: str  # "gpt2" or "llama"
    pre: str
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    merges: list[str] = field(default_factory=list)
    special_ids: dict[str, int] = field(default_factory=dict)
    add_bos: bool | None = None
    add_eos: bool | None = None
    add_space_prefix: bool | None = None
    chat_templates: dict[str, str] = field(default_factory=dict)  # "" = the default one

    def resize(self, n: int, where: str) -> None:
        """Pads with unused ``[PADi]`` tokens up to ``n`` (llama.cpp's convention)."""
        if len(self.tokens) > n:
            raise errors.TokenizerConversionError(
                f"{where}: the tokenizer has {len(self.tokens)} tokens, the embedding {n} rows"
            )
        for i in range(len(self.tokens), n):
            self.tokens.append(f"[PAD{i}]")
            self.types.append(UNUSED)
            if self.scores is not None:
                self.scores.append(-10000.0)

    def metadata(self) -> list[MetadataItem]:
        k = "tokenizer.ggml."
        items = [
            kv(k + "model", ValueType.STRING, self.model),
            kv(k + "pre", ValueType.STRING, self.pre),
            kv(k + "tokens", ValueType.ARRAY, self.tokens, ValueType.STRING),
        ]
        if self.scores is not None:
            items.append(kv(k + "scores", ValueType.ARRAY, self.scores, ValueType.FLOAT32))
        items.append(kv(k + "token_type", ValueType.ARRAY, self.types, ValueType.INT32))
        if self.merges:
            items.append(kv(k + "merges", ValueType.ARRAY, self.merges, ValueType.STRING))
        for role, token_id in self.special_ids.items():
            items.append(kv(k + _GGUF_ID_KEYS[role], ValueType.UINT32, token_id))
        for name in ("add_bos", "add_eos"):
            value = getattr(self, name)
            if value is not None:
                items.append(kv(f"{k}{name}_token", ValueType.BOOL, value))
        if self.add_space_prefix is not None:
            items.append(kv(k + "add_space_prefix", ValueType.BOOL, self.add_space_prefix))
        for name, template in self.chat_templates.items():
            key = "tokenizer.chat_template" + (f".{name}" if name else "")
            items.append(kv(key, ValueType.STRING, template))
        return items


def convert_vocabulary(ckpt: HFCheckpoint, max_tokens: int = 1 << 24) -> Vocabulary:
    """The checkpoint's vocabulary: byte-level BPE from tokenizer.json when it is one,
    otherwise SentencePiece from tokenizer.model. Token ids must lie below ``max_tokens``
    (the embedding's rows)."""
    tj_path = ckpt.file("tokenizer.json")
    tokenizer_json = read_json(tj_path) if tj_path else None
    if tokenizer_json is not None and not isinstance(tokenizer_json, dict):
        raise errors.TokenizerConversionError(f"{tj_path}: not a JSON object")
    if tj_path and tokenizer_json is not None and _is_byte_level(tokenizer_json):
        vocab = _bpe_vocabulary(ckpt, tokenizer_json, tj_path, max_tokens)
    elif ckpt.file("tokenizer.model"):
        vocab = _spm_vocabulary(ckpt, max_tokens)
    elif tokenizer_json is not None:
        raise errors.TokenizerConversionError(
            f"{tj_path}: only byte-level BPE tokenizer.json files can be converted; "
            "a SentencePiece-style vocabulary needs its tokenizer.model"
        )
    else:
        raise errors.MissingSourceFileError(
            f"{ckpt.folder}: no tokenizer (tokenizer.json or tokenizer.model)"
        )
    _special_tokens(ckpt, vocab, tokenizer_json or {})
    vocab.chat_templates = _chat_templates(ckpt)
    return vocab


# --- byte-level BPE ---------------------------------------------------------------------------


def _steps(node: Any) -> list[dict[str, Any]]:
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        inner = node.get("pretokenizers") or node.get("decoders") or node.get("processors") or []
        return [s for n in inner for s in _steps(n)] if isinstance(inner, list) else []
    return [node]


def _is_byte_level(tj: dict[str, Any]) -> bool:
    model = tj.get("model")
    return (
        isinstance(model, dict) and model.get("type") == "BPE"
        and any(s.get("type") == "ByteLevel" for s in _steps(tj.get("pre_tokenizer")))
    )  # fmt: skip


def pre_tokenizer_name(tj: dict[str, Any], clean_spaces: bool, where: str) -> str:
    """llama.cpp's ``tokenizer.ggml.pre`` name for the pre-tokenizer of ``tokenizer.json``."""
    steps = _steps(tj.get("pre_tokenizer"))
    kinds = [s.get("type") for s in steps]
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        pattern = steps[0].get("pattern")
        regex = pattern.get("Regex") if isinstance(pattern, dict) else None
        if isinstance(regex, str) and regex in SPLIT_NAMES:
            return SPLIT_NAMES[regex]
        raise errors.TokenizerConversionError(
            f"{where}: the pre-tokenizer regex {str(regex)[:80]!r}... is not one of "
            "llama.cpp's (Llama 3, Qwen 2)"
        )
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if (
        kinds == ["Digits", "ByteLevel"]
        and steps[0].get("individual_digits")
        and steps[1].get("use_regex", True)
    ):
        return "starcoder" if clean_spaces else "smollm"
    raise errors.TokenizerConversionError(
        f"{where}: pre-tokenizer {' + '.join(map(str, kinds))} is not one llama.cpp implements"
    )


def _merges(model: dict[str, Any], where: str) -> list[str]:
    merges = model.get("merges") or []
    if not isinstance(merges, list):
        raise errors.TokenizerConversionError(f"{where}: model.merges is not a list")
    out = []
    for m in merges:
        if isinstance(m, str) and m.count(" ") == 1:
            out.append(m)
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m):
            # the pair form may hold spaces, which the "a b" form cannot: GGUF spells them Ġ
            out.append(" ".join(p.replace(" ", chr(ord(" ") + 256)) for p in m))
        else:
            raise errors.TokenizerConversionError(f"{where}: bad merge {m!r}")
    return out


def looks_special(token: str) -> bool:
    """Added tokens llama.cpp makes control tokens even when not flagged special."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<｜") and token.endswith("｜>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


def _check_id(i: Any, max_tokens: int, what: str, where: str) -> int:
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        raise errors.TokenizerConversionError(f"{where}: {what} has id {i!r}")
    if i >= max_tokens:
        raise errors.TokenizerConversionError(
            f"{where}: {what} has id {i}, beyond the embedding's {max_tokens} rows"
        )
    return i


def _bpe_vocabulary(
    ckpt: HFCheckpoint, tj: dict[str, Any], path: Path, max_tokens: int
) -> Vocabulary:
    where = str(path)
    model = tj["model"]
    table = model.get("vocab")
    if not isinstance(table, dict) or not table:
        raise errors.TokenizerConversionError(f"{where}: model.vocab is missing or empty")
    by_id: dict[int, tuple[str, int]] = {}
    for token, i in table.items():
        _check_id(i, max_tokens, f"token {token!r}", where)
        if i in by_id:
            raise errors.TokenizerConversionError(f"{where}: id {i} is given to two tokens")
        by_id[i] = (token, NORMAL)
    added_tokens = tj.get("added_tokens") or []
    if not isinstance(added_tokens, list):
        raise errors.TokenizerConversionError(f"{where}: added_tokens is not a list")
    for added in added_tokens:
        if not isinstance(added, dict) or not isinstance(added.get("content"), str):
            raise errors.TokenizerConversionError(f"{where}: bad added token {added!r}")
        content = added["content"]
        i = _check_id(added.get("id"), max_tokens, f"added token {content!r}", where)
        if i in by_id and by_id[i][0] != content:
            raise errors.TokenizerConversionError(
                f"{where}: id {i} is {by_id[i][0]!r} in the vocabulary but added as {content!r}"
            )
        special = bool(added.get("special")) or looks_special(content)
        by_id[i] = (content, CONTROL if special else USER_DEFINED)
    n = max(by_id) + 1
    tokens = [by_id[i][0] if i in by_id else f"[PAD{i}]" for i in range(n)]
    types = [by_id[i][1] if i in by_id else UNUSED for i in range(n)]
    clean = ckpt.tokenizer_config.get("clean_up_tokenization_spaces", True) is not False
    return Vocabulary(
        model="gpt2", pre=pre_tokenizer_name(tj, clean, where), tokens=tokens, types=types,
        merges=_merges(model, where),
    )  # fmt: skip


# --- SentencePiece ----------------------------------------------------------------------------


def _spm_vocabulary(ckpt: HFCheckpoint, max_tokens: int) -> Vocabulary:
    path = ckpt.folder / "tokenizer.model"
    spm = parse_sentencepiece(path)
    if len(spm.pieces) > max_tokens:
        raise errors.TokenizerConversionError(
            f"{path}: {len(spm.pieces)} pieces, more than the embedding's {max_tokens} rows"
        )
    tokens, scores, types = list(spm.pieces), list(spm.scores), list(spm.types)
    # added tokens of tokenizer_config.json take their ids over, as in llama.cpp
    decoder = ckpt.tokenizer_config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise errors.TokenizerConversionError(
            f"{ckpt.folder}: added_tokens_decoder is not an object"
        )
    for key, data in decoder.items():
        content = data.get("content") if isinstance(data, dict) else None
        # ASCII digits only: int() refuses other Unicode digits ("²") and over 4300 of them
        is_id = key.isascii() and key.isdigit() and len(key) < 10
        if not is_id or not isinstance(content, str):
            raise errors.TokenizerConversionError(f"{ckpt.folder}: bad added token {key!r}")
        i = _check_id(int(key), max_tokens, f"added token {content!r}", str(ckpt.folder))
        while len(tokens) <= i:
            tokens.append(f"[PAD{len(tokens)}]")
            scores.append(-10000.0)
            types.append(UNUSED)
        if data.get("special") or looks_special(content):
            types[i] = CONTROL
        else:
            content = content.replace("\u2581", " ")
            types[i] = USER_DEFINED
        tokens[i], scores[i] = content, -1000.0
    vocab = Vocabulary(
        model="llama", pre="default", tokens=tokens, types=types, scores=scores,
        add_space_prefix=spm.add_dummy_prefix,
    )  # fmt: skip
    for role in ("unk", "bos", "eos", "pad"):
        i = spm.special_id(role)
        if i >= 0:
            vocab.special_ids[role] = i
    return vocab


# --- what both kinds share ----------------------------------------------------------------------


def _token_text(entry: Any) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _special_tokens(ckpt: HFCheckpoint, vocab: Vocabulary, tj: dict[str, Any]) -> None:
    """Special ids from tokenizer_config.json's token texts, then config.json's and
    generation_config.json's ids; add_bos/add_eos from the config or the post-processor."""
    index = {t: i for i, t in enumerate(vocab.tokens)}
    tc = ckpt.tokenizer_config
    found: dict[str, int] = {}
    for role in SPECIAL_ROLES:
        text = _token_text(tc.get(f"{role}_token"))
        if text is not None and text in index:
            found[role] = index[text]
    for source in (ckpt.config, ckpt.generation_config):
        for role in ("bos", "eos", "pad"):
            i = _first_id(source.get(f"{role}_token_id"))
            if role not in found and i is not None and i < len(vocab.tokens):
                found[role] = i
    vocab.special_ids = {**vocab.special_ids, **found}
    add = _post_processor_adds(tj, vocab)
    for name in ("bos", "eos"):
        value = tc.get(f"add_{name}_token")
        if isinstance(value, bool):
            add[name] = value
    vocab.add_bos, vocab.add_eos = add.get("bos", vocab.add_bos), add.get("eos", vocab.add_eos)
    prefix = tc.get("add_prefix_space")
    if vocab.model == "llama" and isinstance(prefix, bool):
        vocab.add_space_prefix = prefix


def _template_special_id(item: Any, specials: dict[str, Any]) -> int | None:
    """The id of a TemplateProcessing item that is one special token, else None."""
    token = item.get("SpecialToken") if isinstance(item, dict) else None
    name = token.get("id") if isinstance(token, dict) else None
    special = specials.get(name) if isinstance(name, str) else None
    ids = special.get("ids") if isinstance(special, dict) else None
    return ids[0] if isinstance(ids, list) and len(ids) == 1 else None


def _post_processor_adds(tj: dict[str, Any], vocab: Vocabulary) -> dict[str, bool]:
    """Whether tokenizer.json's post-processor adds BOS (first) and EOS (last) to one text."""
    out: dict[str, bool] = {}
    for step in _steps(tj.get("post_processor")):
        if step.get("type") == "ByteLevel":
            out.setdefault("bos", False)
            out.setdefault("eos", False)
        elif step.get("type") == "TemplateProcessing" and isinstance(step.get("single"), list):
            single, specials = step["single"], step.get("special_tokens") or {}
            if not single:
                continue
            if not isinstance(specials, dict):
                specials = {}
            for role, item in (("bos", single[0]), ("eos", single[-1])):
                found = _template_special_id(item, specials)
                out[role] = found is not None and found == vocab.special_ids.get(role)
    return out


def _chat_templates(ckpt: HFCheckpoint) -> dict[str, str]:
    """Templates by name ("" for the default) from tokenizer_config.json, or from
    chat_template.jinja / chat_template.json next to it."""
    template: Any = ckpt.tokenizer_config.get("chat_template")
    if template is None and ckpt.file("chat_template.jinja"):
        template = read_text(
            ckpt.folder / "chat_template.jinja", error=errors.TokenizerConversionError
        )
    elif template is None and ckpt.file("chat_template.json"):
        data = read_json(ckpt.folder / "chat_template.json")
        template = data.get("chat_template") if isinstance(data, dict) else None
    if template is None:
        return {}
    if isinstance(template, str):
        return {"": template}
    if isinstance(template, list):
        out = {}
        for item in template:
            if not isinstance(item, dict) or not isinstance(item.get("template"), str):
                raise errors.TokenizerConversionError(f"{ckpt.folder}: bad chat template entry")
            name = item.get("name", "default")
            out["" if name == "default" else str(name)] = item["template"]
        return out
    raise errors.TokenizerConversionError(
        f"{ckpt.folder}: chat_template is neither text nor a list"
    )
