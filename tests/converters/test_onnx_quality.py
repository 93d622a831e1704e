"""Quantized ONNX exports: exact against their own dequantized weights, and their quality on
real weights next to llama.cpp's types of the same kind.

Exactness: an INT4/INT8 export computes what edgeinfer's reference engine computes on an F32
GGUF whose matrices hold the same quantized-then-dequantized values. That pins down the
MatMulNBits and GatherBlockQuantized layouts (zero points, padded last blocks, the tied
embedding read through the output's codes) independently of how sensitive a model is.

Quality (slow): KL against the F32 GGUF on a real-weights Gemma 3 folder taken off its grid
(see real_gemma.py). Symmetric INT4 block 32 is Q4_0's scheme (max / -8,
round to nearest) with a float32 rather than float16 scale, and onnxruntime does not round
activations to int8 as GGML does for Q4_0; its KL is held to Q4_0's. The issue's bar of
KL < 0.01 for INT4 is not reachable on this model by any 4-bit type (Q4_0 ~0.25, llama.cpp's
Q4_K_M mix ~0.05, measured below); INT8 meets it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.converters.architectures.base import SourceTensor
from edgeinfer.converters.convert import ConvertOptions, convert
from edgeinfer.converters.onnx.blockwise import BlockLayout, dequantize, quantize
from tests.converters.conftest import prompt_tokens
from tests.converters.onnx_support import TEXT, ort_logits
from tests.converters.real_gemma import real_gemma_checkpoint
from tests.e2e.parity import compare

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def dequantized_gguf(
    src: Path, out: Path, bits: int, block_size: int, symmetric: bool, monkeypatch
):
    """An F32 GGUF of ``src`` whose matrices are rounded through the ONNX export's quantizer."""
    rows_of = SourceTensor.rows

    def rounded(self, first, count):
        x = rows_of(self, first, count)
        if not self.is_matrix:
            return x
        layout = BlockLayout(count, x.shape[1], bits, block_size, symmetric)
        return dequantize(quantize(x, layout), layout)

    with monkeypatch.context() as m:
        m.setattr(SourceTensor, "rows", rounded)
        convert(src, out, ConvertOptions(type="f32"))
    return out


@pytest.mark.parametrize(
    "arch,type_name,block_size,zero_points",
    [("gemma3", "int4", 32, False), ("gemma3", "int4", 128, True), ("qwen2", "int8", 64, False),
     ("llama", "int4", 32, True), ("mistral", "int8", 128, True), ("qwen3", "int4", 64, False)],
)  # fmt: skip
def test_quantized_export_computes_its_dequantized_weights(
    arch, type_name, block_size, zero_points, checkpoints, tmp_path, monkeypatch
):
    bits = {"int4": 4, "int8": 8}[type_name]
    gguf = dequantized_gguf(checkpoints[arch], tmp_path / "ref.gguf", bits, block_size,
                            not zero_points, monkeypatch)  # fmt: skip
    folder = tmp_path / "onnx"
    convert(checkpoints[arch], folder, ConvertOptions(
        type=type_name, format="onnx", block_size=block_size, zero_points=zero_points, n_ctx=128
    ))  # fmt: skip
    with edgeinfer.load(gguf, n_ctx=128, engine="reference", kv_type="f32") as model:
        tokens = prompt_tokens(model.n_vocab)
        ref = model.logits(tokens)
    ours = ort_logits(folder, tokens)
    diff = float(np.abs(ours - ref).max())
    print(
        f"{arch} {type_name} b{block_size} {'zp' if zero_points else 'sym'}: "
        f"max abs diff {diff:.1e}"
    )
    assert diff < 1e-3 * max(1.0, float(np.abs(ref).max()))


# --- quality on real weights ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_folder(gemma_path, tmp_path_factory) -> Path:
    from tests.fixtures.models import GemmaSubsetVocab

    folder = tmp_path_factory.mktemp("real") / "gemma"
    return real_gemma_checkpoint(gemma_path, folder, GemmaSubsetVocab(gemma_path), noise=0.3)


@pytest.mark.slow
def test_quality_on_real_weights(real_folder, tmp_path):
    def gguf_logits(type_name: str) -> np.ndarray:
        path = tmp_path / f"{type_name}.gguf"
        convert(real_folder, path, ConvertOptions(type=type_name, pure=type_name != "q4_k_m"))
        with edgeinfer.load(path, n_ctx=256, engine="reference", kv_type="f32") as model:
            return model.logits(tokens)

    convert(real_folder, tmp_path / "f32.gguf", ConvertOptions(type="f32"))
    with edgeinfer.load(
        tmp_path / "f32.gguf", n_ctx=256, engine="reference", kv_type="f32"
    ) as model:
        tokens = model.tokenize(TEXT)
        ref = model.logits(tokens)
    kl: dict[str, float] = {}
    for name, options in {
        "int4 b32": {"type": "int4"},
        "int4 b32 zp": {"type": "int4", "zero_points": True},
        "int4 b128": {"type": "int4", "block_size": 128},
        "int8 b32": {"type": "int8"},
        "int8 b32, int8 KV": {"type": "int8", "kv_type": "int8"},
    }.items():
        folder = tmp_path / name.replace(" ", "-").replace(",", "")
        convert(real_folder, folder, ConvertOptions(format="onnx", n_ctx=256, **options))
        kl[name] = compare(ref, ort_logits(folder, tokens))[0]
    for type_name in ("q4_0", "q4_1", "q4_k_m", "q8_0"):
        kl[f"GGUF {type_name}"] = compare(ref, gguf_logits(type_name))[0]
    for name, value in kl.items():
        print(f"{name:>20}: mean KL {value:.4f} over {len(tokens)} tokens")
    assert kl["int4 b32"] <= 1.05 * kl["GGUF q4_0"]
    assert kl["int8 b32"] < 0.01 and kl["int8 b32"] <= kl["GGUF q8_0"]
    assert kl["int8 b32, int8 KV"] < 0.01
