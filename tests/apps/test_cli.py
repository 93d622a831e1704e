"""`edgeinfer run`, `info`, `doctor` and their errors, run as subprocesses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.api.conftest import ARCHS, load
from tests.apps.conftest import EDGEINFER, assert_one_line_error, cli, engine_args

STATS = re.compile(r"^\[load [\d.]+ s \| prompt (\d+) tok.*\| generated (\d+) tok, [\d.]+ tok/s \| "
                   r"first token \d+ ms \| stop: (\w+)\]$")  # fmt: skip


# --- run -------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_run_prints_only_the_continuation(fixture_models, arch):
    path = fixture_models[arch]
    prompt = "Once upon a time"
    proc = cli("run", path, "-p", prompt, "-n", "24", "--temp", "0", *engine_args())
    assert proc.returncode == 0, proc.stderr
    with load(path) as model:
        expected = model.generate(prompt, max_tokens=24, temperature=0, parse_special=True)
    assert proc.stdout == expected.text  # nothing else: no prompt, no newline when piped
    lines = proc.stderr.strip().split("\n")
    match = STATS.match(lines[-1])
    assert match, proc.stderr
    assert int(match[1]) == expected.stats.prompt_tokens
    assert int(match[2]) == 24 and match[3] == "length"


@pytest.mark.slow
def test_run_on_gemma_equals_the_api(gemma_path):
    proc = cli(
        "run", gemma_path, "-p", "def fibonacci(n):\n", "-n", "16", "--temp", "0", *engine_args()
    )
    assert proc.returncode == 0, proc.stderr
    with load(gemma_path, n_ctx=1024) as model:
        expected = model.generate("def fibonacci(n):\n", max_tokens=16, temperature=0)
    assert proc.stdout == expected.text
    assert expected.text.startswith("    if n")
    assert STATS.match(proc.stderr.strip().split("\n")[-1])


def test_run_reads_the_prompt_from_stdin(fixture_models):
    path = fixture_models["qwen2"]
    a = cli("run", path, "-p", "-", "-n", "8", "--temp", "0", *engine_args(), input="From stdin")
    b = cli("run", path, "-p", "From stdin", "-n", "8", "--temp", "0", *engine_args())
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout and a.stdout


def test_run_sampling_options(fixture_models):
    path = fixture_models["gemma3"]
    common = ["run", path, "-p", "Seeds", "-n", "16", *engine_args()]
    a = cli(*common, "--temp", "1.0", "--seed", "3")
    b = cli(*common, "--temp", "1.0", "--seed", "3")
    c = cli(*common, "--temp", "1.0", "--seed", "4", "--top-k", "0", "--top-p", "1", "--min-p", "0")
    assert a.returncode == b.returncode == c.returncode == 0
    assert a.stdout == b.stdout and a.stdout != c.stdout
    with load(path) as model:
        expected = model.generate("Seeds", max_tokens=16, temperature=1.0, seed=3)
    assert a.stdout == expected.text


def test_run_stop_string(fixture_models):
    path = fixture_models["llama"]
    full = cli("run", path, "-p", "Stop", "-n", "30", "--temp", "0", *engine_args()).stdout
    assert len(full) > 10
    stop = full[5:8]
    proc = cli("run", path, "-p", "Stop", "-n", "30", "--temp", "0", "--stop", stop, *engine_args())
    assert proc.stdout == full[: full.index(stop)]
    assert proc.stderr.strip().endswith("stop: stop]")


def test_run_special_tokens_in_the_prompt(fixture_models):
    path = fixture_models["llama"]
    prompt = "<|start_header_id|>user<|end_header_id|>"
    parsed = cli("run", path, "-p", prompt, "-n", "1", "--temp", "0", *engine_args())
    plain = cli("run", path, "-p", prompt, "-n", "1", "--temp", "0", "--no-special", *engine_args())
    n_parsed = int(STATS.match(parsed.stderr.strip().split("\n")[-1])[1])
    n_plain = int(STATS.match(plain.stderr.strip().split("\n")[-1])[1])
    with load(path) as model:
        assert n_parsed == len(model.tokenize(prompt, parse_special=True))
        assert n_plain == len(model.tokenize(prompt, parse_special=False)) > n_parsed


def test_run_into_a_closed_pipe(fixture_models):
    """`edgeinfer run ... | head -c 1`: the reader leaves early; no traceback, no error."""
    proc = subprocess.Popen(
        [EDGEINFER, "run", fixture_models["qwen3"], "-p", "Pipe", "-n", "500", "--temp", "0",
         *engine_args()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "error" not in err.lower()


def test_module_entry_point(fixture_models):
    proc = subprocess.run(
        [sys.executable, "-m", "edgeinfer.apps.cli", "run", fixture_models["llama"],
         "-p", "Hi", "-n", "3", "--temp", "0", *engine_args()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    again = cli(
        "run", fixture_models["llama"], "-p", "Hi", "-n", "3", "--temp", "0", *engine_args()
    )
    assert proc.stdout == again.stdout


def test_help_and_version():
    proc = cli()
    assert proc.returncode == 2 and "run" in proc.stdout and "chat" in proc.stdout
    proc = cli("--version")
    import edgeinfer

    assert proc.returncode == 0 and proc.stdout.strip() == f"edgeinfer {edgeinfer.__version__}"


# --- info ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_info_json_against_the_gguf_package(fixture_models, arch):
    import gguf

    path = fixture_models[arch]
    proc = cli("info", path, "--json", "-c", "512")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    reader = gguf.GGUFReader(str(path))

    def field(key: str):
        return reader.fields[key].contents()

    assert info["architecture"] == field("general.architecture") == arch
    assert info["context_length"] == field(f"{arch}.context_length")
    assert info["layers"] == field(f"{arch}.block_count")
    assert info["embedding_length"] == field(f"{arch}.embedding_length")
    assert info["heads"] == field(f"{arch}.attention.head_count")
    assert info["kv_heads"] == field(f"{arch}.attention.head_count_kv")
    assert info["vocab_size"] == len(field("tokenizer.ggml.tokens"))
    assert info["name"] == field("general.name")
    assert info["file_size"] == os.path.getsize(path)
    assert info["tensors"] == len(reader.tensors)
    assert info["parameters"] == sum(int(t.n_elements) for t in reader.tensors)
    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    assert info["tensor_types"] == types
    mem = info["memory_estimate"]
    assert mem["context"] == 512
    assert mem["weights_bytes"] == sum(int(t.n_bytes) for t in reader.tensors)
    head_dim = reader.fields.get(f"{arch}.attention.key_length")
    head_dim = head_dim.contents() if head_dim else info["embedding_length"] // info["heads"]
    # K and V, float16, every layer, every position of the context, every KV head
    assert mem["kv_cache_bytes"] == 2 * 2 * info["layers"] * 512 * info["kv_heads"] * head_dim
    assert mem["total_bytes"] == mem["weights_bytes"] + mem["kv_cache_bytes"]
    assert info["chat_template"] is False


def test_info_on_gemma(gemma_path):
    info = json.loads(cli("info", gemma_path, "--json").stdout)
    assert info["architecture"] == "gemma3"
    assert info["context_length"] == 32768
    assert 250e6 < info["parameters"] < 300e6  # "270M"
    assert info["vocab_size"] == 262144
    assert info["memory_estimate"]["context"] == 4096
    assert "Q4_K" in info["tensor_types"] and sum(info["tensor_types"].values()) == info["tensors"]
    text = cli("info", gemma_path)
    assert text.returncode == 0
    for label in (
        "architecture",
        "parameters",
        "context length",
        "tensor types",
        "memory estimate",
    ):
        assert label in text.stdout
    assert "gemma3" in text.stdout and "Q4_K" in text.stdout


# --- bench -----------------------------------------------------------------------------------

BENCH_FIELDS = {
    "model", "engine", "isa", "threads", "n_prompt", "n_gen", "repetitions", "pp_tok_s",
    "pp_tok_s_sd", "tg_tok_s", "tg_tok_s_sd", "ttft_s", "ttft_cold_s", "load_s", "peak_rss_mb",
    "engine_memory_mb", "weight_copies_mb",
}  # fmt: skip


def test_bench_json(fixture_models):
    """A tiny run: every field there, each figure what it says it is (no timing bars)."""
    path = fixture_models["llama"]
    proc = cli("bench", path, "-p", "8", "-n", "4", "-r", "2", "-t", "1", "--json", *engine_args())
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert set(r) >= BENCH_FIELDS, BENCH_FIELDS - set(r)
    with load(path) as model:
        assert r["engine"] == model.engine
    assert r["model"] == str(path)
    assert (r["n_prompt"], r["n_gen"], r["repetitions"], r["threads"]) == (8, 4, 2, 1)
    assert isinstance(r["isa"], str) and r["isa"]
    rates = (
        "pp_tok_s",
        "tg_tok_s",
        "ttft_s",
        "ttft_cold_s",
        "load_s",
        "peak_rss_mb",
        "engine_memory_mb",
    )
    for key in rates:
        assert np.isfinite(r[key]) and r[key] > 0, (key, r[key])
    for key in ("pp_tok_s_sd", "tg_tok_s_sd", "weight_copies_mb"):
        assert np.isfinite(r[key]) and r[key] >= 0, (key, r[key])
    # ttft is the mean time of the 8-token prompt, pp the mean of 8 / time: the mean of the
    # rates is at least the rate of the mean time (Jensen), equal when the runs tie
    assert r["pp_tok_s"] * r["ttft_s"] >= 8 * (1 - 1e-9)
    assert r["peak_rss_mb"] >= r["weight_copies_mb"]


def test_bench_text(fixture_models):
    proc = cli("bench", fixture_models["qwen2"], "-p", "8", "-n", "4", "-r", "1", *engine_args())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("qwen2.gguf: ")
    labels = [line.split()[0] for line in lines[1:6]]
    assert labels == ["pp8", "tg4", "ttft", "load", "peak"], proc.stdout
    assert lines[1].endswith("tok/s") and lines[2].endswith("tok/s"), proc.stdout


def _native_available() -> bool:
    from edgeinfer import _native

    return _native.available()[0]


needs_native = pytest.mark.skipif(not _native_available(), reason="native library unavailable")


@needs_native
def test_bench_profile_prints_both_tables(fixture_models):
    path = fixture_models["llama"]
    args = ("bench", path, "--profile", "-p", "16", "-n", "3", "-t", "2", "--engine", "native")
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith("llama.gguf: native engine (") and "per-op profile" in text
    assert "prompt step of 16 tokens: " in text and "decoding, 3 steps of one token: " in text
    assert text.count("GFLOP/s") == 2
    for label in ("matmul Q4_0 256x256", "attention", "python side", "sampling (argmax)"):
        assert text.count(f"  {label} ") == 2, label

    r = json.loads(cli(*args, "--json").stdout)
    assert (r["n_prompt"], r["n_gen"], r["engine"]) == (16, 3, "native")
    for phase in ("prompt", "decode"):
        assert {"step_ms", "engine_ms", "python_ms", "sampling_ms", "parts_ms"} <= set(r[phase])
        assert {row["op"] for row in r[phase]["ops"]} >= {"attention", "python side"}


def test_bench_profile_on_the_reference_engine_is_a_one_line_error(fixture_models):
    proc = cli("bench", fixture_models["llama"], "--profile", "-p", "4", "-n", "1",
               "--engine", "reference")  # fmt: skip
    assert "no per-op profile" in assert_one_line_error(proc, 2)  # an impossible option


# --- perplexity ------------------------------------------------------------------------------

PPL_CTX, PPL_WINDOWS = 128, 3
# mean NLL per scored token (nats) against llama.cpp's on F32 weights, where the F16 cache and
# summation order are all that differ: 1.1e-5 (llama) and 1.7e-5 (gemma3) measured on an AVX2
# EPYC; the bar is 10x the worse, rounded up
NLL_BAR = 2e-4


def llama_cpp_window_nll(path, text: str, n_ctx: int, windows: int) -> tuple[float, int]:
    """llama-perplexity's figure from llama.cpp's logits (llama-cpp-python), computed here:
    llama.cpp's tokens, each window's first token BOS, the second half of each window scored.
    Mean NLL per scored token and the number of tokens scored."""
    from tests.conftest import llama_cpp_model

    llm = llama_cpp_model(path, n_ctx=n_ctx, n_batch=n_ctx)
    try:
        tokens = llm.tokenize(text.encode(), add_bos=False, special=False)
        adds_bos = llm.tokenize(b"", add_bos=True, special=False) == [llm.token_bos()]
        total, count = 0.0, 0
        for w in range(windows):
            window = tokens[w * n_ctx : (w + 1) * n_ctx]
            if adds_bos:
                window[0] = llm.token_bos()
            llm.reset()
            llm.eval(window)
            logits = np.asarray(llm.scores[n_ctx // 2 - 1 : n_ctx - 1], dtype=np.float64)
            target = np.asarray(window[n_ctx // 2 :])
            top = logits.max(axis=1)
            log_z = np.log(np.exp(logits - top[:, None]).sum(axis=1)) + top
            total += float(np.sum(log_z - logits[np.arange(len(target)), target]))
            count += len(target)
    finally:
        llm.close()
    return total / count, count


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_perplexity_against_llama_cpp(fixture_models_f32, arch, tmp_path):
    from tests.e2e.parity import PROMPTS

    path = fixture_models_f32[arch]
    text_file = tmp_path / "text.txt"
    text_file.write_text("\n\n".join(PROMPTS * 2), encoding="utf-8")
    args = ["perplexity", path, "-f", text_file, "-c", PPL_CTX, "--chunks", PPL_WINDOWS]
    proc = cli(*args, "--json", *engine_args())
    assert proc.returncode == 0, proc.stderr
    ours = json.loads(proc.stdout)
    nll, count = llama_cpp_window_nll(path, text_file.read_text(encoding="utf-8"), PPL_CTX,
                                      PPL_WINDOWS)  # fmt: skip
    print(
        f"\n{arch} perplexity: NLL edgeinfer {ours['nll']:.7f}, llama.cpp {nll:.7f}, "
        f"difference {abs(ours['nll'] - nll):.2e}"
    )
    assert (ours["windows"], ours["scored_tokens"]) == (PPL_WINDOWS, count)
    assert abs(ours["nll"] - nll) < NLL_BAR
    assert ours["perplexity"] == pytest.approx(np.exp(ours["nll"]), rel=1e-12)
    text = cli(*args, *engine_args())
    assert text.returncode == 0, text.stderr
    assert text.stdout.strip() == (f"perplexity {ours['perplexity']:.4f} over {count} tokens "
                                   f"({PPL_WINDOWS} windows of {PPL_CTX})")  # fmt: skip


# --- doctor ----------------------------------------------------------------------------------


def test_doctor_json():
    proc = cli("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    import edgeinfer

    assert report["edgeinfer"] == edgeinfer.__version__
    assert report["python"] == ".".join(map(str, sys.version_info[:3]))
    cpu = report["cpu"]
    assert cpu["logical_cores"] == os.cpu_count()
    assert 1 <= cpu["physical_cores"] <= cpu["logical_cores"]
    assert cpu["model"] and cpu["arch"]
    assert isinstance(cpu["features"], list)
    if sys.platform.startswith("linux"):
        with open("/proc/cpuinfo") as f:
            flags = set()
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags |= set(line.split(":", 1)[1].split())
        assert set(cpu["features"]) <= flags
        with open("/proc/meminfo") as f:
            total_kb = int(f.readline().split()[1])
        assert report["memory"]["total_mb"] == total_kb // 1024
        assert 0 < report["memory"]["available_mb"] <= report["memory"]["total_mb"]
    names = {b["name"]: b for b in report["backends"]}
    assert names["reference"]["available"] is True
    for backend in report["backends"]:
        assert set(backend) >= {"name", "available", "detail"}


def test_doctor_text():
    proc = cli("doctor")
    assert proc.returncode == 0
    assert "cpu" in proc.stdout and "backend" in proc.stdout and "reference" in proc.stdout


# --- errors ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, gemma_path):
    folder = tmp_path_factory.mktemp("bad")
    (folder / "empty.gguf").write_bytes(b"")
    (folder / "text.gguf").write_text("this is not a model\n")
    rng = np.random.default_rng(0)
    (folder / "noise.gguf").write_bytes(
        b"GGUF" + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    )
    with open(gemma_path, "rb") as f:
        (folder / "truncated.gguf").write_bytes(f.read(3 << 20))
    (folder / "folder.gguf").mkdir()
    return folder


@pytest.mark.parametrize("name", ["missing.gguf", "empty.gguf", "text.gguf", "noise.gguf",
                                  "truncated.gguf", "folder.gguf"])  # fmt: skip
@pytest.mark.parametrize("command", ["run", "info", "chat"])
def test_bad_model_files(bad_files, name, command):
    args = {"run": ["-p", "hi", "-n", "2"], "info": [], "chat": []}[command]
    proc = cli(command, bad_files / name, *args)
    line = assert_one_line_error(proc)
    assert name in line or "folder" in line


@pytest.mark.parametrize(
    "args",
    [["-n", "-5"], ["--top-p", "0"], ["--min-p", "3"], ["--top-k", "-1"], ["-c", "0"], ["-t", "0"],
     ["--repeat-penalty", "0"], ["--stop", ""], ["--seed", "-1"], ["--temp", "-1"],
     ["-c", "-5"], ["-t", "100000"], ["-c", str(1 << 40)]],
)  # fmt: skip
def test_bad_option_values(fixture_models, args):
    proc = cli("run", fixture_models["llama"], "-p", "hi", *args)
    line = assert_one_line_error(proc, status=2)
    # the message is about the option given, not a list of every parameter
    assert "n_seq_max" not in line and "n_batch" not in line


def test_usage_errors_exit_2(fixture_models):
    for args in (["run", fixture_models["llama"]],
                 ["run", fixture_models["llama"], "-p", "x", "--temp", "hot"],
                 ["nonsense"], ["info", fixture_models["llama"], "-c", "-5"],
                 ["info", fixture_models["llama"], "-c", "0"],
                 ["perplexity", fixture_models["llama"], "-f", "x", "-c", "1"]):  # fmt: skip
        assert_one_line_error(cli(*args), status=2)


def test_threads_beyond_the_limit_name_the_threads(fixture_models):
    line = assert_one_line_error(cli("info", fixture_models["llama"], "-c", "-5"), status=2)
    assert "-c" in line or "ctx" in line
    line = assert_one_line_error(
        cli("run", fixture_models["llama"], "-p", "hi", "-t", "100000"), status=2
    )
    assert "threads" in line and "100000" in line


def test_perplexity_of_a_file_that_is_not_utf8(fixture_models, tmp_path):
    text = tmp_path / "latin1.txt"
    text.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    line = assert_one_line_error(cli("perplexity", fixture_models["llama"], "-f", text))
    assert "UTF-8" in line and "offset 3" in line


def test_prompt_too_long_for_the_context(fixture_models):
    proc = cli("run", fixture_models["llama"], "-p", "word " * 100, "-c", "32")
    line = assert_one_line_error(proc)
    assert "context" in line


def test_run_in_a_terminal_and_ctrl_c(fixture_models):
    import pexpect

    path = fixture_models["qwen3"]
    args = ["run", str(path), "-p", "Go", "-n", "3", "--temp", "0", *engine_args()]
    child = pexpect.spawn(EDGEINFER, args, encoding="utf-8", timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    with load(path) as model:
        text = model.generate("Go", max_tokens=3, temperature=0).text
    # on a terminal the continuation is followed by a newline, then the stats
    assert child.exitstatus == 0
    assert child.before.replace("\r\n", "\n").startswith(text.replace("\r\n", "\n") + "\n[load ")
    args = [
        "run",
        str(path),
        "-p",
        "Go",
        "-n",
        "100000",
        "-c",
        "2048",
        "--temp",
        "0",
        *engine_args(),
    ]
    child = pexpect.spawn(EDGEINFER, args, encoding="utf-8", timeout=60)
    child.expect(r"(?s).{20}")
    child.sendintr()
    child.expect(r"stop: cancelled\]")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130


def test_non_utf8_prompt_on_stdin(fixture_models):
    proc = subprocess.run(
        [EDGEINFER, "run", str(fixture_models["llama"]), "-p", "-", "-n", "2"],
        input=b"\xff\xfe not text", capture_output=True, timeout=300,
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 1 and err.count("\n") == 1, err
    assert err.startswith("edgeinfer: error: the prompt on stdin is not UTF-8") and "0xff" in err


def test_chat_goes_on_after_a_line_that_cannot_be_sent(fixture_models):
    proc = subprocess.run(
        [EDGEINFER, "chat", str(fixture_models["llama"]), "-n", "3", "--temp", "0",
         *engine_args()],
        input=b"hi\n\xff\nhello\n", capture_output=True, timeout=300,
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "(not sent:" in err and err.count("generated") == 2, err
