"""Converters know the KV cache: ``--cache-type-k`` / ``-v`` (``--kv-type`` for both) and a
profile's cache types enter the memory fit, sliding-window rings included; ``--dry-run``
shows the cache bytes; a GGUF file records the types as its recommendation, which ``load()``
uses unless told otherwise; each output format takes its own type names.

The expected sizes are computed here from the checkpoint's config.json and the block layouts
(q8_0: 34 bytes per 32 values, q4_0: 18), not with edgeinfer.kv_cache.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import edgeinfer
from edgeinfer import _native
from edgeinfer import errors as ei_errors
from edgeinfer.apps.convert import run
from edgeinfer.converters import errors
from edgeinfer.converters.architectures.base import kv
from edgeinfer.converters.convert import Conversion, ConvertOptions, convert
from edgeinfer.gguf import GGUFFile
from edgeinfer.gguf.constants import ValueType

N_CTX = 2048  # longer than a window's blocks (8 + a slack of 32 + a batch of 512)
N_BATCH = 512  # load()'s default
BLOCK, SLACK = 32, 32  # the native pool's block and a window's slack (simd/common/kv_pool.h)
BITS = {"f32": 32, "f16": 16, "q8_0": 8.5, "q4_0": 4.5}
GEMMA3_GLOBAL_EVERY = 6  # Gemma 3: five local layers, then a global one
needs_native = pytest.mark.skipif(not _native.available()[0], reason="native library not built")


def expected_cache_bytes(src, n_ctx: int, k: str, v: str) -> int:
    """positions x KV heads x head_dim x bits / 8, for keys and values, every layer, in blocks
    of 32 positions: Gemma 3's local layers keep the blocks of window + slack + n_batch, and 2
    at the edges, once that is shorter than the context."""
    cfg = json.loads((src / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    window = cfg.get("sliding_window") or 0
    positions = 0
    for il in range(cfg["num_hidden_layers"]):
        local = window and (il + 1) % GEMMA3_GLOBAL_EVERY != 0
        full = -(-n_ctx // BLOCK)
        ring = -(-(window + SLACK + N_BATCH) // BLOCK) + 2
        short = local and window + SLACK + N_BATCH < n_ctx
        positions += BLOCK * (min(full, ring) if short else full)
    per_position = cfg["num_key_value_heads"] * head_dim * (BITS[k] + BITS[v]) / 8
    return int(positions * per_position)


@pytest.mark.parametrize(
    "k,v", [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "q4_0"), ("f32", "q4_0")]
)
def test_the_plan_counts_the_cache_of_its_types(checkpoints, k, v):
    src = checkpoints["gemma3"]
    conv = Conversion(src)
    options = {"type": "q8_0", "n_ctx": N_CTX, "cache_type_k": k, "cache_type_v": v}
    plan = conv.plan(ConvertOptions(**options))
    assert plan.kv_bytes == expected_cache_bytes(src, N_CTX, k, v)
    assert (plan.cache.k, plan.cache.v) == (k, v)
    exact = plan.file_size + plan.kv_bytes
    assert conv.plan(ConvertOptions(**options, max_memory=exact)).total_bytes == exact
    with pytest.raises(errors.BudgetError, match="short by 1 B"):
        conv.plan(ConvertOptions(**options, max_memory=exact - 1))


def test_kv_type_sets_both(checkpoints):
    plan = Conversion(checkpoints["llama"]).plan(ConvertOptions(type="q8_0", n_ctx=256,
                                                                kv_type="q4_0"))  # fmt: skip
    # 2 layers x 256 positions x 2 KV heads x 64 values x (4.5 + 4.5) bits
    assert (plan.cache.k, plan.cache.v) == ("q4_0", "q4_0")
    assert plan.kv_bytes == 2 * 256 * 2 * 64 * 9 // 8


def test_mistral_windows_give_every_layer_a_ring(copy_checkpoint):
    from tests.converters.test_bad_inputs import edit_json

    src = copy_checkpoint("mistral")
    edit_json(src / "config.json", sliding_window=64)
    plan = Conversion(src).plan(ConvertOptions(type="f32", n_ctx=4096, kv_type="q8_0"))
    # 2 layers x (64 + 32 + 512 in 19 blocks of 32, + 2) positions x 2 KV heads x 32 values
    # x (8.5 + 8.5) bits
    assert plan.kv_bytes == 2 * 672 * 2 * 32 * 17 // 8
    assert plan.kv_rings == "2 of 2 layers keep only their window's blocks, 672 positions"


def test_a_quantized_cache_buys_room_for_the_weights(checkpoints):
    """A budget between the smallest weights + q8_0 cache and the same weights + f16 cache:
    the fit succeeds with q8_0 only. Without rings even q8_0 would not fit."""
    src = checkpoints["gemma3"]
    conv = Conversion(src)
    smallest = conv.plan(ConvertOptions(type="q4_0", pure=True)).file_size
    q8, f16 = (expected_cache_bytes(src, N_CTX, t, t) for t in ("q8_0", "f16"))
    margin = 64 * 1024  # the fitted file's own metadata, and a little room
    assert margin < (f16 - q8) / 4
    budget = smallest + q8 + margin
    assert smallest + 7 * N_CTX * 64 * 2 * 8.5 / 8 > budget  # a full-context q8_0 cache
    plan = conv.plan(ConvertOptions(max_memory=budget, n_ctx=N_CTX, kv_type="q8_0"))
    assert plan.recipe == "fitted" and plan.total_bytes <= budget and plan.kv_bytes == q8
    with pytest.raises(errors.BudgetError, match=r"nothing fits.*KV cache \(f16\)"):
        conv.plan(ConvertOptions(max_memory=budget, n_ctx=N_CTX))


def test_profiles_propose_cache_types_and_options_override_them(checkpoints):
    conv = Conversion(checkpoints["llama"])
    plan = conv.plan(ConvertOptions(target="rpi5"))
    assert (plan.cache.k, plan.cache.v, plan.cache.named) == ("q8_0", "q8_0", True)
    plan = conv.plan(ConvertOptions(target="rpi5", cache_type_k="f16"))
    assert (plan.cache.k, plan.cache.v) == ("f16", "q8_0")
    assert not conv.plan(ConvertOptions(type="q8_0")).cache.named


def test_a_bad_profile_cache_type(checkpoints, tmp_path):
    from edgeinfer.converters.profiles import PROFILE_DIR

    bad = tmp_path / "bad.toml"
    text = (PROFILE_DIR / "rpi5.toml").read_text()
    bad.write_text(text.replace('cache_type_v = "q8_0"', 'cache_type_v = "int8"'))
    with pytest.raises(errors.ProfileError, match="cache_type_v 'int8'"):
        Conversion(checkpoints["llama"]).plan(ConvertOptions(target=str(bad)))


@pytest.fixture(scope="module")
def fitted_gemma(checkpoints, tmp_path_factory):
    """Gemma fitted to a budget with a q8_0 / q4_0 cache."""
    out = tmp_path_factory.mktemp("cache-fit") / "fitted.gguf"
    src = checkpoints["gemma3"]
    budget = Conversion(src).plan(ConvertOptions(type="q8_0", n_ctx=N_CTX)).total_bytes
    convert(src, out, ConvertOptions(max_memory=budget, n_ctx=N_CTX, cache_type_k="q8_0",
                                     cache_type_v="q4_0"))  # fmt: skip
    return out


def test_the_file_records_its_cache(fitted_gemma, converted):
    with GGUFFile(fitted_gemma) as gguf:
        md = gguf.metadata
        assert (md["edgeinfer.cache_type_k"], md["edgeinfer.cache_type_v"]) == ("q8_0", "q4_0")
        assert md["edgeinfer.context_length"] == N_CTX
    with GGUFFile(converted("gemma3", "q8_0")) as gguf:  # no cache named, no fit: no keys
        assert not [key for key in gguf.metadata if key.startswith("edgeinfer.")]


@needs_native
def test_load_runs_the_recommended_cache(fitted_gemma, checkpoints):
    """The file's types reach the engine: its pool of cache blocks holds their bytes, and the
    logits are those of the same types asked for explicitly, not those of an f16 cache."""
    tokens = [2, 17, 301, 45, 9, 88, 1200, 6]
    expected = expected_cache_bytes(checkpoints["gemma3"], N_CTX, "q8_0", "q4_0")
    with edgeinfer.load(fitted_gemma, n_ctx=N_CTX, engine="native") as model:
        assert model.cache_types == ("q8_0", "q4_0")
        recommended = model.logits(tokens)
        assert _pool_bytes(model) == expected
    asked = {"cache_type_k": "q8_0", "cache_type_v": "q4_0"}
    with edgeinfer.load(fitted_gemma, n_ctx=N_CTX, engine="native", **asked) as model:
        np.testing.assert_array_equal(model.logits(tokens), recommended)
    with edgeinfer.load(fitted_gemma, n_ctx=N_CTX, engine="native", kv_type="f16") as model:
        assert model.cache_types == ("f16", "f16")
        assert not np.array_equal(model.logits(tokens), recommended)
        f16 = expected_cache_bytes(checkpoints["gemma3"], N_CTX, "f16", "f16")
        assert _pool_bytes(model) == f16


def _pool_bytes(model) -> int:
    """The bytes of every block of the native engine's pool (what it reserves for n_ctx)."""
    return sum(g["blocks"] * g["block_bytes"] for g in model.backend.pool_stats()["groups"])


def test_explicit_options_replace_the_recommendation(fitted_gemma, converted):
    with edgeinfer.load(fitted_gemma, n_ctx=64, engine="reference", cache_type_k="f32") as m:
        assert m.cache_types == ("f32", "f16")  # the file's recommendation is taken whole or not
    with edgeinfer.load(converted("gemma3", "q8_0"), n_ctx=64, engine="reference") as m:
        assert m.cache_types == ("f16", "f16")


@pytest.mark.parametrize(
    "value, error, match",
    [("q3_x", ei_errors.UnsupportedModelError, "edgeinfer.cache_type_v recommends .*'q3_x'"),
     (7, ei_errors.MissingKeyError, "edgeinfer.cache_type_v must be a string")],
)  # fmt: skip
def test_a_bad_recommendation_is_refused(checkpoints, tmp_path, monkeypatch, value, error, match):
    from edgeinfer.converters import convert as convert_module

    vtype = ValueType.STRING if isinstance(value, str) else ValueType.UINT32
    bad = [kv("edgeinfer.cache_type_k", ValueType.STRING, "q8_0"),
           kv("edgeinfer.cache_type_v", vtype, value)]  # fmt: skip
    monkeypatch.setattr(convert_module, "recommended_metadata", lambda *_: bad)
    out = tmp_path / "bad.gguf"
    convert(checkpoints["llama"], out, ConvertOptions(type="f32"))
    with pytest.raises(error, match=match):
        edgeinfer.load(out, n_ctx=64, engine="reference")
    with edgeinfer.load(out, n_ctx=64, engine="reference", kv_type="q8_0") as model:  # overridden
        assert model.cache_types == ("q8_0", "q8_0")


# --- the command line --------------------------------------------------------------------------


def test_dry_run_shows_the_cache_bytes(checkpoints, capsys):
    src = checkpoints["gemma3"]
    argv = [str(src), "--type", "q8_0", "--ctx", str(N_CTX), "-ctk", "q8_0", "-ctv", "q4_0"]
    assert run([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    total = expected_cache_bytes(src, N_CTX, "q8_0", "q4_0")
    per_token = 7 * 64 * (34 + 18) // 32  # 7 layers, 1 KV head of 64 values
    assert f"KV cache (K q8_0, V q4_0, {N_CTX} tokens)" in out
    assert f"({total} bytes, {per_token} bytes per token)" in out
    assert "6 of 7 layers keep only their window's blocks, 640 positions" in out


@pytest.mark.parametrize(
    "argv, match, status",
    [(["--kv-type", "q8_0", "-ctk", "f16"], "--kv-type q8_0 sets both cache types; "
      "--cache-type-k f16 disagrees", 2),
     (["--kv-type", "int8"], "not a cache type of GGUF output (f16, f32, q8_0, q4_0, kivi4, "
      "kivi2); int8 is one of ONNX output", 2),
     (["--format", "onnx", "-ctv", "q8_0"], "--cache-type-v 'q8_0' is not a cache type of ONNX "
      "output (f32, f16, int8, int4)", 2),
     (["--format", "onnx", "-ctk", "int8", "-ctv", "f16"], "keeps keys and values in one type",
      1)],
)  # fmt: skip
def test_cache_option_errors(checkpoints, capsys, argv, match, status):
    assert run([str(checkpoints["llama"]), *argv, "--dry-run"]) == status
    err = capsys.readouterr().err
    assert err.startswith("edgeinfer: error:") and match in err


@pytest.mark.parametrize(
    "argv, shown",
    [([], "f32"), (["--kv-type", "int8"], "int8"), (["-ctk", "f16", "-ctv", "f16"], "f16")],
)
def test_onnx_takes_the_pair_and_the_shorthand(checkpoints, capsys, argv, shown):
    assert run([str(checkpoints["llama"]), "--format", "onnx", *argv, "--dry-run"]) == 0
    assert f"int4 weights, {shown} KV cache" in capsys.readouterr().out


def test_onnx_export_with_the_pair(checkpoints, tmp_path):
    """-ctk / -ctv build the cache --kv-type does: the graph's cache inputs are float16."""
    onnx = pytest.importorskip("onnx")
    out = tmp_path / "model"
    result = convert(checkpoints["llama"], out, ConvertOptions(
        type="f32", format="onnx", cache_type_k="f16", cache_type_v="f16", n_ctx=64
    ))  # fmt: skip
    assert result.kv_type == "f16"
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    caches = [i for i in graph.input if i.name.startswith("past_key_values.")]
    assert caches and {c.type.tensor_type.elem_type for c in caches} == {onnx.TensorProto.FLOAT16}
