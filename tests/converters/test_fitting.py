"""Plans fitted to --max-memory always fit: the file written plus the KV cache at --ctx stay
within the budget, the file is exactly as large as planned, and more memory never buys a
larger error. The knapsack solver is checked against brute force on small instances."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import edgeinfer
from edgeinfer.converters import errors
from edgeinfer.converters.convert import Conversion, ConvertOptions, convert, plan_conversion
from edgeinfer.converters.fitting import Option, fit
from edgeinfer.converters.profiles import available_profiles, load_profile, parse_size
from edgeinfer.gguf.constants import GGMLType as T

N_CTX = 256


def plan_bounds(src) -> tuple[int, int]:
    """The smallest and largest total (file + KV) a fitted plan can have."""
    conv = Conversion(src)
    small = conv.plan(ConvertOptions(type="q4_0", pure=True, n_ctx=N_CTX)).total_bytes
    big = conv.plan(ConvertOptions(type="f16", n_ctx=N_CTX)).total_bytes
    return small, big


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_fitted_files_fit_and_errors_fall(arch, checkpoints, tmp_path):
    small, big = plan_bounds(checkpoints[arch])
    errors_by_budget = []
    for k, frac in enumerate([0.0, 0.15, 0.4, 0.7, 1.0]):
        budget = int(small + frac * (big - small)) + 4096
        options = ConvertOptions(max_memory=budget, n_ctx=N_CTX)
        out = tmp_path / f"fit{k}.gguf"
        plan = convert(checkpoints[arch], out, options)
        assert plan.total_bytes <= budget
        assert out.stat().st_size == plan.file_size
        assert out.stat().st_size + plan.kv_bytes <= budget
        errors_by_budget.append(sum(c.error for c in plan.tensors if c.error is not None))
        with edgeinfer.load(out, n_ctx=64, engine="reference") as model:  # the runtime takes it
            assert np.isfinite(model.logits([1, 2, 3])).all()
    assert errors_by_budget == sorted(errors_by_budget, reverse=True)
    assert errors_by_budget[-1] < errors_by_budget[0] / 100


def test_fitted_plan_mixes_types(checkpoints):
    small, big = plan_bounds(checkpoints["llama"])
    plan = plan_conversion(
        checkpoints["llama"], ConvertOptions(max_memory=(small + big) // 2, n_ctx=N_CTX)
    )
    kinds = {c.ggml_type for c in plan.tensors if c.source.is_matrix}
    assert len(kinds) >= 2
    assert all(c.ggml_type == T.F32 for c in plan.tensors if not c.source.is_matrix)


def test_llama_cpp_computes_what_edgeinfer_computes_on_fitted_file(checkpoints, tmp_path):
    """A fitted mix (several types in one file) runs in llama.cpp with the logits edgeinfer
    computes, to the bars of the other quantized files (conftest.QUANTIZED_KL_BAR)."""
    pytest.importorskip("llama_cpp")
    from tests.conftest import llama_cpp_model
    from tests.converters.conftest import QUANTIZED_KL_BAR, QUANTIZED_TOP1_BAR, prompt_tokens
    from tests.e2e.parity import compare, llama_cpp_logits

    small, big = plan_bounds(checkpoints["qwen3"])
    out = tmp_path / "fit.gguf"
    plan = convert(
        checkpoints["qwen3"], out, ConvertOptions(max_memory=(small + big) // 3, n_ctx=N_CTX)
    )
    assert len({c.ggml_type for c in plan.tensors if c.source.is_matrix}) >= 2  # a mix
    llm = llama_cpp_model(out)
    try:
        with edgeinfer.load(out, n_ctx=128, engine="reference") as model:
            tokens = prompt_tokens(model.n_vocab)
            kl, top1, kl_max = compare(llama_cpp_logits(llm, tokens), model.logits(tokens))
    finally:
        llm.close()
    print(f"\nfitted qwen3: mean KL {kl:.3g}, max KL {kl_max:.3g}, top-1 {top1:.2%}")
    assert kl < QUANTIZED_KL_BAR and top1 >= QUANTIZED_TOP1_BAR, (kl, top1)


def test_kv_cache_counts_against_the_budget(checkpoints):
    conv = Conversion(checkpoints["llama"])
    plan = conv.plan(ConvertOptions(type="q8_0", n_ctx=4096))
    # 2 (K, V) x 2 layers x 4096 positions x 2 KV heads x 64 x 2 bytes
    assert plan.kv_bytes == 2 * 2 * 4096 * 2 * 64 * 2
    with pytest.raises(errors.BudgetError):
        conv.plan(
            ConvertOptions(type="q8_0", n_ctx=4096, max_memory=plan.file_size + plan.kv_bytes - 1)
        )
    conv.plan(ConvertOptions(type="q8_0", n_ctx=4096, max_memory=plan.file_size + plan.kv_bytes))


@pytest.mark.parametrize("name", ["avx2-laptop", "avx512-desktop", "arm64-phone", "rpi5"])
def test_profiles(name, checkpoints):
    profile = load_profile(name)
    assert name in available_profiles()
    assert profile.budget == int(profile.memory * profile.model_share)
    plan = plan_conversion(checkpoints["gemma3"], ConvertOptions(target=name))
    assert plan.n_ctx == profile.ctx and plan.budget == profile.budget
    from edgeinfer.converters.recipes import fallback

    allowed = {fallback(t, row) for t in profile.types for row in (320, 640)} | {T.F32}
    assert {c.ggml_type for c in plan.tensors} <= allowed


def test_target_with_a_smaller_budget(checkpoints):
    small, _ = plan_bounds(checkpoints["llama"])
    # the bounds count an f16 cache; rpi5 proposes q8_0, whose smaller cache would leave room
    options = ConvertOptions(target="rpi5", max_memory=small + 1000, n_ctx=N_CTX, kv_type="f16")
    plan = plan_conversion(checkpoints["llama"], options)
    assert plan.total_bytes <= small + 1000
    assert {c.ggml_type for c in plan.tensors if c.source.is_matrix} <= {T.Q4_0, T.Q4_K}


def test_profile_file_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('isa = "avx9"\nmemory = "1GiB"\nmodel_share = 0.5\nctx = 10\ntypes = ["q4_0"]\n')
    with pytest.raises(errors.ProfileError, match="avx9"):
        load_profile(str(bad))
    bad.write_text('isa = "avx2"\nmemory = "1GiB"\nmodel_share = 0.5\nctx = 10\ntypes = ["q9_9"]\n')
    with pytest.raises(errors.ProfileError, match="q9_9"):
        load_profile(str(bad))
    bad.write_text("isa = ")
    with pytest.raises(errors.ProfileError, match="TOML"):
        load_profile(str(bad))


@pytest.mark.parametrize(
    "text, expected",
    [("4GiB", 4 << 30), ("1.5 GB", 1_500_000_000), ("800MB", 800_000_000), ("512m", 512_000_000),
     ("123", 123), (4096, 4096)],
)  # fmt: skip
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GB", "-1GB", "1 parsec", "0", 0])
def test_parse_size_refuses(text):
    with pytest.raises(errors.InvalidSizeError):
        parse_size(text)


def _brute_force(options, fixed, budget):
    names = list(options)
    best = None
    for combo in itertools.product(*(options[n] for n in names)):
        size = fixed + sum(o.nbytes for o in combo)
        err = sum(o.error for o in combo)
        if size <= budget and (best is None or err < best):
            best = err
    return best


@pytest.mark.parametrize("seed", range(20))
def test_fit_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    options = {}
    for i in range(5):
        sizes = np.sort(rng.integers(10, 200, 4))
        errs = np.sort(rng.random(4))[::-1] * rng.random() * 10
        options[f"t{i}"] = [
            Option(T.Q4_0, int(s), float(e)) for s, e in zip(sizes, errs, strict=True)
        ]
    fixed = int(rng.integers(0, 50))
    lo = fixed + sum(min(o.nbytes for o in opts) for opts in options.values())
    hi = fixed + sum(max(o.nbytes for o in opts) for opts in options.values())
    for budget in np.linspace(lo, hi, 7).astype(int):
        chosen = fit(options, fixed, int(budget))
        size = fixed + sum(o.nbytes for o in chosen.values())
        err = sum(o.error for o in chosen.values())
        assert size <= budget
        best = _brute_force(options, fixed, budget)
        # the greedy works on convex hulls: within one tensor's step of the optimum
        worst_step = max(
            max(o.error for o in opts) - min(o.error for o in opts) for opts in options.values()
        )
        assert best <= err <= best + worst_step
    with pytest.raises(errors.BudgetError) as info:
        fit(options, fixed, lo - 1)
    assert info.value.shortfall == 1
