"""A byte-level GGUF writer for tests, independent of edgeinfer's reader, with knobs to break
every field on purpose."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# value type codes of the GGUF spec
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
        BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}  # fmt: skip


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def encode_value(vtype: int, value: Any) -> bytes:
    if vtype == STRING:
        return _str(value)
    if vtype == ARRAY:
        etype, items = value
        out = struct.pack("<IQ", etype, len(items))
        return out + b"".join(encode_value(etype, v) for v in items)
    return struct.pack(_FMT[vtype], value)


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # GGML order
    ggml_type: int
    data: bytes
    offset: int | None = None  # relative offset override


@dataclass
class GGUFSpec:
    kv: list[tuple[str, int, Any]] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    version: int = 3
    magic: bytes = b"GGUF"
    alignment: int = 32
    n_tensors: int | None = None  # count overrides
    n_kv: int | None = None

    def add(self, key: str, vtype: int, value: Any) -> GGUFSpec:
        self.kv.append((key, vtype, value))
        return self

    def add_f32_tensor(self, name: str, values: np.ndarray) -> GGUFSpec:
        arr = np.ascontiguousarray(values, dtype=np.float32)
        self.tensors.append(Tensor(name, tuple(reversed(arr.shape)), 0, arr.tobytes()))
        return self

    def build(self) -> bytes:
        head = self.magic + struct.pack("<I", self.version)
        head += struct.pack("<QQ", len(self.tensors) if self.n_tensors is None else self.n_tensors,
                            len(self.kv) if self.n_kv is None else self.n_kv)  # fmt: skip
        for key, vtype, value in self.kv:
            head += _str(key) + struct.pack("<I", vtype) + encode_value(vtype, value)
        offsets, pos = [], 0
        for t in self.tensors:
            pos = -(-pos // self.alignment) * self.alignment
            offsets.append(pos if t.offset is None else t.offset)
            pos += len(t.data)
        for t, off in zip(self.tensors, offsets, strict=True):
            head += _str(t.name) + struct.pack("<I", len(t.shape))
            head += b"".join(struct.pack("<Q", d) for d in t.shape)
            head += struct.pack("<IQ", t.ggml_type, off)
        data_start = -(-len(head) // self.alignment) * self.alignment
        blob = bytearray(head + b"\0" * (data_start - len(head)))
        pos = 0
        for t in self.tensors:
            pos = -(-pos // self.alignment) * self.alignment
            blob += b"\0" * (data_start + pos - len(blob))
            blob += t.data
            pos += len(t.data)
        return bytes(blob)


def tiny_llama_spec(
    n_vocab: int = 64, n_embd: int = 32, n_layer: int = 1, seed: int = 0
) -> GGUFSpec:
    """A complete, loadable F32 llama model with a trivial SentencePiece-style vocabulary."""
    rng = np.random.default_rng(seed)
    spec = GGUFSpec()
    spec.add("general.architecture", STRING, "llama")
    spec.add("general.name", STRING, "tiny")
    for key, vt, v in (
        ("context_length", U32, 128), ("embedding_length", U32, n_embd),
        ("block_count", U32, n_layer),
        ("feed_forward_length", U32, 2 * n_embd), ("attention.head_count", U32, 4),
        ("attention.head_count_kv", U32, 2), ("attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("rope.freq_base", F32, 10000.0),
    ):  # fmt: skip
        spec.add(f"llama.{key}", vt, v)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(n_vocab - 3 - 8)]
    tokens += ["▁", "▁a", "▁b", "a", "b", "ab", "▁ab", "c"][: n_vocab - len(tokens)]
    types = [2, 3, 3] + [6] * (n_vocab - 3 - 8) + [1] * 8
    spec.add("tokenizer.ggml.model", STRING, "llama")
    spec.add("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    spec.add("tokenizer.ggml.scores", ARRAY, (F32, [float(-i) for i in range(n_vocab)]))
    spec.add("tokenizer.ggml.token_type", ARRAY, (I32, types))
    spec.add("tokenizer.ggml.bos_token_id", U32, 1)
    spec.add("tokenizer.ggml.eos_token_id", U32, 2)
    spec.add("tokenizer.ggml.unknown_token_id", U32, 0)

    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.1

    spec.add_f32_tensor("token_embd.weight", w(n_vocab, n_embd))
    spec.add_f32_tensor("output_norm.weight", np.ones(n_embd))
    kv_dim = n_embd // 2
    for i in range(n_layer):
        p = f"blk.{i}."
        spec.add_f32_tensor(p + "attn_norm.weight", np.ones(n_embd))
        spec.add_f32_tensor(p + "attn_q.weight", w(n_embd, n_embd))
        spec.add_f32_tensor(p + "attn_k.weight", w(kv_dim, n_embd))
        spec.add_f32_tensor(p + "attn_v.weight", w(kv_dim, n_embd))
        spec.add_f32_tensor(p + "attn_output.weight", w(n_embd, n_embd))
        spec.add_f32_tensor(p + "ffn_norm.weight", np.ones(n_embd))
        spec.add_f32_tensor(p + "ffn_gate.weight", w(2 * n_embd, n_embd))
        spec.add_f32_tensor(p + "ffn_up.weight", w(2 * n_embd, n_embd))
        spec.add_f32_tensor(p + "ffn_down.weight", w(n_embd, 2 * n_embd))
    return spec
