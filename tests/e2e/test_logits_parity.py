"""The reference engine against llama.cpp (llama-cpp-python), logits at every position.

Two regimes:

* exact arithmetic: F32 weights and an F32 KV cache, where GGML rounds nothing that we do
  not. Real Gemma 3 weights and every fixture architecture must agree to the EXACT_* bars
  below (mean KL and the worst position's KL) and the same argmax at (nearly) every position.
* as shipped: quantized weights and the default F16 cache. GGML quantizes activations to
  int8 blocks before each product; one-ulp differences in summation order flip some of
  those roundings, and a quantized model amplifies the flips. llama.cpp's own batched and
  token-by-token evaluations of the same prompt differ by as much (KL ~0.007, argmax
  agreement 93-98% on Gemma 3 270M Q4_K_M), so there the argmax bar is llama.cpp's own
  agreement with itself, measured in the same run.
"""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from tests.conftest import llama_cpp_model
from tests.e2e.parity import PROMPTS, compare, llama_cpp_logits

pytestmark = pytest.mark.slow
ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]

# Exact regime, KL(llama.cpp || edgeinfer): (mean over positions, worst position) per prompt.
# Measured on an AVX2 EPYC (llama-cpp-python 0.3.36), the worst prompt of the three:
#   Gemma 3 270M, real weights: mean 2.6e-7, worst position 5.5e-6
#   fixtures: llama 1.0e-11 / 3.7e-10, qwen2 4.7e-13 / 3.8e-12, qwen3 2.4e-12 / 8.3e-12,
#             gemma3 3.7e-9 / 1.9e-8 (Gemma's GELU: llama.cpp's float16 table)
# The bars are 10x those figures, rounded up.
EXACT_GEMMA_BARS = (3e-6, 6e-5)
EXACT_FIXTURE_BARS = {
    "llama": (2e-10, 4e-9), "qwen2": (5e-12, 4e-11), "qwen3": (3e-11, 9e-11),
    "gemma3": (4e-8, 2e-7),
}  # fmt: skip

# As shipped, the mean KL bar is 0.01 and the worst position's KL has its own bar. Measured on
# an AVX2 EPYC, the worst position of the three prompts, ours against llama.cpp batched (and
# llama.cpp token by token against llama.cpp batched, its own spread):
#   Gemma 3 270M Q4_K_M: 0.073 (0.096)
#   fixtures: llama 0.020 (0.0037), qwen2 4.5e-4 (4.1e-4), qwen3 4.4e-3 (6.0e-3),
#             gemma3 2.1e-4 (1.7e-4)
# llama.cpp's own spread moves with its kernels (AVX2 or AVX-512), so the bars are 5x ours.
SHIPPED_MEAN_KL_BAR = 0.01
SHIPPED_GEMMA_WORST_KL_BAR = 0.4
SHIPPED_FIXTURE_WORST_KL_BAR = {"llama": 0.1, "qwen2": 2.5e-3, "qwen3": 0.025, "gemma3": 1.1e-3}


Comparison = tuple[float, float, float]  # mean KL, top-1 agreement, worst position's KL


def _tokens(llm, text: str) -> list[int]:
    return llm.tokenize(text.encode(), add_bos=True, special=False)


def _exact_regime(path) -> list[Comparison]:
    import llama_cpp

    llm = llama_cpp_model(path, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    results = []
    with edgeinfer.load(path, n_ctx=1024, kv_type="f32", engine="reference") as model:
        for text in PROMPTS:
            tokens = _tokens(llm, text)
            results.append(compare(llama_cpp_logits(llm, tokens), model.logits(tokens)))
    llm.close()
    return results


def _shipped_regime(path) -> tuple[list[Comparison], list[Comparison]]:
    """Our comparison per prompt, and llama.cpp's own (batched against token by token)."""
    batched = llama_cpp_model(path)
    one_by_one = llama_cpp_model(path, n_batch=1, n_ubatch=1)
    results, itself = [], []
    with edgeinfer.load(path, n_ctx=1024, engine="reference") as model:
        for text in PROMPTS:
            tokens = _tokens(batched, text)
            assert len(tokens) >= 128
            ref = llama_cpp_logits(batched, tokens)
            results.append(compare(ref, model.logits(tokens)))
            itself.append(compare(ref, llama_cpp_logits(one_by_one, tokens)))
    batched.close()
    one_by_one.close()
    return results, itself


def _report(name: str, results: list[Comparison]) -> None:
    for i, (kl, top1, kl_max) in enumerate(results):
        print(f"\n{name} prompt {i}: mean KL {kl:.3g}, max KL {kl_max:.3g}, top-1 {top1:.2%}")


def test_gemma_real_weights_exact_regime(gemma_f32_path):
    results = _exact_regime(gemma_f32_path)
    _report("gemma3-270m f32", results)
    mean_bar, worst_bar = EXACT_GEMMA_BARS
    for kl, top1, kl_max in results:
        assert kl < mean_bar and kl_max < worst_bar, (kl, kl_max)
        assert top1 >= 0.98


@pytest.mark.parametrize("arch", ARCHS)
def test_fixture_exact_regime(fixture_models_f32, arch):
    results = _exact_regime(fixture_models_f32[arch])
    _report(arch, results)
    mean_bar, worst_bar = EXACT_FIXTURE_BARS[arch]
    for kl, top1, kl_max in results:
        assert kl < mean_bar and kl_max < worst_bar, (kl, kl_max)
        assert top1 >= 0.99


def test_gemma_q4_k_m_as_shipped(gemma_path):
    results, itself = _shipped_regime(gemma_path)
    _report("gemma3-270m q4_k_m", results)
    _report("gemma3-270m q4_k_m, llama.cpp vs itself", itself)
    self_top1 = np.mean([r[1] for r in itself])
    for kl, _, kl_max in results:
        assert kl < SHIPPED_MEAN_KL_BAR and kl_max < SHIPPED_GEMMA_WORST_KL_BAR, (kl, kl_max)
    assert np.mean([r[1] for r in results]) >= self_top1 - 0.02


@pytest.mark.parametrize("arch", ARCHS)
def test_fixture_as_shipped(fixture_models, arch):
    results, itself = _shipped_regime(fixture_models[arch])
    _report(arch, results)
    _report(f"{arch}, llama.cpp vs itself", itself)
    self_top1 = np.mean([r[1] for r in itself])
    worst_bar = SHIPPED_FIXTURE_WORST_KL_BAR[arch]
    for kl, _, kl_max in results:
        assert kl < SHIPPED_MEAN_KL_BAR and kl_max < worst_bar, (kl, kl_max)
    assert np.mean([r[1] for r in results]) >= self_top1 - 0.02
