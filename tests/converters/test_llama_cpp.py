"""llama.cpp (through llama-cpp-python) loads every converted file and computes what
edgeinfer computes; and where our recipes are llama.cpp's, our quantized files are byte for
byte what llama.cpp's own quantizer (llama_model_quantize) makes from our F32 file."""

from __future__ import annotations

import pytest

import edgeinfer
from edgeinfer.gguf import GGUFFile
from tests.conftest import llama_cpp_model
from tests.converters.conftest import (
    ARCHS,
    QUANTIZED_KL_BAR,
    QUANTIZED_TOP1_BAR,
    ggml_quantize,
    prompt_tokens,
)
from tests.e2e.parity import compare, llama_cpp_logits

llama_cpp = pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.slow  # ~130 conversions and llama.cpp loads: three minutes on two cores

# every --type of ours that llama-quantize also makes (all but f32, llama.cpp's source), each
# with llama.cpp's own file type (llama_ftype), named as llama.cpp names it
QUANTIZE_TYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q6_k", "q4_k_m",
                  "q4_k_s", "q5_k_m", "q5_k_s")  # fmt: skip
LLAMA_FTYPES = {t: getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{t.upper()}") for t in QUANTIZE_TYPES}

# F32 conversions, F32 cache, KL(llama.cpp || edgeinfer): (mean over positions, worst position).
# Measured on an AVX2 EPYC: llama 5.5e-12 / 2.9e-11, mistral 6.3e-12 / 5.8e-11, qwen2 2.9e-13 /
# 1.3e-12, qwen3 2.0e-12 / 5.2e-12; gemma3 7.7e-10 / 2.3e-9 (its GELU: llama.cpp's float16
# table). The bars are 10x the worst of each group, rounded up.
EXACT_KL_BARS = {"gemma3": (8e-9, 3e-8), "other": (7e-11, 6e-10)}


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_agrees_on_f32(arch, converted):
    """Exact regime (F32 weights, F32 cache): the two engines agree to summation order."""
    path = converted(arch, "f32")
    llm = llama_cpp_model(path, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    try:
        with edgeinfer.load(path, n_ctx=128, engine="reference", kv_type="f32") as model:
            tokens = prompt_tokens(model.n_vocab)
            kl, top1, kl_max = compare(llama_cpp_logits(llm, tokens), model.logits(tokens))
    finally:
        llm.close()
    print(f"\n{arch} f32: mean KL {kl:.3g}, max KL {kl_max:.3g}, top-1 {top1:.2%}")
    mean_bar, worst_bar = EXACT_KL_BARS["gemma3" if arch == "gemma3" else "other"]
    assert kl < mean_bar and kl_max < worst_bar and top1 >= 0.97, (kl, kl_max, top1)


@pytest.mark.parametrize(
    "type_name", ["f16", "bf16", "q8_0", "q4_0", "q5_0", "q4_k_m", "q5_k_s", "q6_k"]
)
@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_loads_and_agrees(arch, type_name, converted):
    """As shipped (F16 cache), to the quantized-file bars (conftest.QUANTIZED_KL_BAR)."""
    path = converted(arch, type_name)
    llm = llama_cpp_model(path)
    try:
        with edgeinfer.load(path, n_ctx=128, engine="reference") as model:
            tokens = prompt_tokens(model.n_vocab)
            assert llm.n_vocab() == model.n_vocab
            kl, top1, _ = compare(llama_cpp_logits(llm, tokens), model.logits(tokens))
    finally:
        llm.close()
    assert kl < QUANTIZED_KL_BAR and top1 >= QUANTIZED_TOP1_BAR, (kl, top1)


@pytest.mark.parametrize("pure", [True, False], ids=["pure", "mix"])
@pytest.mark.parametrize("type_name", list(LLAMA_FTYPES))
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_quantized_bytes_equal_llama_quantize(arch, type_name, pure, converted, tmp_path):
    """Same tensors, same types, same bytes as llama-quantize on our F32 conversion (gemma3's
    320- and 640-value rows exercise the fallbacks, its 7 layers the "more bits" layers)."""
    ours = converted(arch, type_name, pure)
    theirs = tmp_path / "ggml.gguf"
    ggml_quantize(converted(arch, "f32"), theirs, LLAMA_FTYPES[type_name], pure)
    with GGUFFile(ours) as a, GGUFFile(theirs) as b:
        assert set(a.tensors) == set(b.tensors)
        for name, info in b.tensors.items():
            assert a.tensors[name].ggml_type == info.ggml_type, name
            assert bytes(a.tensor_data(name)) == bytes(b.tensor_data(name)), name
        assert a.metadata["general.file_type"] == b.metadata["general.file_type"]
