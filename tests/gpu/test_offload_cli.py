"""-ngl N|auto|all (and --gpu-device) on the commands that load a model: run, chat, bench,
perplexity and serve, each against the API with the same n_gpu_layers, on Mesa's lavapipe.
With -ngl the plan (what went to the GPU, the bytes and the free memory) goes to stderr."""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess

import pytest

import edgeinfer
from edgeinfer import _native
from edgeinfer.conversation import Conversation
from tests.apps.conftest import EDGEINFER, assert_one_line_error, cli
from tests.gpu import need_vulkan

pytestmark = pytest.mark.skipif(not _native.available()[0], reason="no native library")

PLAN = re.compile(r"^GPU offload: (layers? [\d-]+ of \d+ and the output|the output only|none)")


@pytest.fixture(scope="module")
def vulkan():
    return need_vulkan()


def _generate(path, prompt: str, n: int, n_gpu_layers) -> str:
    with edgeinfer.load(path, n_gpu_layers=n_gpu_layers, n_threads=2) as m:
        return m.generate(prompt, max_tokens=n, temperature=0).text


def test_run_with_auto_prints_the_plan_and_the_same_text(vulkan, fixture_models):
    path = fixture_models["gemma3"]
    budget = {"EDGEINFER_VULKAN_BUDGET": "64M"}
    proc = cli("run", path, "-p", "Hello there", "-n", "8", "--temp", "0", "-t", "2",
               "-ngl", "auto", "-c", "4096", env=budget)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert PLAN.match(lines[0]), proc.stderr
    n = int(re.search(r"n_gpu_layers (\d+)", lines[0]).group(1))
    assert 1 <= n < 7  # the 4096-token context leaves room for some layers only
    assert "of 64.0 MiB free (EDGEINFER_VULKAN_BUDGET)" in lines[1]
    assert "beside the output fit" in lines[2]
    assert proc.stdout == _generate(path, "Hello there", 8, n)


def test_run_with_a_number_that_does_not_fit_is_a_one_line_error(vulkan, fixture_models):
    proc = cli("run", fixture_models["gemma3"], "-p", "Hi", "-n", "2", "-ngl", "all",
               env={"EDGEINFER_VULKAN_BUDGET": "8M"})  # fmt: skip
    line = assert_one_line_error(proc)
    assert "n_gpu_layers 7 needs" in line and "8.0 MiB is free" in line


@pytest.mark.parametrize("command", ["run", "chat", "bench", "perplexity", "serve"])
def test_every_loading_command_checks_ngl(vulkan, fixture_models, command):
    extra = {"run": ["-p", "x"], "perplexity": ["-f", "/dev/null"]}.get(command, [])
    proc = cli(command, fixture_models["llama"], *extra, "-ngl", "lots")
    line = assert_one_line_error(proc, 2)
    assert "-ngl/--n-gpu-layers: expected a number, 'auto' or 'all', got 'lots'" in line


def test_chat_offloads(vulkan, fixture_models):
    path = fixture_models["gemma3"]
    proc = cli("chat", path, "--temp", "0", "-n", "6", "-t", "2", "-ngl", "3", input="Hello\n")
    assert proc.returncode == 0, proc.stderr
    assert "GPU offload: layers 4-5 of 6 and the output (n_gpu_layers 3)" in proc.stderr
    with edgeinfer.load(path, n_gpu_layers=3, n_threads=2) as model:
        reply = "".join(Conversation(model, max_tokens=6, temperature=0).send("Hello"))
    assert proc.stdout == f"{reply}\n"


def test_bench_reports_the_offload(vulkan, fixture_models):
    path = fixture_models["llama"]
    proc = cli("bench", path, "-p", "8", "-n", "2", "-r", "1", "-t", "2", "-ngl", "all", "--json")
    assert proc.returncode == 0, proc.stderr
    gpu = json.loads(proc.stdout)["gpu"]
    with edgeinfer.load(path, n_ctx=10, n_batch=8, n_gpu_layers="all") as m:
        plan = m.gpu_plan
    assert gpu["n_gpu_layers"] == 3 and gpu["device_name"] == plan.device_name
    assert gpu["total_bytes"] == plan.total_bytes  # bench's context: prompt + generated
    text = cli("bench", path, "-p", "8", "-n", "2", "-r", "1", "-t", "2", "-ngl", "2")
    assert text.returncode == 0, text.stderr
    assert re.search(r"^gpu +2 of 3 \(layers and the output\) on llvmpipe", text.stdout, re.M)


def test_perplexity_offloaded_agrees_with_the_cpu(vulkan, fixture_models_f32, tmp_path):
    """f32 weights and an f32 cache: the device and the CPU agree to float noise."""
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 12)
    args = ("perplexity", fixture_models_f32["qwen2"], "-f", text, "-c", "32", "--json",
            "--cache-type-k", "f32", "--cache-type-v", "f32", "-t", "2")  # fmt: skip
    cpu, gpu = cli(*args), cli(*args, "-ngl", "all")
    assert cpu.returncode == 0 and gpu.returncode == 0, (cpu.stderr, gpu.stderr)
    assert PLAN.match(gpu.stderr) and "GPU offload" not in cpu.stderr
    a, b = json.loads(cpu.stdout), json.loads(gpu.stdout)
    assert a["scored_tokens"] == b["scored_tokens"] > 0
    assert b["perplexity"] == pytest.approx(a["perplexity"], rel=1e-5)


def test_serve_offloads_and_batches(vulkan, fixture_models):
    """Several requests at once over the device's layers: each gets the text it gets alone
    through the API with the same offload (a request's tokens do not depend on what else is
    batched), and the plan went to the log."""
    import openai

    path = fixture_models["gemma3"]
    proc = subprocess.Popen(
        [EDGEINFER, "serve", str(path), "--port", "0", "-t", "2", "--parallel", "4", "-ngl", "4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        log = []
        while not (m := re.search(r"on (http://127\.0\.0\.1:\d+)$", log[-1] if log else "")):
            line = proc.stderr.readline()
            assert line, "".join(log)
            log.append(line.strip())
        client = openai.OpenAI(base_url=m.group(1) + "/v1", api_key="none", max_retries=2)
        prompts = ["One two three", "The weather today", "Once upon a time", "Numbers: 4 5"]

        def complete(prompt: str) -> str:
            r = client.completions.create(
                model="gemma3.gguf", prompt=prompt, max_tokens=8, temperature=0
            )
            return r.choices[0].text

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            got = list(pool.map(complete, prompts))
        assert got == [_generate(path, p, 8, 4) for p in prompts]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert any(PLAN.match(line) for line in log + err.splitlines()), log


def test_prompt_cache_with_device_layers(vulkan, fixture_models, tmp_path):
    """--prompt-cache saves the device layers' rows and restores them: the second run
    evaluates only the prompt's last token and prints the same text, and a CPU-only run reads
    the same file."""
    cache = tmp_path / "prompt.state"
    args = ("run", fixture_models["gemma3"], "-p", "Once upon a time there was a small model",
            "-n", "6", "--temp", "0", "-t", "2", "--prompt-cache", cache)  # fmt: skip
    first, second, cpu = cli(*args, "-ngl", "all"), cli(*args, "-ngl", "all"), cli(*args)
    for proc in (first, second, cpu):
        assert proc.returncode == 0, proc.stderr
    n_prompt = int(first.stderr.split("prompt ")[1].split(" tok")[0])
    assert "cached" not in first.stderr
    for proc in (second, cpu):
        assert f"prompt {n_prompt} tok ({n_prompt - 1} cached)" in proc.stderr
    want = _generate(fixture_models["gemma3"], "Once upon a time there was a small model", 6, 0)
    assert first.stdout == second.stdout == cpu.stdout == want
