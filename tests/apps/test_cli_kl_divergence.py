"""`edgeinfer perplexity --save-logits BASE` and `--kl-base BASE`, run as subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from edgeinfer.perplexity import kl_divergence
from tests.api.conftest import load
from tests.apps.conftest import EDGEINFER, assert_one_line_error, cli, engine_args

N_CTX, WINDOWS = 64, 3


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    from tests.e2e.parity import PROMPTS

    path = tmp_path_factory.mktemp("kl-text") / "text.txt"
    path.write_text("\n\n".join(PROMPTS * 2), encoding="utf-8")
    return path


def perplexity_args(model, text_file, *more):
    return ["perplexity", model, "-f", text_file, "-c", N_CTX, *more, *engine_args()]


def test_save_then_compare(fixture_models, fixture_models_f32, text_file, tmp_path):
    """Quantized weights as the baseline, the same weights in F32 compared with it: the
    figures are the API's, and the baseline's perplexity is the saving run's."""
    base = tmp_path / "gemma3.kld"
    saved = cli(*perplexity_args(fixture_models["gemma3"], text_file, "--chunks", WINDOWS,
                                 "--save-logits", base, "--json"))  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    saved_figures = json.loads(saved.stdout)
    assert saved_figures["windows"] == WINDOWS and base.is_file()

    # no --chunks: the baseline's window count
    compared = cli(*perplexity_args(fixture_models_f32["gemma3"], text_file, "--kl-base", base,
                                    "--json"))  # fmt: skip
    assert compared.returncode == 0, compared.stderr
    ours = json.loads(compared.stdout)
    with load(fixture_models_f32["gemma3"], n_ctx=N_CTX) as model:
        expected = kl_divergence(model, text_file.read_text(encoding="utf-8"), base, N_CTX)
    assert ours == expected.as_dict()
    assert ours["base_perplexity"] == saved_figures["perplexity"]
    assert ours["kl_mean"] > 0 and 0 < ours["top1_agreement"] < 1

    text = cli(*perplexity_args(fixture_models_f32["gemma3"], text_file, "--kl-base", base))
    assert text.returncode == 0, text.stderr
    r = expected
    assert text.stdout.splitlines() == [
        f"perplexity {r.perplexity:.4f} (baseline {r.base_perplexity:.4f}) over "
        f"{r.scored_tokens} tokens ({WINDOWS} windows)",
        f"KL divergence mean {r.kl_mean:.6f} +/- {r.kl_stderr:.6f}, median {r.kl_median:.6f}, "
        f"p99 {r.kl_p99:.6f}, max {r.kl_max:.6f}",
        f"top-1 agreement {100 * r.top1_agreement:.2f} +/- {100 * r.top1_stderr:.2f} %",
        f"RMS delta p {100 * r.rms_delta_p:.3f} %",
    ]


def test_a_mismatched_baseline_is_one_line_and_status_1(fixture_models, text_file, tmp_path):
    base = tmp_path / "llama.kld"
    model = fixture_models["llama"]
    saved = cli(*perplexity_args(model, text_file, "--chunks", 2, "--save-logits", base))
    assert saved.returncode == 0, saved.stderr
    wrong_ctx = ["perplexity", model, "-f", text_file, "-c", 2 * N_CTX, "--kl-base", base]
    line = assert_one_line_error(cli(*wrong_ctx, *engine_args()))
    assert "windows of 64 tokens; this run uses 128" in line and str(base) in line
    other_vocab = perplexity_args(fixture_models["gemma3"], text_file, "--kl-base", base)
    assert "vocabulary" in assert_one_line_error(cli(*other_vocab))
    base.write_bytes(base.read_bytes()[:-1])
    truncated = perplexity_args(model, text_file, "--kl-base", base)
    assert "truncated" in assert_one_line_error(cli(*truncated))
    missing = perplexity_args(model, text_file, "--kl-base", tmp_path / "absent.kld")
    assert "absent.kld" in assert_one_line_error(cli(*missing))


def test_save_and_compare_together_is_a_usage_error(fixture_models, text_file, tmp_path):
    args = perplexity_args(fixture_models["llama"], text_file, "--save-logits", tmp_path / "a",
                           "--kl-base", tmp_path / "b")  # fmt: skip
    assert_one_line_error(cli(*args), status=2)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)]
)
def test_an_interrupted_save_leaves_nothing(gemma_path, text_file, tmp_path, sig, status):
    """Gemma 3 takes seconds per window, so the signal comes while the baseline is written."""
    out = tmp_path / "out"
    out.mkdir()
    base = out / "gemma.kld"
    proc = subprocess.Popen(
        [EDGEINFER, *map(str, perplexity_args(gemma_path, text_file, "--save-logits", base))],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not os.listdir(out) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert [name.endswith(".part") for name in os.listdir(out)] == [True]
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == status
    assert "Traceback" not in proc.stderr.read().decode()
    assert os.listdir(out) == []
