"""Quantized KV caches against llama.cpp's (llama-cpp-python type_k/type_v, flash attention on,
which llama.cpp needs for a quantized V) on Gemma 3 270M Q4_K_M.

The two engines differ already with f16 caches (quantized weights, activations quantized to
int8 blocks in a different summation order: see tests/e2e/test_logits_parity.py). The issue
asks that q8_0 caches in both add at most 0.002 to that KL. Both store q8_0 / q4_0 rows
Walsh-Hadamard rotated (llama.cpp's attn_rot_k / attn_rot_v); before edgeinfer did, its q8_0
caches added 0.0023 (768 positions, an AVX2 EPYC and this test's text) and its own q4_0 cache
cost 1.55x llama.cpp's KL. Measured since, over 1,536 positions on a Xeon (AVX2 and AVX-512
builds of both): q8_0 adds 0.00075 +- 0.0002 (0.0009 on this test's 768), and the engines'
q4_0 caches lie as far apart (KL 0.134) as llama.cpp's own batched and token-by-token runs
with q4_0 (0.133). The bars that hold everywhere compare with llama.cpp's own q8_0 and q4_0
penalties measured in the same run.

The text is two pieces of pydoc's help topics, the same tokens (ours, BOS first) for both
engines, each evaluated in one batch from an empty cache; every position's full-vocabulary
logits are compared.
"""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from tests.conftest import llama_cpp_model
from tests.e2e.parity import llama_cpp_logits, log_softmax
from tests.kv.texts import python_help_text

pytestmark = pytest.mark.slow
SEGMENTS = 2
N_TOKENS = 384  # per segment
SEGMENT_GAP = 20_000  # tokens between the segments' starts
N_CTX = 512
Q8_0_OVER_F16_BAR = 0.002  # the issue's: KL(llama.cpp q8_0 || ours q8_0) <= f16 pair's + this
# Ours q8_0 against ours f16, 768 positions: KL 0.0083 (llama.cpp's own q8_0 against its own
# f16: 0.0082; its f16 with flash attention against without: 0.0080 on 320 positions: this
# model moves that much under any perturbation of its attention). Bars: at most 1.25x
# llama.cpp's own q8_0 penalty in the same run, and at most this, 1.45x ours.
OURS_Q8_0_KL_BAR = 0.012
OURS_OVER_LLAMA_CPP_Q8_0 = 1.25
OURS_OVER_LLAMA_CPP_Q4_0 = 1.3  # measured 1.13 here, 1.00 over 4 segments; 1.55 unrotated
ROWS_PER_STEP = 16  # float64 rows at a time: 32 MiB per temporary with Gemma's vocabulary


def _per_position(p_logits: np.ndarray, q_logits: np.ndarray) -> dict[str, np.ndarray]:
    """KL(p || q), KL(q || p) and whether the argmax agrees, at each position, a few rows at
    a time so that no (positions, vocabulary) float64 array is made."""
    assert p_logits.shape == q_logits.shape, (p_logits.shape, q_logits.shape)
    kl_pq, kl_qp = [], []
    for start in range(0, len(p_logits), ROWS_PER_STEP):
        lp = log_softmax(p_logits[start : start + ROWS_PER_STEP])
        lq = log_softmax(q_logits[start : start + ROWS_PER_STEP])
        kl_pq.append((np.exp(lp) * (lp - lq)).sum(axis=-1))
        kl_qp.append((np.exp(lq) * (lq - lp)).sum(axis=-1))
    same_top = p_logits.argmax(-1) == q_logits.argmax(-1)
    return {"kl": np.concatenate(kl_pq), "kl_reverse": np.concatenate(kl_qp), "top1": same_top}


def _ours(path, tokens: list[int], cache_type: str) -> np.ndarray:
    with edgeinfer.load(path, engine="native", n_ctx=N_CTX, kv_type=cache_type) as model:
        return model.logits(tokens)


def _llama_cpp(path, tokens: list[int], cache_type: int) -> np.ndarray:
    llm = llama_cpp_model(path, n_ctx=N_CTX, flash_attn=True, type_k=cache_type, type_v=cache_type)
    try:
        return llama_cpp_logits(llm, tokens)
    finally:
        llm.close()


@pytest.fixture(scope="module")
def segments(gemma_path) -> list[list[int]]:
    """SEGMENTS pieces of the text, N_TOKENS each with BOS first, SEGMENT_GAP tokens apart."""
    with edgeinfer.load(gemma_path, engine="native", n_ctx=64) as model:
        tokens = model.tokenize(python_help_text(), add_special=False)
        bos = model.tokenizer.bos_id
    out = []
    for i in range(SEGMENTS):
        start = i * SEGMENT_GAP
        out.append([bos] + tokens[start : start + N_TOKENS - 1])
    return out


def _segment(path, tokens: list[int]) -> dict[str, dict[str, np.ndarray]]:
    import llama_cpp

    types = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0,
             "q4_0": llama_cpp.GGML_TYPE_Q4_0}  # fmt: skip
    ours_f16 = _ours(path, tokens, "f16")
    theirs_f16 = _llama_cpp(path, tokens, types["f16"])
    out = {}
    for name, ggml_type in types.items():
        ours = ours_f16 if name == "f16" else _ours(path, tokens, name)
        theirs = theirs_f16 if name == "f16" else _llama_cpp(path, tokens, ggml_type)
        out[f"llama.cpp {name} vs ours {name}"] = _per_position(theirs, ours)
        if name != "f16":
            out[f"ours f16 vs ours {name}"] = _per_position(ours_f16, ours)
            out[f"llama.cpp f16 vs llama.cpp {name}"] = _per_position(theirs_f16, theirs)
        del ours, theirs
    return out


@pytest.fixture(scope="module")
def comparisons(gemma_path, segments) -> dict[str, dict[str, float]]:
    """Each cache type's mean figures over every position of the segments: llama.cpp against
    ours (the same type in both), and ours against our own f16 cache. One type's logits are
    held at a time besides our f16's."""
    per_segment = [_segment(gemma_path, tokens) for tokens in segments]
    out = {}
    for label in per_segment[0]:
        out[label] = {
            figure: float(np.mean(np.concatenate([s[label][figure] for s in per_segment])))
            for figure in ("kl", "kl_reverse", "top1")
        }
        f = out[label]
        print(f"\n{label:34}: KL {f['kl']:.5f} (reverse {f['kl_reverse']:.5f}), "
              f"top-1 {f['top1']:.2%}")  # fmt: skip
    return out


def test_q8_0_cache_matches_llama_cpp_q8_0(comparisons):
    """The issue's bar, as stated (measured: KL 0.00861 / 0.00681 with q8_0 caches against
    0.00745 / 0.00613 with f16 ones on the two segments; before the rows were rotated, +0.0023)."""
    f16 = comparisons["llama.cpp f16 vs ours f16"]
    q8 = comparisons["llama.cpp q8_0 vs ours q8_0"]
    assert q8["kl"] <= f16["kl"] + Q8_0_OVER_F16_BAR, (q8, f16)
    assert q8["kl_reverse"] <= f16["kl_reverse"] + Q8_0_OVER_F16_BAR, (q8, f16)


def test_q8_0_caches_agree_across_engines_as_their_f16_caches_do(comparisons):
    """Top-1 agreement between the engines drops by at most 2 points from f16 to q8_0
    (measured: 96.88 % and 95.83 %), and their q8_0 KL is below the sum of the f16 pair's
    and one engine's own q8_0 penalty (measured 0.0077 < 0.0068 + 0.0082)."""
    f16 = comparisons["llama.cpp f16 vs ours f16"]
    q8 = comparisons["llama.cpp q8_0 vs ours q8_0"]
    own = comparisons["llama.cpp f16 vs llama.cpp q8_0"]
    assert q8["top1"] >= f16["top1"] - 0.02, (q8, f16)
    assert q8["kl"] <= f16["kl"] + own["kl"], (q8, f16, own)


def test_q4_0_cache_costs_what_llama_cpp_s_costs(comparisons):
    """Our q4_0 cache's KL against our own f16 cache is within OURS_OVER_LLAMA_CPP_Q4_0 of
    llama.cpp's q4_0 against its f16 (measured on the two segments: 0.1335 against 0.1183,
    and 1.00x over four; 1.55x before the rows were rotated)."""
    ours = comparisons["ours f16 vs ours q4_0"]
    theirs = comparisons["llama.cpp f16 vs llama.cpp q4_0"]
    assert ours["kl"] <= OURS_OVER_LLAMA_CPP_Q4_0 * theirs["kl"], (ours, theirs)
    assert ours["top1"] >= theirs["top1"] - 0.03, (ours, theirs)


def test_q8_0_cache_is_close_to_our_f16_cache(comparisons):
    ours = comparisons["ours f16 vs ours q8_0"]
    theirs = comparisons["llama.cpp f16 vs llama.cpp q8_0"]
    assert ours["kl"] <= OURS_Q8_0_KL_BAR and ours["kl_reverse"] <= OURS_Q8_0_KL_BAR, ours
    assert ours["kl"] <= OURS_OVER_LLAMA_CPP_Q8_0 * theirs["kl"], (ours, theirs)
    assert ours["top1"] >= theirs["top1"] - 0.02, (ours, theirs)
