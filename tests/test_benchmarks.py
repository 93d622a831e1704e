"""The benchmark scripts: the random Llama writer (its types, llama.cpp's quantization of it,
atomic output, and edgeinfer's logits on it against llama.cpp's) and compare_llamacpp's busy
core."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.gguf import GGUFFile
from tests.conftest import llama_cpp_model
from tests.e2e.parity import compare, llama_cpp_logits

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
TINY = ["--dim", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "512",
        "--vocab", "1000"]  # fmt: skip
# measured with llama-cpp-python 0.3.36 on an AVX2 EPYC: mean KL(llama.cpp || edgeinfer) 1e-14
# (q4_0), 9e-10 (f16), 1.7e-7 (Q4_K_M); the largest logit difference 1e-6, 1e-3 and 0.03 of
# the logits' standard deviation
MEAN_KL_BAR = 1e-4
LOGIT_DIFF_BAR = 0.1  # of the logits' standard deviation


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


make_random_llama = _script("make_random_llama")
compare_llamacpp = _script("compare_llamacpp")

# how each way of writing stores the matrices
VARIANTS = {
    "q4_0": ([], {"Q4_0"}),
    "f16": (["--type", "f16"], {"F16"}),
    "Q4_K_M": (["--quantize", "Q4_K_M", "--threads", "1"], {"Q4_K", "Q6_K"}),
}


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("random-llama")
    paths = {}
    for name, (flags, _) in VARIANTS.items():
        paths[name] = folder / f"{name}.gguf"
        assert make_random_llama.main([str(paths[name]), *TINY, *flags]) == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in paths.values())
    return paths


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tensor_types(tiny_models, variant):
    matrix_types = VARIANTS[variant][1]
    with GGUFFile(tiny_models[variant]) as f:
        types = {name: t.ggml_type.name for name, t in f.tensors.items()}
        assert f.metadata["llama.embedding_length"] == 256
    assert len(types) == 3 + 2 * 9
    for name, ggml_type in types.items():
        assert ggml_type == "F32" if name.endswith("norm.weight") else ggml_type in matrix_types
    if variant == "Q4_K_M":  # llama.cpp's mix: Q6_K for the output matrix and a few others
        assert types["output.weight"] == "Q6_K"
        assert types["blk.0.attn_q.weight"] == "Q4_K"
        assert set(types.values()) == {"F32", "Q4_K", "Q6_K"}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_edgeinfer_logits_match_llama_cpp(tiny_models, variant):
    path = tiny_models[variant]
    tokens = [1, *range(300, 332)]
    llm = llama_cpp_model(path, n_ctx=64)
    try:
        reference = llama_cpp_logits(llm, tokens)
    finally:
        llm.close()
    with edgeinfer.load(path, n_ctx=64) as model:
        ours = model.logits(tokens)
    mean_kl, top1, _ = compare(reference, ours)
    assert mean_kl < MEAN_KL_BAR
    assert top1 >= 0.9
    assert np.abs(reference - ours).max() <= LOGIT_DIFF_BAR * reference.std()


def test_default_q4_0_matches_its_size(tiny_models):
    shape = make_random_llama.Shape(dim=256, layers=2, heads=4, kv_heads=2, ffn=512, vocab=1000)
    with GGUFFile(tiny_models["q4_0"]) as f:
        data = sum(t.nbytes for t in f.tensors.values())
    assert data == make_random_llama.file_weight_bytes(shape, "q4_0")


def test_3b_preset_is_over_1_5_gb_in_q4_0():
    shape = make_random_llama.SHAPES["3b"]
    assert not shape.problems()
    assert shape.dim % 256 == 0 and shape.ffn % 256 == 0  # K-quants apply to every matrix
    assert make_random_llama.file_weight_bytes(shape, "q4_0") >= 1.5e9


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_unknown_quantization_type_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        make_random_llama.main([str(tmp_path / "out.gguf"), *TINY, "--quantize", "Q9_Z"])
    assert exit_info.value.code == 2
    assert "unknown llama.cpp file type" in capsys.readouterr().err
    assert _leftovers(tmp_path) == []


def test_quantizer_failure_leaves_no_output(tmp_path, monkeypatch):
    import llama_cpp

    out = tmp_path / "out.gguf"
    out.write_bytes(b"an older complete file")

    def failing(src: bytes, dst: bytes, params) -> int:
        Path(dst.decode()).write_bytes(b"half a model")
        return 1

    monkeypatch.setattr(llama_cpp, "llama_model_quantize", failing)
    with pytest.raises(RuntimeError, match="could not quantize"):
        make_random_llama.main([str(out), *TINY, "--quantize", "Q4_K_M"])
    assert _leftovers(tmp_path) == ["out.gguf"]
    assert out.read_bytes() == b"an older complete file"


def test_interrupted_write_leaves_no_output(tmp_path, monkeypatch):
    def interrupted(rng, shape, weight_type):
        yield np.zeros(4, dtype=np.uint8)
        raise KeyboardInterrupt

    monkeypatch.setattr(make_random_llama, "tensor_slices", interrupted)
    with pytest.raises(KeyboardInterrupt):
        make_random_llama.main([str(tmp_path / "out.gguf"), *TINY])
    assert _leftovers(tmp_path) == []


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_busy_core_runs_while_the_body_does():
    with compare_llamacpp.busy_core() as loop:
        assert loop.poll() is None
        if Path(f"/proc/{loop.pid}/stat").exists():
            time.sleep(0.5)
            assert _cpu_seconds(loop.pid) > 0.1
    assert loop.returncode is not None


def test_busy_core_stops_on_error():
    with pytest.raises(KeyboardInterrupt), compare_llamacpp.busy_core() as loop:
        raise KeyboardInterrupt
    assert loop.returncode is not None


def test_busy_core_disabled():
    with compare_llamacpp.busy_core(False) as loop:
        assert loop is None


def test_llama_cpp_features_are_read_from_its_system_info():
    """The instruction sets a llama.cpp build names as "NAME = 1", from the installed
    llama-cpp-python's own system info and from a line of the form it prints."""
    import llama_cpp

    bench = _script("llamacpp_bench")
    names = bench._cpu_features(llama_cpp).split()
    assert names and "SSE3" in names and all("=" not in n and ":" not in n for n in names)

    class Fake:
        @staticmethod
        def llama_print_system_info() -> bytes:
            return b"CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | FMA = 1 | REPACK = 1 | "

    assert bench._cpu_features(Fake) == "SSE3 AVX AVX2 FMA REPACK"
