"""Quality of edgeinfer's GGUF files on real weights: perplexity and size of every type next to
llama.cpp's own quantizer, and the fitted mix against llama.cpp's Q4_K_M (issue 4).

Source: the whole Gemma 3 270M (18 layers, its 262,144-token vocabulary) dequantized from the
packaged GGUF into Hugging Face layout, every matrix taken off its grid by Gaussian noise of
0.3 of each value's quantization step (real_gemma.py). That noise has a variance of 0.09 step^2,
a little more than the step^2 / 12 of rounding a continuous value to a grid, so a quantizer
that falls back onto the original grid gains nothing over one quantizing continuous weights.

Texts: Python's language reference as every CPython ships it (``pydoc_data.topics``, the text
of ``help()``), evaluation and calibration from disjoint topics. Perplexity is
``edgeinfer.perplexity`` over the first WINDOWS windows of N_CTX tokens.

llama.cpp: ``llama_model_quantize`` (llama-cpp-python) on our F32 conversion of the same folder,
to the same type, and with the same importance matrix (``llama_model_imatrix_data``) for the
calibrated comparison. Converted files are cached under tests/.cache/quality-<key>/, the key
hashing the sources of the source folder's writer, the converter, the quantizers and the GGUF
writer (tests.conftest.keyed_cache): a rerun converts again only after that code changed, and
measures the perplexities again.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.converters.calibration import ActivationStats, collect_stats
from edgeinfer.converters.convert import Conversion, ConvertOptions, convert
from edgeinfer.converters.recipes import recipe
from edgeinfer.gguf import GGUFFile
from edgeinfer.perplexity import PerplexityResult, perplexity
from tests.conftest import keyed_cache, llama_cpp_model
from tests.converters.conftest import checkpoint_sources, ggml_quantize
from tests.converters.real_gemma import real_gemma_checkpoint

pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.slow

STEP_NOISE = 0.3
N_CTX = 512
WINDOWS = 3
EVAL_TOPICS = ("execmodel", "import")
CALIB_TOPICS = ("customization", "naming")
CALIB_TOKENS = 512
# every --type but the aliases q4_k / q5_k; f32 is llama.cpp's source
ALL_TYPES = ("f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q5_k_s", "q5_1", "q5_0", "q4_k_m", "q4_k_s",
             "q4_1", "q4_0")  # fmt: skip
# converting the whole model takes one to three minutes a type on two cores: the test suite
# compares q8_0 and q4_k_m (the claim's reference) here, and every type's bytes on the tiny
# checkpoints (test_llama_cpp.py); EDGEINFER_QUALITY_TYPES=all the table of every type here
# (the figures in README and the closing note)
FULL = os.environ.get("EDGEINFER_QUALITY_TYPES") == "all"
TYPES = ALL_TYPES if FULL else ("q8_0", "q4_k_m")
# the fitted mix is compared in both forms, without and with a calibration text, in the full
# run; the suite checks the uncalibrated one (a whole-model conversion, the calibration
# statistics and llama.cpp's imatrix file cost six more minutes on two cores)
CALIBRATED = (False, True) if FULL else (False,)
# edgeinfer multiplies float weights exactly (float64): ~80 s a window on two cores, so these
# are converted and compared with llama.cpp's but not scored
NOT_SCORED = ("f16", "bf16")


def topics_text(names: tuple[str, ...]) -> str:
    import pydoc_data.topics

    return "\n\n".join(pydoc_data.topics.topics[name] for name in names)


def source_sources() -> list:
    """What the off-grid HF folder is made with, and its noise."""
    return [Path(__file__).with_name("real_gemma.py"), *checkpoint_sources(), f"noise {STEP_NOISE}"]


def conversion_sources() -> list:
    """What the converted files are made with: the source folder, the converter, the
    quantizers and the GGUF writer, and the calibration text."""
    import edgeinfer.converters
    import edgeinfer.gguf
    import edgeinfer.quants

    return [*source_sources(), edgeinfer.converters, edgeinfer.gguf, edgeinfer.quants,
            f"calibration {topics_text(CALIB_TOPICS)} {CALIB_TOKENS}"]  # fmt: skip


def differing_tensors(a: Path, b: Path) -> list[str]:
    """Tensors whose type or bytes differ between two GGUF files (metadata aside)."""
    with GGUFFile(a) as fa, GGUFFile(b) as fb:
        if set(fa.tensors) != set(fb.tensors):
            return sorted(set(fa.tensors) ^ set(fb.tensors))
        return [
            name for name, info in fb.tensors.items()
            if fa.tensors[name].ggml_type != info.ggml_type
            or not np.array_equal(fa.tensor_data(name), fb.tensor_data(name))
        ]  # fmt: skip


def ggml_quantize_imatrix(src: Path, dst: Path, ftype: int, stats: ActivationStats) -> None:
    """llama_model_quantize given ``stats`` as its importance matrix, as llama-quantize
    --imatrix passes it: one mean-square activation per input column of each tensor."""
    import llama_cpp

    names = sorted(stats.sums)
    values = [stats.importance(n, len(stats.sums[n])) for n in names]  # kept alive until done
    entries = (llama_cpp.llama_model_imatrix_data * (len(names) + 1))()  # NULL-terminated
    for entry, name, v in zip(entries, names, values, strict=False):
        entry.name, entry.size = name.encode(), v.size
        entry.data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, 1
    params.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed ({rc})"


@dataclass
class Row:
    label: str
    path: Path
    seconds: float  # to make the file (0 when cached)

    @property
    def size(self) -> int:
        return self.path.stat().st_size


class QualityRun:
    """Every file of the comparison, made once (ours cached across runs, llama.cpp's per
    session), and every perplexity, measured once per session."""

    def __init__(self, gemma_path: Path, scratch: Path) -> None:
        self.gemma_path, self.scratch = gemma_path, scratch
        self.source = self._source()
        self.cache = keyed_cache("quality", conversion_sources())
        self.eval_text = topics_text(EVAL_TOPICS)
        self.scores: dict[Path, PerplexityResult] = {}
        self.score_seconds: dict[Path, float] = {}
        self.rows: dict[str, Row] = {}

    def _source(self) -> Path:
        folder = keyed_cache("gemma3-270m-offgrid", source_sources()) / "hf"
        if not (folder / ".complete").exists():
            shutil.rmtree(folder, ignore_errors=True)
            real_gemma_checkpoint(self.gemma_path, folder, layers=None, step_noise=STEP_NOISE)
            (folder / ".complete").write_text("")
        return folder

    def _converted(self, key: str, name: str, options: ConvertOptions) -> Row:
        if key not in self.rows:
            path, start = self.cache / name, time.perf_counter()
            if not path.exists():
                convert(self.source, path, options)  # atomic: a complete file or none
            self.rows[key] = Row(key, path, time.perf_counter() - start)
        return self.rows[key]

    def ours(self, type_name: str) -> Row:
        return self._converted(type_name, f"{type_name}.gguf", ConvertOptions(type=type_name))

    def theirs(self, type_name: str, imatrix: bool = False) -> Row:
        key = f"llama.cpp {type_name}" + (" imatrix" if imatrix else "")
        if key not in self.rows:
            path = self.scratch / (key.replace(" ", "-").replace(".", "") + ".gguf")
            start = time.perf_counter()
            if imatrix:
                stats = ActivationStats.load(self.stats())
                ggml_quantize_imatrix(
                    self.ours("f32").path, path, recipe(type_name).file_type, stats
                )
            else:
                ggml_quantize(self.ours("f32").path, path, recipe(type_name).file_type, pure=False)
            self.rows[key] = Row(key, path, time.perf_counter() - start)
        return self.rows[key]

    def stats(self) -> Path:
        """Activation statistics of the calibration text, saved as --calib takes them."""
        path = self.cache / f"calib-{CALIB_TOKENS}.npz"
        if not path.exists():
            stats = collect_stats(Conversion(self.source), topics_text(CALIB_TOPICS),
                                  max_tokens=CALIB_TOKENS, workdir=self.cache)  # fmt: skip
            tmp = path.with_suffix(".part.npz")
            stats.save(tmp)
            os.replace(tmp, path)
        return path

    def budget(self) -> int:
        """--max-memory for a file no larger than llama.cpp's Q4_K_M, KV cache at N_CTX."""
        kv_bytes = Conversion(self.source).plan(ConvertOptions(type="f16", n_ctx=N_CTX)).kv_bytes
        return self.theirs("q4_k_m").size + kv_bytes

    def fitted(self, calibrated: bool) -> Row:
        budget = self.budget()
        options = ConvertOptions(max_memory=budget, n_ctx=N_CTX,
                                 calib=self.stats() if calibrated else None)  # fmt: skip
        key = "fitted --calib" if calibrated else "fitted"
        return self._converted(
            key, f"fitted-{budget}{'-calib' if calibrated else ''}.gguf", options
        )

    def score(self, path: Path, windows: int = WINDOWS) -> PerplexityResult:
        key = (path, windows)
        if key not in self.scores:
            start = time.perf_counter()
            with edgeinfer.load(path, n_ctx=N_CTX) as model:
                self.scores[key] = perplexity(model, self.eval_text, N_CTX, max_windows=windows)
            self.score_seconds[key] = time.perf_counter() - start
        return self.scores[key]


@pytest.fixture(scope="module")
def run(gemma_path, tmp_path_factory) -> QualityRun:
    return QualityRun(gemma_path, tmp_path_factory.mktemp("llama-cpp-quantized"))


# --- the tests -------------------------------------------------------------------------------


def test_recipes_write_llama_quantizes_tensors(run):
    """Every recipe, on the real model (640-wide rows: the K-quant fallbacks), has the tensors
    llama-quantize writes from our F32 file, so a llama.cpp file scores what ours scores."""
    for type_name in TYPES:
        ours, theirs = run.ours(type_name), run.theirs(type_name)
        assert ours.size == theirs.size, type_name
        assert differing_tensors(ours.path, theirs.path) == [], type_name
        if type_name != "q4_k_m":  # kept: the claim below scores llama.cpp's own file
            theirs.path.unlink()


# The per-window bar below follows from llama.cpp's own spread, measured in the test. Cause of
# the differences: edgeinfer rounds where GGML rounds (int8 activations, the float16 query and
# probabilities meeting the cache) but sums exactly; GGML sums in float32, in an order set by
# its kernels' vector width (8 lanes with AVX2, 16 with AVX-512). A last-bit change of an
# activation sometimes moves its int8 rounding by one step, and over 18 layers that drifts the
# logits enough to move a window's mean NLL by ~0.01: llama.cpp's AVX2 and AVX-512 builds give
# different figures for the same file. Switching llama.cpp's flash attention on changes only the
# order and precision of the attention sums, and it moves the windows by as much (measured on
# the AVX2 EPYC: 0.0061 / 0.0145 / 0.0026, against edgeinfer's 0.0055 / 0.0099 / 0.0121).
NLL_FLOOR = 0.01  # the bar where llama.cpp's spread is smaller still
SPREAD_MARGIN = 1.5  # the spread is itself one sample of that drift


def llama_cpp_window_nll(path: Path, windows: list[list[int]], **options: object) -> np.ndarray:
    """llama.cpp's mean NLL of the second half of each window (one batch per window)."""
    llm = llama_cpp_model(path, n_ctx=N_CTX, n_batch=N_CTX, **options)
    try:
        out = []
        for window in windows:
            llm.reset()
            llm.eval(window)
            logits = np.asarray(llm.scores[N_CTX // 2 - 1 : N_CTX - 1], dtype=np.float64)
            target = np.asarray(window[N_CTX // 2 :])
            top = logits.max(axis=1)
            log_z = np.log(np.exp(logits - top[:, None]).sum(axis=1)) + top
            out.append(float(np.mean(log_z - logits[np.arange(len(target)), target])))
    finally:
        llm.close()
    return np.asarray(out)


def test_perplexity_agrees_with_llama_cpp(run):
    """edgeinfer.perplexity against llama.cpp's logits (llama-cpp-python) on the same
    windows: BOS first, the second half of each window scored. The bar: no window further
    from llama.cpp than llama.cpp's flash-attention path is from its default one (x1.5), and
    never tighter than NLL_FLOOR (see the comment above NLL_FLOOR)."""
    path = run.theirs("q4_k_m").path
    with edgeinfer.load(path, n_ctx=N_CTX) as model:
        tokens = model.tokenize(run.eval_text, add_special=False)
        bos = model.tokenizer.bos_id
    totals = [0.0] + [run.score(path, k).nll * run.score(path, k).scored_tokens
                      for k in range(1, WINDOWS + 1)]  # fmt: skip
    ours = np.diff(totals) / (N_CTX // 2)  # per window
    llm = llama_cpp_model(path, n_ctx=N_CTX, n_batch=N_CTX)
    try:
        assert llm.tokenize(run.eval_text.encode(), add_bos=False, special=False) == tokens
    finally:
        llm.close()
    windows = [[bos, *tokens[w * N_CTX + 1 : (w + 1) * N_CTX]] for w in range(WINDOWS)]
    theirs = llama_cpp_window_nll(path, windows, flash_attn=False)  # the path edgeinfer models
    theirs_fa = llama_cpp_window_nll(path, windows, flash_attn=True)
    spread = float(np.max(np.abs(theirs - theirs_fa)))
    bar = max(NLL_FLOOR, SPREAD_MARGIN * spread)
    print("\nper-window NLL, edgeinfer:", np.round(ours, 5), " llama.cpp:", np.round(theirs, 5),
          " llama.cpp flash attention:", np.round(theirs_fa, 5), f" bar {bar:.4f}")  # fmt: skip
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=bar)


def test_fitted_mix_beats_llama_cpp_q4_k_m(run):
    """The issue's claim: fitted to llama.cpp's Q4_K_M file size (--max-memory), edgeinfer's
    mix, with or without a calibration text (the calibrated one in the full run, see
    CALIBRATED), is no larger and scores no worse than llama.cpp's Q4_K_M. The full table also
    shows Q4_K_M given the calibration text's importance matrix: a figure reported, not a bar
    (it and the calibrated fit lie within this short text's noise)."""
    q4 = run.theirs("q4_k_m")
    print("\n" + table(run))
    for calibrated in CALIBRATED:
        fitted = run.fitted(calibrated=calibrated)
        assert fitted.size <= q4.size, fitted.label
        assert run.score(fitted.path).perplexity <= run.score(q4.path).perplexity, fitted.label


def table(run: QualityRun) -> str:
    """type | size and perplexity of edgeinfer's file | of llama.cpp's | seconds to make them."""

    def cells(row: Row | None, same_as: Row | None = None) -> tuple[str, str]:
        if row is None:
            return "", ""
        if same_as is not None:
            return f"{same_as.size / 2**20:.1f}", "= (same tensors)"
        if row.label.split()[-1] in NOT_SCORED:
            return f"{row.size / 2**20:.1f}", "(not scored)"
        return f"{row.size / 2**20:.1f}", f"{run.score(row.path).perplexity:.3f}"

    lines = [f"perplexity: {WINDOWS} windows of {N_CTX} tokens ({WINDOWS * N_CTX // 2} scored) of "
             f"pydoc topics {', '.join(EVAL_TOPICS)}; calibration: {CALIB_TOKENS} tokens of "
             f"{', '.join(CALIB_TOPICS)}; sizes in MiB",
             "| type | edgeinfer MiB | edgeinfer ppl | llama.cpp MiB | llama.cpp ppl |",
             "|---|---|---|---|---|"]  # fmt: skip
    for type_name in TYPES:
        ours = run.ours(type_name)
        theirs = run.rows.get(f"llama.cpp {type_name}")
        kept = theirs is not None and theirs.path.exists()
        lines.append("| {} | {} | {} | {} | {} |".format(
            type_name, *cells(ours),
            *cells(theirs if kept else ours, None if kept else ours)))  # fmt: skip
    fitted = [run.fitted(calibrated) for calibrated in CALIBRATED]
    lines.append("| fitted to Q4_K_M's size | {} | {} | | |".format(*cells(fitted[0])))
    if True in CALIBRATED:
        q4_imatrix = run.theirs("q4_k_m", imatrix=True)
        lines.append("| q4_k_m + imatrix / fitted --calib | {} | {} | {} | {} |".format(
            *cells(fitted[1]), *cells(q4_imatrix)))  # fmt: skip
    for row in fitted:
        with GGUFFile(row.path) as f:
            kinds: dict[str, int] = {}
            for info in f.tensors.values():
                if len(info.shape) == 2:
                    kinds[info.ggml_type.name] = kinds.get(info.ggml_type.name, 0) + 1
            embd = f.tensors["token_embd.weight"].ggml_type.name
        lines.append(f"{row.label}: matrices {kinds}, token_embd {embd}")
    made = {label: round(row.seconds, 1) for label, row in run.rows.items() if row.seconds > 0.5}
    scored = {f"{p.name}/{w}": round(s, 1) for (p, w), s in run.score_seconds.items()}
    lines.append(f"seconds to make: {made}\nseconds to score: {scored}")
    return "\n".join(lines)
