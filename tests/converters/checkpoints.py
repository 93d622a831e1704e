"""Tiny random Hugging Face checkpoints, one per architecture, written here with numpy.

Each folder is what a hub download holds: config.json, weights as safetensors (one file or
shards with their index; F32, F16 or BF16), tokenizer files (byte-level BPE tokenizer.json,
or a SentencePiece tokenizer.model encoded here as protobuf), tokenizer_config.json with a
chat template and special tokens, and generation_config.json. The shapes follow the real
families (grouped-query attention, Qwen 3's separate head size, Gemma 3's sliding-window
layers and norms) at a small size; some sizes are deliberately not multiples of 256, so that
the quantization mixes need their fallbacks.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.fixtures.vocab import VocabSpec

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# the Split regexes of Llama 3's and Qwen 2's tokenizer.json, as published
LLAMA3_SPLIT_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


# --- safetensors --------------------------------------------------------------------------


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def encode_tensor(x: np.ndarray, dtype: str) -> bytes:
    if dtype == "F32":
        return np.ascontiguousarray(x, dtype="<f4").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(x, dtype="<f2").tobytes()
    if dtype == "BF16":
        return _bf16_bits(x).astype("<u2").tobytes()
    raise ValueError(dtype)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "F32") -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, pos = [], 0
    for name, x in tensors.items():
        blob = encode_tensor(x, dtype)
        header[name] = {
            "dtype": dtype,
            "shape": list(x.shape),
            "data_offsets": [pos, pos + len(blob)],
        }
        blobs.append(blob)
        pos += len(blob)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for blob in blobs:
            f.write(blob)


def write_weights(
    folder: Path, tensors: dict[str, np.ndarray], dtype: str, shards: int = 1
) -> None:
    if shards == 1:
        write_safetensors(folder / "model.safetensors", tensors, dtype)
        return
    names = list(tensors)
    per = math.ceil(len(names) / shards)
    weight_map = {}
    for i in range(shards):
        part = names[i * per : (i + 1) * per]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(folder / file, {n: tensors[n] for n in part}, dtype)
        weight_map.update({n: file for n in part})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


# --- tokenizers ---------------------------------------------------------------------------


def bpe_tokenizer_json(spec: VocabSpec, style: str) -> dict[str, Any]:
    """tokenizer.json of a byte-level BPE vocabulary, laid out like Llama 3's or Qwen 2's."""
    vocab = {t: i for i, t in enumerate(spec.tokens) if spec.token_types[i] == NORMAL}
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": spec.token_types[i] == CONTROL}
        for i, t in enumerate(spec.tokens) if spec.token_types[i] != NORMAL
    ]  # fmt: skip
    regex = LLAMA3_SPLIT_RE if style == "llama3" else QWEN2_SPLIT_RE
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": False,
    }
    if style == "llama3":
        bos = spec.tokens[spec.special_ids["bos"]]
        post: dict[str, Any] = {
            "type": "Sequence",
            "processors": [
                {**byte_level, "trim_offsets": False},
                {"type": "TemplateProcessing",
                 "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                            {"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                          {"Sequence": {"id": "A", "type_id": 0}},
                          {"SpecialToken": {"id": bos, "type_id": 1}},
                          {"Sequence": {"id": "B", "type_id": 1}}],
                 "special_tokens": {bos: {"id": bos, "ids": [spec.special_ids["bos"]],
                                          "tokens": [bos]}}},
            ],
        }  # fmt: skip
    else:
        post = {**byte_level, "add_prefix_space": False, "trim_offsets": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            byte_level,
        ]},
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": style == "llama3", "vocab": vocab,
                  "merges": [m.split(" ") for m in spec.merges]},
    }  # fmt: skip


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    key = _varint(number << 3 | wire)
    if wire == 0:
        return key + _varint(int(payload))
    if wire == 2:
        return key + _varint(len(payload)) + payload  # type: ignore[arg-type]  # bytes for wire 2
    return key + payload  # type: ignore[operator]  # bytes for the fixed-size wire types


def spm_model_bytes(
    pieces: list[str], scores: list[float], types: list[int], *, unk_id: int, bos_id: int,
    eos_id: int, pad_id: int = -1, add_dummy_prefix: bool = False,
) -> bytes:  # fmt: skip
    """A SentencePiece ModelProto (BPE, byte fallback) holding these pieces."""
    # joined once: growing one bytes object piece by piece is quadratic (minutes at 262k pieces)
    out = b"".join(
        _field(
            1, 2, _field(1, 2, p.encode()) + _field(2, 5, struct.pack("<f", s)) + _field(3, 0, t)
        )
        for p, s, t in zip(pieces, scores, types, strict=True)
    )
    trainer = (
        _field(3, 0, 2) + _field(4, 0, len(pieces)) + _field(35, 0, 1) + _field(40, 0, unk_id)
        + _field(41, 0, bos_id) + _field(42, 0, eos_id) + _field(43, 0, pad_id)
        + b"".join(_field(45 + k, 2, pieces[i].encode())
                   for k, i in enumerate((unk_id, bos_id, eos_id, pad_id)))
    )  # fmt: skip
    normalizer = (
        _field(1, 2, b"identity")
        + _field(3, 0, int(add_dummy_prefix))
        + _field(4, 0, 0)
        + _field(5, 0, 1)
    )
    return out + _field(2, 2, trainer) + _field(3, 2, normalizer)


@dataclass
class SpmVocab:
    pieces: list[str]
    scores: list[float]
    types: list[int]
    ids: dict[str, int]  # "<bos>" -> id, ...


# --- models -------------------------------------------------------------------------------


@dataclass
class CheckpointSpec:
    hf_arch: str
    model_type: str
    vocab: str  # "llama3", "qwen2" (tokenizer.json) or "spm" (tokenizer.model)
    hidden: int = 256
    ff: int = 512
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int | None = None
    extra_vocab_rows: int = 0  # embedding rows beyond the tokenizer's tokens
    tied: bool = False
    dtype: str = "F32"
    shards: int = 1
    config: dict[str, Any] = field(default_factory=dict)


SPECS: dict[str, CheckpointSpec] = {
    # Llama 3.1 style: byte-level BPE, rope scaling as rope_freqs, old-style config keys
    "llama": CheckpointSpec(
        "LlamaForCausalLM", "llama", "llama3",
        config={"rope_theta": 500000.0, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192}},
    ),
    # Mistral 7B style: SentencePiece with a dummy prefix, BF16 weights in two shards
    "mistral": CheckpointSpec(
        "MistralForCausalLM", "mistral", "spm", n_head=8, n_head_kv=2, dtype="BF16", shards=2,
        config={"rope_theta": 1000000.0, "sliding_window": None, "max_position_embeddings": 32768},
    ),
    # Qwen 2.5 style: biases, tied embeddings, vocabulary padded beyond the tokenizer, F16
    "qwen2": CheckpointSpec(
        "Qwen2ForCausalLM", "qwen2", "qwen2", tied=True, extra_vocab_rows=40, dtype="F16",
        config={"rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": None},
    ),
    # Qwen 3 style: per-head q/k norms, head size 128 with a 256 hidden size
    "qwen3": CheckpointSpec(
        "Qwen3ForCausalLM", "qwen3", "qwen2", head_dim=128,
        config={"rope_theta": 1000000.0, "attention_bias": False},
    ),
    # Gemma 3 style: sizes that are not multiples of 256, a sliding window shorter than the
    # test prompts, a global layer every sixth, embedding rows beyond the tokenizer, softcap
    "gemma3": CheckpointSpec(
        "Gemma3ForCausalLM", "gemma3_text", "spm", hidden=320, ff=640, n_layer=7, n_head=4,
        n_head_kv=1, head_dim=64, tied=True, extra_vocab_rows=24,
        config={"query_pre_attn_scalar": 64, "sliding_window": 8, "final_logit_softcapping": 30.0,
                "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 32768,
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                }},
    ),
}  # fmt: skip


def _weight(rng: np.random.Generator, rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
    return (rng.standard_normal((rows, cols)) * (gain / np.sqrt(cols))).astype(np.float32)


def hf_tensors(spec: CheckpointSpec, n_vocab_rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    e, ff = spec.hidden, spec.ff
    hd = spec.head_dim or e // spec.n_head
    q, kv = spec.n_head * hd, spec.n_head_kv * hd
    gemma = spec.model_type == "gemma3_text"

    def norm(n: int) -> np.ndarray:  # Gemma stores w of x * (1 + w)
        return ((0.0 if gemma else 1.0) + 0.1 * rng.standard_normal(n)).astype(np.float32)

    out = {
        "model.embed_tokens.weight": _weight(
            rng, n_vocab_rows, e, gain=np.sqrt(e) * (0.05 if not gemma else 0.02)
        )
    }
    for i in range(spec.n_layer):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(e)
        out[p + "self_attn.q_proj.weight"] = _weight(rng, q, e, 2.0)
        out[p + "self_attn.k_proj.weight"] = _weight(rng, kv, e, 2.0)
        out[p + "self_attn.v_proj.weight"] = _weight(rng, kv, e)
        out[p + "self_attn.o_proj.weight"] = _weight(rng, e, q)
        if spec.model_type == "qwen2":
            for name, n in (("q", q), ("k", kv), ("v", kv)):
                out[p + f"self_attn.{name}_proj.bias"] = (0.1 * rng.standard_normal(n)).astype(
                    np.float32
                )
        if spec.model_type in ("qwen3", "gemma3_text"):
            out[p + "self_attn.q_norm.weight"] = norm(hd)
            out[p + "self_attn.k_norm.weight"] = norm(hd)
        out[p + "post_attention_layernorm.weight"] = norm(e)
        if gemma:
            out[p + "pre_feedforward_layernorm.weight"] = norm(e)
            out[p + "post_feedforward_layernorm.weight"] = norm(e)
        out[p + "mlp.gate_proj.weight"] = _weight(rng, ff, e, 2.0)
        out[p + "mlp.up_proj.weight"] = _weight(rng, ff, e)
        out[p + "mlp.down_proj.weight"] = _weight(rng, e, ff)
    out["model.norm.weight"] = norm(e)
    if not spec.tied:
        out["lm_head.weight"] = _weight(rng, n_vocab_rows, e, gain=4.0)
    return out


def hf_config(spec: CheckpointSpec, n_vocab_rows: int, special: dict[str, int]) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": [spec.hf_arch], "model_type": spec.model_type,
        "vocab_size": n_vocab_rows, "hidden_size": spec.hidden, "intermediate_size": spec.ff,
        "num_hidden_layers": spec.n_layer, "num_attention_heads": spec.n_head,
        "num_key_value_heads": spec.n_head_kv, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": spec.tied,
        "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[spec.dtype],
        "bos_token_id": special.get("bos"), "eos_token_id": special.get("eos"),
    }  # fmt: skip
    if spec.model_type != "gemma3_text":
        cfg["hidden_act"] = "silu"
    if spec.head_dim:
        cfg["head_dim"] = spec.head_dim
    cfg.update(spec.config)
    return cfg


def write_checkpoint(
    folder: Path, arch: str, vocabs: dict[str, Any], *, seed: int = 0, **overrides: Any
) -> Path:
    """Writes the checkpoint ``arch`` of SPECS into ``folder``; ``vocabs`` holds the
    vocabularies by kind ("llama3", "qwen2": VocabSpec; "spm": SpmVocab)."""
    from dataclasses import replace

    spec = replace(SPECS[arch], **overrides)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = vocabs[spec.vocab]
    tc: dict[str, Any] = {"chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False}
    if spec.vocab == "spm":
        n_tokens = len(vocab.pieces)
        special = {
            "bos": vocab.ids["<bos>"],
            "eos": vocab.ids["<eos>"],
            "unk": vocab.ids["<unk>"],
            "pad": vocab.ids["<pad>"],
        }
        (folder / "tokenizer.model").write_bytes(spm_model_bytes(
            vocab.pieces, vocab.scores, vocab.types, unk_id=special["unk"], bos_id=special["bos"],
            eos_id=special["eos"], pad_id=special["pad"], add_dummy_prefix=arch == "mistral",
        ))  # fmt: skip
        tc.update(bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>",
                  add_bos_token=True, add_eos_token=False)  # fmt: skip
    else:
        n_tokens = len(vocab.tokens)
        special = dict(vocab.special_ids)
        (folder / "tokenizer.json").write_text(
            json.dumps(bpe_tokenizer_json(vocab, spec.vocab), ensure_ascii=False)
        )
        tc.update({f"{role}_token": vocab.tokens[i] for role, i in special.items()})
        if spec.vocab == "qwen2":
            tc["add_bos_token"] = False
    n_rows = n_tokens + spec.extra_vocab_rows
    (folder / "config.json").write_text(json.dumps(hf_config(spec, n_rows, special), indent=1))
    (folder / "tokenizer_config.json").write_text(json.dumps(tc, indent=1))
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": special.get("bos"), "eos_token_id": [special["eos"]]})
    )
    write_weights(folder, hf_tensors(spec, n_rows, seed), spec.dtype, spec.shards)
    return folder
