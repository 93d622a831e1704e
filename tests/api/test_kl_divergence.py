"""KL divergence against a saved baseline (edgeinfer.perplexity), checked against numpy.

The reference here computes every figure from the two models' float32 logits with its own
windowing and its own log-softmax, and applies the baseline's documented semantics: tokens more
than LOG_RANGE nats below the top one are dropped, and each stored log-probability is within
half a code step. That bounds how far each token's KL may lie from the reference.
"""

from __future__ import annotations

import math
import os
import struct
import zlib

import numpy as np
import pytest

from edgeinfer import errors
from edgeinfer import perplexity as ppl
from tests.api.conftest import load

N_CTX, WINDOWS = 64, 3
# a few absolute nats for the tokens within half a step of the floor, which the baseline keeps
# (at the floor) and the reference drops: each has a probability below exp(-32)
BOUNDARY = 1e-9


@pytest.fixture(scope="module")
def text():
    from tests.e2e.parity import PROMPTS

    return "\n\n".join(PROMPTS * 2)


def reference_windows(model, text: str) -> list[list[int]]:
    tokens = model.tokenize(text, add_special=False)
    out = []
    for w in range(WINDOWS):
        window = list(tokens[w * N_CTX : (w + 1) * N_CTX])
        if model.tokenizer.add_bos:
            window[0] = model.tokenizer.bos_id
        out.append(window)
    return out


def scored_log_probs(model, windows) -> tuple[np.ndarray, np.ndarray]:
    """Log-softmax of the rows that predict every scored token, and those tokens."""
    rows, targets = [], []
    for window in windows:
        logits = model.logits(window).astype(np.float64)
        rows.append(logits[N_CTX // 2 - 1 : N_CTX - 1])
        targets.extend(window[N_CTX // 2 :])
    logits = np.concatenate(rows)
    return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True), np.asarray(targets)


def reference_kl(log_p: np.ndarray, log_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per token: KL(p' || q) with p' the baseline's distribution as documented (p without the
    tokens beyond LOG_RANGE, renormalized), and the bound on the baseline's deviation from it:
    with every log p' off by at most 2 * half a step after renormalization (e = that bound),
    |KL - KL_ref| <= (exp(e) - 1) * sum p'|log p' - log q| + (exp(e) - 1)^2."""
    top = log_p.max(axis=1, keepdims=True)
    kept = log_p >= top - ppl.LOG_RANGE
    clipped = np.where(kept, log_p, -np.inf)
    log_p1 = clipped - np.logaddexp.reduce(clipped, axis=1, keepdims=True)
    gap = np.where(kept, log_p1 - log_q, 0.0)
    p1 = np.exp(log_p1)
    kl = (p1 * gap).sum(axis=1)
    spread = np.minimum(top[:, 0] - log_p.min(axis=1), ppl.LOG_RANGE)
    err = np.expm1(2 * (spread / ppl.CODE_STEPS / 2))
    return kl, err * (p1 * np.abs(gap)).sum(axis=1) + err**2 + BOUNDARY


def save(model, text, path, **kw):
    return ppl.perplexity(model, text, N_CTX, WINDOWS, save_logits=path, **kw)


# --- a run against its own baseline ----------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_run_against_its_own_baseline(fixture_model, text, tmp_path, arch):
    model = fixture_model(arch, n_ctx=N_CTX)
    base = tmp_path / "base.kld"
    saved = save(model, text, base)
    assert saved == ppl.perplexity(model, text, N_CTX, WINDOWS)  # saving changes no figure
    r = ppl.kl_divergence(model, text, base, N_CTX)
    # half a step is at most 32/65534/2 nats: (exp(2 * that) - 1)^2 = 2.4e-7 per token
    bound = math.expm1(ppl.LOG_RANGE / ppl.CODE_STEPS) ** 2
    assert 0 <= r.kl_max <= bound, r
    assert r.top1_agreement == 1.0 and r.rms_delta_p == 0.0
    assert (r.perplexity, r.base_perplexity, r.nll) == (saved.perplexity,) * 2 + (saved.nll,)
    assert (r.scored_tokens, r.windows) == (saved.scored_tokens, WINDOWS)


# --- two different runs, against numpy -------------------------------------------------------


def pair(fixture_models, fixture_models_f32, case):
    """The models of a case: mixed quantized weights against the same weights in F32, or an F16
    against an F32 cache."""
    arch, what = case
    if what == "weights":
        return load(fixture_models[arch], n_ctx=N_CTX), load(fixture_models_f32[arch], n_ctx=N_CTX)
    path = fixture_models[arch]
    return load(path, n_ctx=N_CTX, kv_type="f16"), load(path, n_ctx=N_CTX, kv_type="f32")


@pytest.mark.parametrize("case", [("gemma3", "weights"), ("qwen2", "kv"), ("llama", "weights")])
def test_kl_between_two_runs_equals_numpy(request, fixture_models, fixture_models_f32, text,
                                          tmp_path, case):  # fmt: skip
    base_model, model = pair(fixture_models, fixture_models_f32, case)
    with base_model, model:
        save(base_model, text, tmp_path / "base.kld")
        r = ppl.kl_divergence(model, text, tmp_path / "base.kld", N_CTX)
        windows = reference_windows(model, text)
        log_p, targets = scored_log_probs(base_model, windows)
        log_q, _ = scored_log_probs(model, windows)
    kl, tol = reference_kl(log_p, log_q)
    print(f"\n{case}: KL {r.kl_mean:.6g} (numpy {kl.mean():.6g}, allowed {tol.mean():.2g}), "
          f"top-1 {r.top1_agreement:.4f}")  # fmt: skip
    assert kl.mean() > 100 * tol.mean()  # the runs differ well beyond the quantization
    assert abs(r.kl_mean - kl.mean()) <= tol.mean()
    # order statistics move by at most the largest deviation
    for ours, theirs in [(r.kl_median, np.median(kl)), (r.kl_p99, np.percentile(kl, 99)),
                         (r.kl_max, kl.max())]:  # fmt: skip
        assert abs(ours - theirs) <= tol.max()
    assert r.kl_stderr == pytest.approx(np.std(kl, ddof=1) / math.sqrt(len(kl)), rel=1e-3)
    same = np.argmax(log_p, axis=1) == np.argmax(log_q, axis=1)
    assert r.top1_agreement == same.mean() and 0 < same.mean() < 1
    rows = np.arange(len(targets))
    delta_p = np.exp(log_q[rows, targets]) - np.exp(log_p[rows, targets])
    assert r.rms_delta_p == pytest.approx(np.sqrt(np.mean(delta_p**2)), rel=1e-9)
    assert r.nll == pytest.approx(-log_q[rows, targets].mean(), rel=1e-12)
    assert r.base_nll == pytest.approx(-log_p[rows, targets].mean(), rel=1e-12)
    assert r.perplexity == pytest.approx(math.exp(r.nll), rel=1e-12)


# --- the file format -------------------------------------------------------------------------


def test_codes_of_a_hand_built_row():
    """Top at code 65535, the floor (LOG_RANGE below it) at 1, anything lower at 0 (dropped);
    decoded values within half a step before renormalization."""
    log_probs = np.log(np.array([[0.6, 0.3, 0.1 - 2e-16, 1e-16, 1e-16]]))  # 1e-16: 36 nats down
    record = ppl._encode(log_probs, np.array([0.5]))
    assert record.dtype.itemsize == 28 + 2 * 5
    codes = record["codes"][0]
    assert codes[0] == 65535 and codes[3] == codes[4] == 0
    assert record["top"][0] == 0 and record["nll"][0] == 0.5
    step = ppl.LOG_RANGE / ppl.CODE_STEPS
    assert record["step"][0] == pytest.approx(step, rel=1e-15)
    raw = record["floor"][0] + (codes[:3] - 1.0) * step
    assert np.all(np.abs(raw - log_probs[0, :3]) <= step / 2 * (1 + 1e-9))
    decoded = ppl.decode(record)[0]
    assert np.isneginf(decoded[3:]).all() and np.exp(decoded[:3]).sum() == pytest.approx(1, 1e-15)


def test_a_narrow_row_spans_its_own_range():
    log_probs = np.log(np.array([[0.5, 0.25, 0.25]]))
    record = ppl._encode(log_probs, np.array([1.0]))
    assert list(record["codes"][0]) == [65535, 1, 1]
    assert record["step"][0] == pytest.approx(math.log(2) / ppl.CODE_STEPS, rel=1e-12)
    assert np.allclose(ppl.decode(record)[0], log_probs[0], atol=1e-12)


def test_file_size_is_as_documented(fixture_model, text, tmp_path):
    model = fixture_model("qwen2", n_ctx=N_CTX)
    save(model, text, tmp_path / "base.kld")
    per_token = 28 + 2 * model.n_vocab
    expected = 64 + WINDOWS * ((N_CTX // 2) * per_token + 4)
    assert os.path.getsize(tmp_path / "base.kld") == expected


# --- refused baselines -----------------------------------------------------------------------


@pytest.fixture()
def baseline(fixture_model, text, tmp_path):
    """The gemma3 fixture's baseline, its model, and the path."""
    model = fixture_model("gemma3", n_ctx=2 * N_CTX)
    save(model, text, tmp_path / "base.kld")
    return model, tmp_path / "base.kld"


def refused(model, text, path, n_ctx=N_CTX, max_windows=None) -> str:
    with pytest.raises(errors.InputFileError) as info:
        ppl.kl_divergence(model, text, path, n_ctx, max_windows)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_another_text_is_refused(baseline, text):
    model, path = baseline
    assert "other tokens" in refused(model, text.replace("the", "a"), path)


def test_another_window_size_or_count_is_refused(baseline, text):
    model, path = baseline
    assert "windows of 64 tokens; this run uses 128" in refused(model, text, path, n_ctx=2 * N_CTX)
    assert "holds 3 windows; this run scores 2" in refused(model, text, path, max_windows=2)
    short = " ".join(text.split()[:60])  # fewer tokens than three windows
    assert "this run scores" in refused(model, short, path)


def test_another_vocabulary_is_refused(baseline, fixture_model, text):
    _, path = baseline
    other = fixture_model("llama", n_ctx=N_CTX)
    assert f"vocabulary of {baseline[0].n_vocab} tokens" in refused(other, text, path)


def test_truncated_or_padded_files_are_refused(baseline, text, tmp_path):
    model, path = baseline
    data = path.read_bytes()
    for size in (len(data) - 1, len(data) // 2, 63, 10, 0):
        path.write_bytes(data[:size])
        message = refused(model, text, path)
        assert "truncated" in message or "not an edgeinfer logits baseline" in message, size
    path.write_bytes(data + b"\0")
    assert "too long" in refused(model, text, path)
    # a header with a valid checksum that announces an absurd vocabulary
    head = ppl.HEADER.pack(ppl.MAGIC, ppl.VERSION, 2**32 - 1, N_CTX, 2**32 - 1, 2**32 - 1,
                           bytes(32))  # fmt: skip
    path.write_bytes(head + struct.pack("<I", zlib.crc32(head)) + data[64:])
    assert "truncated" in refused(model, text, path)


@pytest.mark.parametrize("where", ["magic", "version", "header", "nll", "codes", "crc"])
def test_flipped_bytes_are_refused(baseline, text, where):
    model, path = baseline
    data = bytearray(path.read_bytes())
    record = 28 + 2 * model.n_vocab
    offset = {"magic": 2, "version": 8, "header": 20, "nll": 64 + record + 3,
              "codes": 64 + 5 * record + 500, "crc": len(data) - 2}[where]  # fmt: skip
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    message = refused(model, text, path)
    expected = {"magic": "not an edgeinfer", "version": "format version",
                "header": "header fails its checksum"}.get(where, "fails its checksum")  # fmt: skip
    assert expected in message
    if where in ("nll", "codes"):
        assert "window 1 " in message
    if where == "crc":
        assert "window 3 " in message


def test_a_file_of_another_kind_is_refused(baseline, text, tmp_path):
    model, _ = baseline
    other = tmp_path / "notes.txt"
    other.write_bytes(b"hello" * 100)
    assert "not an edgeinfer logits baseline" in refused(model, text, other)


# --- writing ---------------------------------------------------------------------------------


class Interrupting:
    """A model whose logits() is interrupted (Ctrl-C) on the given call."""

    def __init__(self, model, on_call: int) -> None:
        self.model, self.on_call, self.calls = model, on_call, 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def logits(self, tokens):
        self.calls += 1
        if self.calls == self.on_call:
            raise KeyboardInterrupt
        return self.model.logits(tokens)


def test_an_interrupted_save_leaves_the_old_file(fixture_model, text, tmp_path):
    model = fixture_model("qwen2", n_ctx=N_CTX)
    path = tmp_path / "base.kld"
    path.write_bytes(b"an older baseline")
    with pytest.raises(KeyboardInterrupt):
        save(Interrupting(model, on_call=2), text, path)
    assert path.read_bytes() == b"an older baseline"
    assert os.listdir(tmp_path) == ["base.kld"]  # no temporary left behind
    save(model, text, path)
    magic, version = struct.unpack("<8sI", path.read_bytes()[:12])
    assert (magic, version) == (b"EIKLBASE", 1)
