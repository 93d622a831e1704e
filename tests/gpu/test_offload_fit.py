"""Fitting layer offload to the device's memory (n_gpu_layers "auto", simd/common/engine.c's
fit_auto), the plan it reports (Model.gpu_plan) and the refusal of an explicit number that does
not fit, on Mesa's lavapipe with the free memory forced through EDGEINFER_VULKAN_BUDGET.

The plan is measured by running the offload's uploads and allocations without memory (a dry
run: each buffer's size as the driver's memory requirements give it); the tests hold it
against what the driver then allocates, and the auto fit against plans of explicit numbers
measured without a budget."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import edgeinfer
from edgeinfer import _native, errors
from edgeinfer.engines.base import Batch
from tests.gpu import need_vulkan

pytestmark = pytest.mark.skipif(not _native.available()[0], reason="no native library")

MIB = 1 << 20
TOKENS = list(range(5, 30))


@pytest.fixture(scope="module")
def vulkan():
    return need_vulkan()


@pytest.fixture
def budget(monkeypatch):
    """Sets the forced free memory (EDGEINFER_VULKAN_BUDGET) for the loads that follow."""

    def force(value: int | str | None) -> None:
        if value is None:
            monkeypatch.delenv("EDGEINFER_VULKAN_BUDGET", raising=False)
        else:
            monkeypatch.setenv("EDGEINFER_VULKAN_BUDGET", str(value))

    force(None)
    return force


def _load(path, n_gpu_layers, n_ctx=64, **kw):
    return edgeinfer.load(path, n_ctx=n_ctx, n_threads=2, n_gpu_layers=n_gpu_layers, **kw)


def _plan(path, n_gpu_layers, n_ctx=64):
    with _load(path, n_gpu_layers, n_ctx) as m:
        return m.gpu_plan


@pytest.mark.parametrize("n_gpu_layers", [1, 3, "all"])
def test_the_plan_is_what_the_device_then_holds(vulkan, fixture_models, budget, n_gpu_layers):
    """The dry run measures the very uploads and allocations the load then makes: on lavapipe
    (whose memory the host maps: no staging buffer) the two agree to the byte."""
    with _load(fixture_models["gemma3"], n_gpu_layers) as m:
        plan = m.gpu_plan
        n = m.config.n_layer + 1 if n_gpu_layers == "all" else n_gpu_layers
    assert plan.n_gpu_layers == n and plan.device == 0 and plan.device_name == vulkan[0]["name"]
    assert plan.held_bytes == plan.total_bytes > 0
    assert plan.budget_source.startswith("the heap's size")  # lavapipe has no memory budget
    assert plan.free_bytes == vulkan[0]["device_local_bytes"]
    assert (plan.cache_bytes > 0) == (n > 1)  # only the layers keep a cache, not the output
    assert plan.margin_bytes == 0 and plan.reason == ""


def test_the_cache_is_planned_for_the_whole_context(vulkan, fixture_models, budget):
    """A longer context reserves more cache on the device before any token runs; the weights
    and the per-position share stay."""
    short, long = (_plan(fixture_models["llama"], "all", n_ctx) for n_ctx in (64, 1024))
    assert short.weights_bytes == long.weights_bytes
    assert long.cache_bytes > 8 * short.cache_bytes
    assert long.held_bytes == long.total_bytes


def test_auto_takes_the_most_layers_that_fit(vulkan, fixture_models, budget):
    """Under a forced free size, auto takes the output and as many of the last layers as fit in
    it less the margin (a tenth): between the totals of n and n + 1 layers it takes n, the
    plans of explicit numbers measured without a budget giving those totals. It runs them on
    the device: its logits equal those of the same explicit number bit for bit."""
    path = fixture_models["gemma3"]
    totals = {n: _plan(path, n).total_bytes for n in range(1, 8)}
    for n in (1, 3, 6):
        free = (totals[n] + totals[n + 1]) // 2 * 10 // 9 + 1
        budget(free)
        with _load(path, "auto") as m:
            plan = m.gpu_plan
            assert m.n_gpu_layers == plan.n_gpu_layers == n
            auto = np.asarray(m._engine.decode(Batch.sequence(TOKENS, 0, all_logits=True)))
        assert plan.free_bytes == free and plan.budget_source == "EDGEINFER_VULKAN_BUDGET"
        assert plan.margin_bytes == free // 10
        assert plan.total_bytes == totals[n] <= free - plan.margin_bytes < totals[n + 1]
        assert f"{n - 1} of 6 layers beside the output fit" in plan.reason
        budget(None)
        with _load(path, n) as m:
            explicit = np.asarray(m._engine.decode(Batch.sequence(TOKENS, 0, all_logits=True)))
        np.testing.assert_array_equal(auto, explicit)


def test_auto_on_a_64_mib_device(vulkan, fixture_models, budget):
    """A 64 MiB device: every layer of a small model fits at a short context. The cache and the
    attention's scratch grow with the context, and auto reserves them first: at longer
    contexts it takes fewer layers, saying why."""
    budget("64M")
    plans = [_plan(fixture_models["gemma3"], "auto", n_ctx) for n_ctx in (256, 2048, 4096)]
    assert [p.free_bytes for p in plans] == [64 * MIB] * 3
    assert [p.margin_bytes for p in plans] == [64 * MIB // 10] * 3
    assert plans[0].n_gpu_layers == 7 and plans[0].reason == ""
    assert 7 > plans[1].n_gpu_layers > plans[2].n_gpu_layers >= 1
    for plan in plans[1:]:
        assert f"{plan.n_gpu_layers - 1} of 6 layers beside the output fit" in plan.reason
        assert plan.total_bytes <= 64 * MIB - plan.margin_bytes


def test_auto_without_room_or_without_a_gpu_runs_on_the_cpu_and_says_why(
    vulkan, fixture_models, budget
):
    budget("1M")
    with _load(fixture_models["llama"], "auto") as m:
        assert m.n_gpu_layers == 0 and m.gpu_plan.n_gpu_layers == 0
        assert "alone need" in m.gpu_plan.reason and "1.0 MiB free" in m.gpu_plan.reason
        assert m.gpu_plan.describe().startswith("GPU offload: none (the output and the buffers")
    budget(None)
    code = (
        "import edgeinfer, sys\n"
        f"m = edgeinfer.load({str(fixture_models['llama'])!r}, n_ctx=64, n_gpu_layers='auto')\n"
        "p = m.gpu_plan\n"
        "print(m.n_gpu_layers, p.device, p.reason)\n"
        "try:\n"
        f"    edgeinfer.load({str(fixture_models['llama'])!r}, n_ctx=64, n_gpu_layers=2)\n"
        "except edgeinfer.errors.BackendError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    env = {"EDGEINFER_VULKAN_LOADER": "/nonexistent/libvulkan.so.1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
        cwd="/",
    ).stdout.splitlines()  # fmt: skip
    assert out[0].startswith("0 None no Vulkan loader")
    assert out[1].startswith("BackendError n_gpu_layers 2 asks for a GPU, and there is none")


def test_an_explicit_number_that_does_not_fit_is_refused_with_the_numbers(
    vulkan, fixture_models, budget
):
    """Never an out-of-memory crash and never a quiet fall back to the CPU: the error gives what
    the number needs, part by part as the plan measured it, the free memory, and the most
    that fits."""
    path = fixture_models["gemma3"]
    want = _plan(path, "all")
    fits = _plan(path, 4)
    budget(fits.total_bytes)  # 4 fit exactly; all of them do not
    with pytest.raises(errors.OutOfMemoryError) as e:
        _load(path, "all")
    message = str(e.value)
    mib = lambda n: f"{n / MIB:.1f} MiB"  # noqa: E731
    for part in (
        f"n_gpu_layers 7 needs {mib(want.total_bytes)}",
        f"weights {mib(want.weights_bytes)}, KV cache {mib(want.cache_bytes)} for 64 positions",
        f"buffers {mib(want.buffer_bytes)}",
        f"but {mib(fits.total_bytes)} is free (EDGEINFER_VULKAN_BUDGET)",
        "the most that fits is n_gpu_layers 4",
    ):
        assert part in message
    with _load(path, 4) as m:  # what it names does load
        assert m.gpu_plan.n_gpu_layers == 4


def test_a_forced_budget_that_is_not_a_size_is_refused(vulkan, fixture_models, budget):
    budget("lots")
    with pytest.raises(errors.InvalidOptionError, match="EDGEINFER_VULKAN_BUDGET=lots"):
        _load(fixture_models["llama"], "auto")
    budget("2G")
    assert _plan(fixture_models["llama"], "auto").free_bytes == 2 << 30


@pytest.mark.parametrize(
    "asked, message",
    [
        ("many", "must be a number, 'auto' or 'all'"),
        (9, r"must lie in \[0, 3\]"),
        (-1, r"must lie in \[0, 3\]"),
    ],
)
def test_bad_n_gpu_layers_are_refused(vulkan, fixture_models, asked, message):
    with pytest.raises(errors.InvalidOptionError, match=message):
        _load(fixture_models["llama"], asked)


def test_auto_with_a_cpu_only_cache_runs_on_the_cpu_and_says_why(vulkan, fixture_models):
    with _load(fixture_models["llama"], "auto", kv_type="q8_0") as m:  # on the device
        assert m.n_gpu_layers == 3 and m.gpu_plan.reason == ""
    with _load(fixture_models["llama"], "auto", cache_type_k="kivi4", cache_type_v="kivi4") as m:
        assert m.n_gpu_layers == 0 and "KIVI" in m.gpu_plan.reason


def test_a_cache_over_the_binding_limit(vulkan, fixture_models):
    """A pool of 1 GiB (kv_budget) makes each layer's cache rows one buffer over lavapipe's
    128 MiB binding limit: auto runs on the CPU and says so; an explicit number is refused with
    the sizes, never a crash."""
    limit = vulkan[0]["max_storage_buffer_bytes"]
    with _load(fixture_models["llama"], "auto", kv_budget="1GiB") as m:
        assert m.n_gpu_layers == 0
        assert f"binding limit of {limit} bytes" in m.gpu_plan.reason
    with pytest.raises(errors.OutOfMemoryError, match="smaller kv_budget"):
        _load(fixture_models["llama"], "all", kv_budget="1GiB")
