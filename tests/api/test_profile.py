"""The per-op profile (`edgeinfer bench MODEL --profile`): its parts add up to the step it
measured itself, every weight's products are counted with their work, profiling changes no
logit and records nothing when off, and misuse is a typed error. Consistency checks within a
run on the tiny fixture models: no timing bars."""

from __future__ import annotations

import ctypes
from collections import Counter

import numpy as np
import pytest

from edgeinfer import _native, bench, errors
from edgeinfer.gguf import GGUFFile
from edgeinfer.models import config_from_gguf
from edgeinfer.models.base import LayerTensors
from tests.api.conftest import load

if not _native.available()[0]:
    pytest.skip(f"native library unavailable: {_native.available()[1]}", allow_module_level=True)

MATRICES = ("wq", "wk", "wv", "wo", "ffn_gate", "ffn_up", "ffn_down")
assert set(MATRICES) <= {f for f in LayerTensors.__dataclass_fields__}


def native(path, **options):
    options.setdefault("n_threads", 2)
    options.setdefault("n_ctx", 128)
    return load(path, engine="native", **options)


def expected_products(path, n: int, n_out: int) -> Counter:
    """(type, cols, rows) -> [calls, flops, bytes] of one step of n tokens, n_out of them with
    logits, read from the file: a product per matrix of every layer, and the output's. After
    the last layer's attention only the rows with logits go on."""
    f = GGUFFile(path)
    cfg = config_from_gguf(f)
    work: dict[tuple[int, int, int], list[int]] = {}
    last = len(cfg.layers) - 1
    names = [
        (getattr(lt, m), n_out if il == last and m not in ("wq", "wk", "wv") else n)
        for il, lt in enumerate(cfg.layers)
        for m in MATRICES
    ]
    for name, tokens in [*names, (cfg.output_tensor, n_out)]:
        info = f.tensors[name]
        cols, rows = info.shape[0], info.shape[1]
        row = work.setdefault((int(info.ggml_type), cols, rows), [0, 0, 0])
        row[0] += 1
        row[1] += 2 * rows * cols * tokens
        row[2] += info.nbytes
    return Counter({k: tuple(v) for k, v in work.items()})


def products(prof) -> dict[tuple[int, int, int], tuple[int, int, int]]:
    return {
        (op.weight_type, op.cols, op.rows): (op.calls, op.flops, op.bytes)
        for op in prof.ops
        if op.kind == "matmul"
    }


# --- (a) the parts add up ----------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_parts_of_a_profile_add_up_to_the_step_it_measured(fixture_models, arch):
    r = bench.profile(str(fixture_models[arch]), n_prompt=48, n_gen=6, n_threads=2, engine="native")
    assert (r["n_prompt"], r["n_gen"], r["engine"]) == (48, 6, "native")
    for phase in ("prompt", "decode"):
        p = r[phase]
        assert p["step_ms"] > 0
        parts = sum(row["ms"] for row in p["ops"])
        assert parts == pytest.approx(p["parts_ms"])
        assert abs(parts - p["step_ms"]) <= 0.1 * p["step_ms"], (phase, parts, p["step_ms"])
        engine_parts = sum(
            row["ms"] for row in p["ops"] if row["op"] not in (bench.PYTHON_OP, bench.SAMPLING_OP)
        )
        assert abs(engine_parts - p["engine_ms"]) <= 0.1 * p["engine_ms"], phase
        assert p["engine_ms"] <= p["step_ms"]
        assert sum(row["share"] for row in p["ops"]) == pytest.approx(parts / p["step_ms"])
        ops = {row["op"] for row in p["ops"]}
        assert {"attention", "norms + residual adds", bench.PYTHON_OP, bench.SAMPLING_OP} <= ops
        for row in p["ops"]:
            assert row["ms"] >= 0 and row["calls"] > 0, row
            if row["op"].startswith("matmul "):
                assert row["gflops"] > 0 and row["gbps"] > 0, row
    assert r["decode"]["steps"] == 6 and r["prompt"]["steps"] == 1


# --- (b) what is counted -----------------------------------------------------------------------


def test_every_weight_product_is_counted_with_its_work(fixture_models):
    path = fixture_models["llama"]  # a weight type per role: every product its own row
    n = 20
    with native(path) as model:
        eng = model.backend
        eng.set_profiling(True)
        eng.forward(list(range(1, n + 1)))
        prompt = eng.profile()
        eng.set_profiling(True)  # started again: counters at zero
        for t in (5, 6, 7):
            eng.forward([t])
        decode = eng.profile()
        cfg = model.config
    assert products(prompt) == dict(expected_products(path, n, 1))
    one = expected_products(path, 1, 1)
    assert products(decode) == {k: (3 * c, 3 * f, 3 * b) for k, (c, f, b) in one.items()}
    assert prompt.calls == 1 and decode.calls == 3

    L = cfg.n_layer
    calls = Counter({op.kind: op.calls for op in prompt.ops if op.kind != "matmul"})
    assert calls["norm"] == 3 * L + 1  # attention's, the FFN's, the residual add's; the output's
    assert calls["act_quant"] == 4 * L + 1  # qkv, wo, gate/up, down; the output
    for kind in ("qkv_post", "attention", "glu"):
        assert calls[kind] == L, kind
    for kind in ("threads", "embed", "rope_tables", "cache_blocks", "output_rows"):
        assert calls[kind] == 1, kind
    assert "softcap" not in calls and "kivi_quant" not in calls
    # no sliding window: token i sees i + 1 keys in every layer, each a q.k and a weighted v
    attention = next(op for op in prompt.ops if op.kind == "attention")
    keys = L * n * (n + 1) // 2
    assert attention.flops == keys * cfg.n_head * 2 * (cfg.head_dim + cfg.head_dim_v)


def test_weight_repacking_is_profiled_on_first_use(fixture_models):
    """Interleaved copies of weights are made by the first step that uses them: a profile of
    that step has them, a later one has not."""
    with native(fixture_models["qwen2"]) as model:
        eng = model.backend
        eng.set_profiling(True)
        eng.forward([1, 2, 3, 4])
        first = {op.kind: op for op in eng.profile().ops}
        eng.set_profiling(True)
        eng.forward([5])
        later = {op.kind for op in eng.profile().ops}
        copies = eng.weight_copy_bytes
    assert "repack" not in later
    if copies:  # this machine's kernels interleave some of its types (Q4_K, Q6_K)
        assert first["repack"].bytes > 0 and first["repack"].calls >= 1
    else:
        assert "repack" not in first


# --- (c) off changes nothing -------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_profiling_changes_no_logit(fixture_models, arch):
    prompt = list(range(3, 40))
    runs = []
    for on in (False, True):
        with native(fixture_models[arch]) as model:
            eng = model.backend
            eng.set_profiling(on)
            logits = [eng.forward(prompt, all_logits=True)]
            logits += [eng.forward([t]) for t in (7, 8, 9)]
            runs.append(logits)
    for off, on in zip(*runs, strict=True):
        assert np.array_equal(off, on)


def test_a_paused_profile_records_nothing(fixture_models):
    with native(fixture_models["llama"]) as model:
        eng = model.backend
        eng.set_profiling(True)
        eng.set_profiling(False)
        eng.forward([1, 2, 3])
        prof = eng.profile()
        assert prof.ops == () and prof.calls == 0 and prof.ns == 0
        eng.set_profiling(True)
        eng.forward([4])
        assert eng.profile().calls == 1


# --- (e) misuse --------------------------------------------------------------------------------


def test_an_engine_never_profiled_has_no_profile_to_read(fixture_models):
    with (
        native(fixture_models["llama"]) as model,
        pytest.raises(errors.InvalidOptionError, match="never profiled"),
    ):
        model.backend.profile()


def test_a_buffer_too_small_is_refused(fixture_models):
    lib = _native.library()
    with native(fixture_models["llama"]) as model:
        eng = model.backend
        eng.set_profiling(True)
        eng.forward([1, 2])
        handle, n = eng._handle, ctypes.c_int32()
        _native.check(lib.ei_engine_profile_read(handle, None, 0, ctypes.byref(n)))
        assert n.value == len(eng.profile().ops) + 1  # and the calls' own row
        rows = (_native.ProfileEntry * n.value)()
        for cap in (n.value - 1, -1):
            with pytest.raises(errors.InvalidOptionError, match="buffer room"):
                _native.check(lib.ei_engine_profile_read(handle, rows, cap, ctypes.byref(n)))
    with pytest.raises(errors.InvalidOptionError, match="bad arguments"):
        _native.check(lib.ei_engine_profile_read(None, None, 0, ctypes.byref(n)))
    with pytest.raises(errors.InvalidOptionError, match="no engine"):
        _native.check(lib.ei_engine_profile(None, 1))


def test_the_reference_engine_keeps_no_profile(fixture_models):
    with load(fixture_models["llama"], engine="reference") as model:
        assert not model.backend.can_profile
        with pytest.raises(errors.InvalidOptionError, match="no per-op profile"):
            model.backend.set_profiling(True)
    with pytest.raises(errors.InvalidOptionError, match="no per-op profile"):
        bench.profile(str(fixture_models["llama"]), n_prompt=4, n_gen=1, engine="reference")
