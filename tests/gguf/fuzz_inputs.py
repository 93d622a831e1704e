"""Hand-made inputs of the GGUF fuzz target, one per error class of the bad-file tests.

They are kept as files in ``tests/fuzz/regressions/fuzz_gguf/`` (which the fuzz tests replay
and a long run can start from); ``python -m tests.gguf.fuzz_inputs`` writes them again.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

from tests.gguf.craft import ARRAY, F32, I32, STRING, U8, U32, GGUFSpec, Tensor, tiny_llama_spec

FOLDER = Path(__file__).resolve().parents[1] / "fuzz" / "regressions" / "fuzz_gguf"


def _with_kv(key: str, vtype: int, value: object) -> bytes:
    spec = tiny_llama_spec()
    spec.kv = [(k, vtype, value) if k == key else (k, t, v) for k, t, v in spec.kv]
    return spec.build()


def _without(key: str = "", tensor: str = "") -> bytes:
    spec = tiny_llama_spec()
    spec.kv = [kv for kv in spec.kv if kv[0] != key]
    spec.tensors = [t for t in spec.tensors if t.name != tensor]
    return spec.build()


def _patched(after: bytes, skip: int, value: bytes) -> bytes:
    blob = tiny_llama_spec().build()
    at = blob.index(after) + len(after) + skip
    return blob[:at] + value + blob[at + len(value) :]


def _spec(change: Callable[[GGUFSpec], None], **kw: int) -> bytes:
    spec = tiny_llama_spec(**kw)
    change(spec)
    return spec.build()


def _tensor_offset(spec: GGUFSpec) -> None:
    spec.tensors[-1].offset = 1 << 40


def _misaligned(spec: GGUFSpec) -> None:
    spec.tensors[1].offset = 32 * 10 + 4


def _tensor_type(spec: GGUFSpec) -> None:
    spec.tensors[1].ggml_type = 99


def _duplicate(spec: GGUFSpec) -> None:
    spec.add("general.name", STRING, "again")


def _long_array(spec: GGUFSpec) -> None:
    spec.add("general.tags", ARRAY, (U8, [0] * 70_000))  # past the cap of other arrays


def _extra_layer(spec: GGUFSpec) -> None:
    spec.kv = [(k, U32, 1) if k == "llama.block_count" else (k, t, v) for k, t, v in spec.kv]


def _bad_magic() -> bytes:
    return b"GGML" + tiny_llama_spec().build()[4:]


def _version() -> bytes:
    spec = tiny_llama_spec()
    spec.version = 4
    return spec.build()


def _square_embedding(spec: GGUFSpec) -> None:
    emb = spec.tensors[0]
    spec.tensors[0] = Tensor(emb.name, (emb.shape[0], emb.shape[1] - 1), 0, emb.data[:-128])


def _byte_level_vocabulary(bad_token: bytes) -> bytes:
    """A ``gpt2`` vocabulary whose last (normal) token holds ``bad_token``'s raw bytes."""
    spec = tiny_llama_spec()
    n_vocab = 64
    tokens: list[str | bytes] = [chr(0x21 + i) for i in range(n_vocab - 1)]  # map to themselves
    tokens.append(bad_token)
    replaced = {
        "tokenizer.ggml.model": (STRING, "gpt2"),
        "tokenizer.ggml.tokens": (ARRAY, (STRING, tokens)),
        "tokenizer.ggml.token_type": (ARRAY, (I32, [1] * n_vocab)),
    }
    spec.kv = [(k, *replaced[k]) if k in replaced else (k, t, v) for k, t, v in spec.kv]
    spec.add("tokenizer.ggml.pre", STRING, "qwen2")
    spec.add("tokenizer.ggml.merges", ARRAY, (STRING, ['! "']))
    return spec.build()


def crafted() -> dict[str, bytes]:
    """File name -> input; each name says the error it is made to reach."""
    return {
        "bad-magic": _bad_magic(),
        "unsupported-version": _version(),
        "truncated-metadata": tiny_llama_spec().build()[:400],
        "absurd-name-length": _patched(b"general.name", 4, struct.pack("<Q", 1 << 50)),
        "absurd-array-length": _spec(_long_array),
        "duplicate-key": _spec(_duplicate),
        "unknown-value-type": _patched(b"general.name", 0, struct.pack("<I", 77)),
        "unknown-tensor-type": _spec(_tensor_type),
        "misaligned-tensor": _spec(_misaligned),
        "tensor-out-of-bounds": _spec(_tensor_offset),
        "missing-key": _without(key="llama.embedding_length"),
        "missing-tensor": _without(tensor="blk.0.ffn_up.weight"),
        "misshapen-embedding": _spec(_square_embedding),
        # int(NaN) escaped as ValueError from a float per-layer array (found reading base.py)
        "per-layer-nan": _with_kv("llama.attention.head_count_kv", ARRAY, (F32, [float("nan")])),
        # an array general.name made the tokenizer's quirk lookup raise ValueError
        "name-array": _with_kv("general.name", ARRAY, (U8, [1, 2])),
        "unknown-architecture": _with_kv("general.architecture", STRING, "mamba9"),
        "unused-layer-tensor": _spec(_extra_layer, n_layer=2),
        "unsupported-vocabulary": _with_kv("tokenizer.ggml.model", STRING, "bert"),
        # chr() of U+1FFFFF escaped as ValueError when detokenizing (found reading gpt2_decode)
        "token-past-u10ffff": _byte_level_vocabulary(b"\xf7\xbf\xbf\xbf"),
        "unsupported-rope-scaling": _spec(
            lambda s: s.add("llama.rope.scaling.type", STRING, "yarn")
        ),
    }


def write(folder: Path = FOLDER) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in crafted().items():
        (folder / f"crafted-{name}").write_bytes(data)


if __name__ == "__main__":
    write()
