"""The engine registry and protocol: one list read by load(), the CLI, doctor and bench; a
batch of (token, sequence, position) triples; the fallback from the native engine said once."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import edgeinfer
from edgeinfer import _native, engines, errors
from edgeinfer.apps import cli
from edgeinfer.engines import ENGINE_CHOICES, ENGINES, Batch, EngineOptions
from edgeinfer.gguf import GGUFFile
from edgeinfer.models import config_from_gguf

needs_native = pytest.mark.skipif(not _native.available()[0], reason="native library not built")


def _engine_choices(command: str) -> list[str]:
    sub = next(a for a in cli._parser()._actions if a.dest == "command")
    parser = sub.choices[command]  # type: ignore[index]  # argparse keeps subparsers here
    return list(next(a for a in parser._actions if a.dest == "engine").choices)


@pytest.mark.parametrize("command", ["run", "chat", "bench", "perplexity"])
def test_cli_engine_choices_are_the_registry(command):
    assert _engine_choices(command) == ["auto", *ENGINES] == list(ENGINE_CHOICES)


def test_every_registered_engine_implements_the_protocol(fixture_models, tmp_path):
    path = fixture_models["llama"]
    with GGUFFile(path) as gguf:
        cfg = config_from_gguf(gguf)
        for spec in ENGINES.values():
            if "gguf" not in spec.formats or not engines.probe(spec.name)[0]:
                continue
            engine = engines.create(spec, gguf, cfg, EngineOptions(n_ctx=32, n_threads=1))
            try:
                assert isinstance(engine, engines.Engine) and engine.name == spec.name
                assert engine.spec is spec and engine.isa
                logits = engine.forward([1, 2, 3])
                assert logits.shape == (cfg.n_vocab,) and engine.n_past == 3
            finally:
                engine.close()


def test_unknown_engines_and_wrong_formats_are_typed_errors(fixture_models):
    with pytest.raises(errors.InvalidOptionError, match="unknown engine 'fast'"):
        edgeinfer.load(fixture_models["llama"], engine="fast")
    with pytest.raises(errors.InvalidOptionError, match="runs onnx models"):
        edgeinfer.load(fixture_models["llama"], engine="onnxruntime")
    with pytest.raises(errors.InvalidOptionError, match="unknown kv_type 'q9'"):
        edgeinfer.load(fixture_models["llama"], kv_type="q9")


@needs_native
def test_a_batch_of_two_sequences_equals_each_run_alone(fixture_models):
    """Two sequences share one native step: each token's logits equal those of its sequence
    run by itself (and the numpy reference's, which runs one sequence)."""
    a, b = [5, 9, 14, 3, 7], [11, 2, 8]
    with GGUFFile(fixture_models["qwen2"]) as gguf:
        cfg = config_from_gguf(gguf)
        shared = engines.create(
            ENGINES["native"], gguf, cfg, EngineOptions(n_ctx=32, n_threads=2, n_seq_max=2)
        )
        ref = engines.create(ENGINES["reference"], gguf, cfg, EngineOptions(n_ctx=32, n_threads=1))
        try:
            tokens = np.array(a + b, dtype=np.int32)
            positions = np.array([*range(len(a)), *range(len(b))], dtype=np.int32)
            seqs = np.array([0] * len(a) + [1] * len(b), dtype=np.int32)
            both = shared.decode(Batch(tokens, positions, seqs, np.ones(len(tokens), dtype=bool)))
            assert shared.seq_length(0) == len(a) and shared.seq_length(1) == len(b)
            for part, rows in ((a, both[: len(a)]), (b, both[len(a) :])):
                ref.seq_clear(0)
                np.testing.assert_array_equal(rows, ref.forward(part, all_logits=True))
            # sequence 1 goes on by itself; sequence 0 is untouched by that
            more = shared.decode(Batch.sequence([4], len(b), seq=1))
            ref.seq_clear(0)
            np.testing.assert_array_equal(more[0], ref.forward([*b, 4], all_logits=True)[-1])
            with pytest.raises(errors.InvalidOptionError, match="next token goes to position 5"):
                shared.decode(Batch.sequence([4], 7, seq=0))
            with pytest.raises(errors.InvalidOptionError, match="sequence 2 is outside"):
                shared.decode(Batch.sequence([4], 0, seq=2))
        finally:
            shared.close()
            ref.close()


@needs_native
def test_seq_clear_frees_the_sequence_and_starts_it_afresh(fixture_models):
    with GGUFFile(fixture_models["llama"]) as gguf:
        cfg = config_from_gguf(gguf)
        engine = engines.create(ENGINES["native"], gguf, cfg, EngineOptions(n_ctx=64, n_threads=1))
        try:
            first = engine.forward([3, 1, 4, 1, 5], all_logits=True)
            used = engine.memory_bytes
            engine.seq_clear(0)
            assert engine.n_past == 0 and engine.memory_bytes < used
            np.testing.assert_array_equal(engine.forward([3, 1, 4, 1, 5], all_logits=True), first)
        finally:
            engine.close()


FALLBACK_SCRIPT = """
import sys, edgeinfer
for _ in range(2):
    with edgeinfer.load(sys.argv[1], n_ctx=16) as model:
        print(model.engine)
try:
    edgeinfer.load(sys.argv[1], engine="native")
except edgeinfer.errors.BackendError as e:
    print("native:", e)
"""


def test_auto_says_once_on_stderr_why_it_runs_numpy(fixture_models, tmp_path):
    """The native library missing (the loader pointed at an empty folder): engine="auto"
    runs the reference engine with one warning naming the file looked for; "native" raises."""
    empty = tmp_path / "no-library"
    empty.mkdir()
    env = {**os.environ, _native.NATIVE_DIR_ENV: str(empty)}
    done = subprocess.run(
        [sys.executable, "-c", FALLBACK_SCRIPT, str(fixture_models["llama"])],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["reference", "reference"]
    assert lines[2].startswith("native: native engine unavailable") and str(empty) in lines[2]
    warnings = [ln for ln in done.stderr.splitlines() if "EngineFallbackWarning" in ln]
    assert len(warnings) == 1, done.stderr
    assert "numpy reference engine" in warnings[0] and str(empty) in warnings[0]


@needs_native
@pytest.mark.parametrize(
    "k_type,v_type", [("f16", "f16"), ("f32", "f32"), ("q8_0", "q4_0"), ("q4_0", "f16")]
)
def test_the_native_cache_takes_what_cache_bytes_says(fixture_models, k_type, v_type):
    """The engine and the estimates (edgeinfer info, the converters' fitting) size the KV cache
    with one function: the pool holds cache_bytes, and filling the context takes all of it."""
    from edgeinfer.kv_cache import cache_bytes

    with GGUFFile(fixture_models["gemma3"]) as gguf:
        cfg = config_from_gguf(gguf)
        options = EngineOptions(n_ctx=96, n_threads=1, cache_type_k=k_type, cache_type_v=v_type)
        engine = engines.create(ENGINES["native"], gguf, cfg, options)
        try:
            before = engine.memory_bytes
            engine.forward(list(range(1, 97)))
            expected = cache_bytes(
                n_layer=cfg.n_layer, n_head_kv=cfg.n_head_kv, head_dim=cfg.head_dim,
                head_dim_v=cfg.head_dim_v, n_ctx=96, k_type=k_type, v_type=v_type,
                windows=[cfg.layer_window(il) for il in range(cfg.n_layer)],
            )  # fmt: skip
            assert engine.memory_bytes - before == expected
            pool = engine.pool_stats()
            assert sum(g["blocks"] * g["block_bytes"] for g in pool["groups"]) == expected
            assert pool["free"] == 0
        finally:
            engine.close()
