"""The KV cache options of `run`, `chat`, `info`, `bench` and `perplexity`, as subprocesses."""

from __future__ import annotations

import json
import re

import pytest

import edgeinfer
from tests.apps.conftest import assert_one_line_error, cli, engine_args
from tests.kv.texts import python_help_text


def test_info_reports_the_cache_of_the_chosen_types(gemma_path):
    """Bytes per token count the 3 global layers only (the 15 local ones keep their window,
    a slack of 32 and a batch of 512, in blocks of 32, plus 2 at the edges: 35 blocks):
    Gemma 3 270M has 1 KV head of 256 values; q8_0 is 34 bytes per 32, q4_0 18."""
    out = json.loads(cli("info", gemma_path, "--json", "-c", "32768", "-ctk", "q8_0",
                         "-ctv", "q4_0").stdout)  # fmt: skip
    kv = out["kv_cache"]
    per_layer = 256 // 32 * 34 + 256 // 32 * 18
    assert kv["bytes_per_token"] == 3 * per_layer
    assert kv["total_bytes"] == (3 * 32768 + 15 * 35 * 32) * per_layer
    assert (kv["bits_per_value_k"], kv["bits_per_value_v"]) == (8.5, 4.5)
    assert out["sliding_windows"] == [512]
    full = json.loads(cli("info", gemma_path, "--json", "-c", "32768", "--swa-full").stdout)
    assert full["kv_cache"]["total_bytes"] == 18 * 32768 * 2 * 256 * 2  # f16, every layer
    text = cli("info", gemma_path, "-c", "4096", "-ctk", "q4_0").stdout
    assert "K q4_0 (4.5 bits), V q4_0 (4.5 bits)" in text and "in rings" in text


def test_info_and_run_with_a_kivi_cache(gemma_path, fixture_models):
    """kivi4 in groups of 64: 4.5 bits a value (4 + 32 / 64); at 4,096 positions the newest
    128 stay in f16, counted in the cache's bits per value."""
    out = json.loads(cli("info", gemma_path, "--json", "-c", "4096", "-ctk", "kivi4", "-ctv",
                         "kivi4", "--kivi-group", "64").stdout)  # fmt: skip
    kv = out["kv_cache"]
    assert (kv["bits_per_value_k"], kv["bits_per_value_v"]) == (4.5, 4.5)
    assert (kv["kivi_group"], kv["kivi_residual"]) == (64, 128)
    assert kv["bits_per_value"] == round((3968 * 4.5 + 128 * 16) / 4096, 3)
    # 3 global layers of a K group (scales, zeros, codes) and 64 V rows of 4 channel groups
    assert kv["bytes_per_token"] == 3 * (256 * 4 + 256 * 64 // 2 + 64 * 4 * (4 + 64 // 2)) // 64
    proc = cli("run", fixture_models["llama"], "-p", "Hello", "-n", "8", "--temp", "0", "-ctk",
               "kivi2", "-ctv", "kivi2", "--kivi-residual", "0", *engine_args())  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    mixed = cli("run", fixture_models["llama"], "-p", "x", "-ctk", "kivi4", "-ctv", "f16")
    assert "both KIVI" in assert_one_line_error(mixed, status=2)


def test_bench_reports_the_cache_and_the_policy(fixture_models):
    args = ["-p", "16", "-n", "40", "-c", "32", "-r", "1", "--context-policy", "streaming"]
    proc = cli("bench", fixture_models["llama"], *args, "-ctk", "q8_0", "--json", *engine_args())
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["kv_cache"]["cache_type_k"] == "q8_0" and r["kv_cache"]["cache_type_v"] == "f16"
    assert r["policy"] == "streaming" and r["dropped_tokens"] >= 40 - 32
    too_long = cli("bench", fixture_models["llama"], "-p", "16", "-n", "40", "-c", "32")
    assert "choose a context policy" in assert_one_line_error(too_long, status=2)


def test_run_past_the_context_under_a_policy(fixture_models):
    args = ("run", fixture_models["llama"], "-p", "Hello", "-n", "100", "-c", "32", "--temp",
            "0", *engine_args())  # fmt: skip
    plain = cli(*args)
    assert plain.returncode == 0 and "stop: length" in plain.stderr
    assert "generated 3" in plain.stderr  # the context's room after the prompt, then it stops
    for policy in ("shift", "streaming"):
        proc = cli(*args, "--context-policy", policy, "-ctk", "q4_0", "-ctv", "q8_0")
        assert proc.returncode == 0, proc.stderr
        generated = int(re.search(r"generated (\d+) tok", proc.stderr).group(1))
        assert generated > 29  # past the context (this random model may end with its EOS)


@pytest.mark.parametrize(
    "bad",
    [
        ["-ctk", "q9"],
        ["--context-policy", "forever"],
        ["--n-sink", "-1"],
    ],
)
def test_bad_cache_options_are_usage_errors(fixture_models, bad):
    proc = cli("run", fixture_models["llama"], "-p", "x", *bad)
    assert_one_line_error(proc, status=2)


def test_streamed_perplexity_against_the_api(gemma_path, tmp_path):
    text = tmp_path / "help.txt"
    text.write_text(python_help_text()[:2000], encoding="utf-8")
    proc = cli("perplexity", gemma_path, "-f", text, "-c", "128", "--context-policy",
               "streaming", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    with edgeinfer.load(gemma_path, n_ctx=128, context_policy="streaming") as m:
        from edgeinfer.perplexity import stream_perplexity

        want = stream_perplexity(m, text.read_text(encoding="utf-8"))
    assert r["scored_tokens"] == want.scored_tokens > 3 * 128
    assert r["perplexity"] == pytest.approx(want.perplexity, rel=1e-9)
    assert r["dropped_tokens"] > 128
