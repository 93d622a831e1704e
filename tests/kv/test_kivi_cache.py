"""KIVI caches (kivi4, kivi2) in the engines: keys quantized per channel over groups of G
positions, values per position, the newest R positions read in f16 (simd/include/edgeinfer.h:
EI_KV_KIVI).

- Against transformers: tests/converters/test_kivi_attention.py.
- The engines: native (every instruction set here) and numpy give the same bits; the logits
  do not depend on how the tokens were batched.
- Sizes, options and what a KIVI cache refuses are typed.
"""

from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from edgeinfer import errors
from edgeinfer._native import ISA_NAMES, library
from edgeinfer.generation import KVSession
from edgeinfer.gguf import GGUFFile
from edgeinfer.kv_cache import cache_summary
from edgeinfer.models import config_from_gguf
from tests.converters.conftest import prompt_tokens

CONFIGS = [  # (kv_type, kivi_group, kivi_residual)
    ("kivi4", 32, 0),
    ("kivi4", 32, 40),
    ("kivi2", 64, 8),
    ("kivi4", 128, 0),
]


def _native_isas() -> list[str]:
    lib = library()
    return [name for i, name in enumerate(ISA_NAMES) if lib.ei_isa_supported(i)]


def _logits(path, tokens, engine="native", n_batch=512, **kw):
    with edgeinfer.load(path, engine=engine, n_ctx=256, n_batch=n_batch, **kw) as m:
        return m.logits(tokens)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "llama"])
@pytest.mark.parametrize("kv_type, group, residual", CONFIGS)
def test_the_engines_give_the_same_bits(fixture_models, arch, kv_type, group, residual):
    """gemma3's fixture has sliding-window layers of 16 positions (a ring of quantized
    groups) and soft-capping; qwen3 q/k norms; llama grouped queries."""
    path = fixture_models[arch]
    with GGUFFile(path) as f:
        tokens = prompt_tokens(len(f.metadata["tokenizer.ggml.tokens"]), 200, seed=group)
    kw = {"kv_type": kv_type, "kivi_group": group, "kivi_residual": residual}
    want = _logits(path, tokens, "reference", **kw)
    for isa in _native_isas():
        got = _logits(path, tokens, isa=isa, n_batch=37, **kw)
        np.testing.assert_array_equal(got, want, err_msg=isa)


def test_logits_do_not_depend_on_the_batching(fixture_models):
    path = fixture_models["gemma3"]
    tokens = prompt_tokens(256, 150, seed=1)
    kw = {"kv_type": "kivi4", "kivi_residual": 24}
    whole = _logits(path, tokens, **kw)
    for n_batch in (1, 7, 64):
        np.testing.assert_array_equal(_logits(path, tokens, n_batch=n_batch, **kw), whole)
    # a query's view moves with its position: the first group is read quantized from the
    # query at R + G - 1 on; before it every query reads f16 rows only, as with R >= n_ctx
    every_f16 = _logits(path, tokens, kv_type="kivi4", kivi_residual=1000)
    np.testing.assert_array_equal(whole[: 24 + 32 - 1], every_f16[: 24 + 32 - 1])
    assert (np.abs(whole[24 + 32 - 1 :] - every_f16[24 + 32 - 1 :]).max(axis=1) > 0).all()


# ---- past the context -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "kv"),
    [("qwen3", {"kv_type": "kivi4", "kivi_residual": 16}),
     ("gemma3", {"kv_type": "kivi2", "kivi_group": 64, "kivi_residual": 0}),
     ("llama", {"kv_type": "kivi4", "kivi_residual": 40})],
    ids=str,
)  # fmt: skip
def test_dropping_positions_is_the_same_in_both_engines(fixture_models, arch, kv):
    """Scattered runs dropped: each kept key, as the cache held it (decoded from its group, or
    its f16 row), rotated back by what was dropped below it; the groups made again; and the
    attention each position received moved along (h2o's scores), bit for bit."""
    runs = [(3, 2), (9, 1), (20, 7), (70, 30), (130, 3)]
    out = {}
    for engine in ("reference", "native"):
        with edgeinfer.load(fixture_models[arch], engine=engine, n_ctx=256,
                            context_policy="h2o", **kv) as m:  # fmt: skip
            eng = m.backend
            eng.forward(prompt_tokens(256, 170, seed=2))
            eng.evict(runs)
            logits = eng.forward([7, 8, 9], all_logits=True)
            eng.evict([(50, 40)])  # and again, from a cache that was moved once
            out[engine] = (logits, eng.forward([10]), eng.attention_scores())
    for a, b in zip(out["reference"], out["native"], strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_prefix_of_a_moved_cache_is_what_the_move_made(fixture_models):
    """After a drop, a fork that keeps fewer positions than the sequence holds reads rows
    below the new end that the move rewrote (the residual's too, not only the groups a query
    at the new end reads): the numpy engine, truncated there, gives the same logits."""
    from edgeinfer import engines
    from edgeinfer.engines import ENGINES
    from edgeinfer.engines.base import Batch, EngineOptions

    path, tokens = fixture_models["llama"], prompt_tokens(256, 400, seed=9)
    opts = {"n_ctx": 512, "cache_type_k": "kivi4", "cache_type_v": "kivi4"}
    with edgeinfer.load(path, engine="reference", n_ctx=512, kv_type="kivi4") as m:
        m.backend.forward(tokens)
        m.backend.evict([(100, 10)])
        m.backend.truncate(380)
        want = m.backend.forward([5])
    with GGUFFile(path) as gguf:
        eng = engines.create(ENGINES["native"], gguf, config_from_gguf(gguf),
                             EngineOptions(n_threads=2, n_seq_max=2, **opts))  # fmt: skip
        try:
            eng.forward(tokens)
            eng.evict([(100, 10)])
            eng.fork(0, 1, 380)
            got = eng.decode(Batch.sequence([5], 380, seq=1))[0]
        finally:
            eng.close()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("policy", ["streaming", "shift", "h2o"])
def test_generating_past_the_context_gives_the_reference_tokens(fixture_models, policy):
    """2 x n_ctx tokens past a context of 96 under each policy, sliding-window layers in
    rings: the same tokens from both engines, and flat memory in the native one."""
    opts = {"n_ctx": 96, "n_batch": 32, "context_policy": policy, "kv_type": "kivi4",
            "kivi_residual": 16, "n_sink": 2}  # fmt: skip
    tokens = {}
    for engine in ("native", "reference"):
        with edgeinfer.load(fixture_models["gemma3"], engine=engine, **opts) as m:
            session = KVSession(m.backend, n_batch=32, policy=m.context_policy)
            logits = session.prefill(list(range(3, 40)))[0]
            out, memory = [], []
            for i in range(2 * 96):
                out.append(int(np.argmax(logits)))
                logits = session.decode(out[-1])
                assert m.backend.n_past <= 96
                if i % 96 == 95:
                    memory.append(m.backend.memory_bytes)
            tokens[engine] = out
            if engine == "native":
                assert len(set(memory)) == 1
    assert tokens["native"] == tokens["reference"]


def test_a_context_within_the_residual_goes_past_its_end(fixture_models):
    """n_ctx 64 with the default residual of 128: every position is read in f16, and the
    policy may still drop (a residual is no window that must stay)."""
    with edgeinfer.load(fixture_models["llama"], n_ctx=64, kv_type="kivi4",
                        context_policy="streaming") as m:  # fmt: skip
        session = KVSession(m.backend, policy=m.context_policy)
        session.prefill(list(range(3, 30)))
        for i in range(3 * 64):
            session.decode(5 + i % 50)
            assert m.backend.n_past <= 64
        assert len(session.history) == 27 + 3 * 64


# ---- sizes, options and refusals -----------------------------------------------------------


def test_bits_per_value_count_scales_zero_points_and_the_residual(gemma_path):
    with GGUFFile(gemma_path) as f:
        cfg = config_from_gguf(f)
    assert (cfg.head_dim, cfg.head_dim_v) == (256, 256)
    s = cache_summary(cfg, 4096, "kivi4", "kivi4")
    assert (s["bits_per_value_k"], s["bits_per_value_v"]) == (5.0, 5.0)
    # 3,968 positions in groups (5 bits), the newest 128 in f16
    assert s["bits_per_value"] == round((3968 * 5 + 128 * 16) / 4096, 3)
    g64 = cache_summary(cfg, 4096, "kivi4", "kivi4", kivi_group=64)
    assert g64["bits_per_value_k"] == 4.5 == cache_summary(cfg, 4096, "q4_0")["bits_per_value_k"]
    assert cache_summary(cfg, 4096, "kivi2", "kivi2", kivi_group=128)["bits_per_value_k"] == 2.25


def test_options_and_refusals_are_typed(fixture_models, tmp_path):
    path = fixture_models["llama"]
    with pytest.raises(errors.InvalidOptionError, match="both KIVI"):
        edgeinfer.load(path, cache_type_k="kivi4", cache_type_v="f16")
    with pytest.raises(errors.InvalidOptionError, match="kivi_group"):
        edgeinfer.load(path, kv_type="kivi4", kivi_group=48)
    with pytest.raises(errors.InvalidOptionError, match="kivi_residual"):
        edgeinfer.load(path, kv_type="kivi4", kivi_residual=-1)
