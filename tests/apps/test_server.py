"""`edgeinfer serve` on 127.0.0.1, driven by the real `openai` client (and httpx for what that
client will not send): both routes streamed and not, usage, stops, seeds, logprobs, 32
concurrent clients each getting what it gets alone, disconnects, a full queue, cached
prefixes, bad requests of every kind, /metrics against the traffic sent, and clean stops."""

from __future__ import annotations

import concurrent.futures
import json
import math
import re
import signal
import subprocess
import time

import httpx
import numpy as np
import openai
import pytest

from tests.apps.conftest import EDGEINFER

KEY = "test-key-0123456789"
MODEL = "gemma-3-270m-q4_k_m.gguf"


class Server:
    """``edgeinfer serve`` in a subprocess, on a free port (it prints the one it took)."""

    def __init__(self, path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [EDGEINFER, "serve", str(path), "--port", "0", "-t", "2", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stderr.readline()
        m = re.search(r"on (http://127\.0\.0\.1:\d+)$", line.strip())
        assert m, line + self.proc.stderr.read()
        self.url = m.group(1)
        deadline = time.monotonic() + 120
        while httpx.get(self.url + "/health").status_code != 200:
            assert time.monotonic() < deadline and self.proc.poll() is None
            time.sleep(0.1)

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0, **kw)

    def post(self, route: str, body, key: str | None = KEY, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        content = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return httpx.post(self.url + route, content=content, headers=headers, timeout=120, **kw)

    def get(self, route: str) -> httpx.Response:
        return httpx.get(self.url + route, headers={"Authorization": f"Bearer {KEY}"})

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, str]:
        self.proc.send_signal(signum)
        try:
            rc = self.proc.wait(timeout=60)
        finally:
            self.proc.kill()
        return rc, self.proc.stderr.read()


@pytest.fixture(scope="module")
def server(gemma_path):
    s = Server(gemma_path, "--parallel", "8", "-c", "1024", "--api-key", KEY)
    yield s
    rc, err = s.stop()
    assert rc == 0 and "Traceback" not in err, err


def _chat(client, content: str, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], **kw
    )


def test_completions_streamed_and_not_agree_with_usage(server, gemma_model):
    c = server.client()
    prompt = "The three primary colors are"
    r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    n_prompt = len(gemma_model.tokenize(prompt))
    assert r.usage.prompt_tokens == n_prompt and r.usage.completion_tokens == 12
    assert r.usage.total_tokens == n_prompt + 12 and r.choices[0].finish_reason == "length"
    ref = gemma_model.generate(prompt, max_tokens=12, temperature=0)
    assert r.choices[0].text == ref.text
    chunks = list(
        c.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == ref.text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"


def test_chat_streamed_and_not_agree(server, gemma_model):
    c = server.client()
    messages = [{"role": "user", "content": "Name a fruit."}]
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    ids = gemma_model.chat_tokens(messages)
    assert r.usage.prompt_tokens == len(ids)
    assert (
        r.choices[0].message.content == gemma_model.generate(ids, max_tokens=10, temperature=0).text
    )
    stream = c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_stop_strings_seeds_and_logprobs(server, gemma_model):
    c = server.client()
    r = c.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=30, temperature=0, stop=[" 8"]
    )
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == " 5, 6, 7,"
    seeded = [
        c.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=s
        )
        .choices[0]
        .text
        for s in (42, 42, 43)
    ]
    assert seeded[0] == seeded[1] != seeded[2]
    r = _chat(c, "Hello", max_tokens=3, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    ids = gemma_model.chat_tokens([{"role": "user", "content": "Hello"}])
    row = gemma_model.logits(ids)[-1].astype(np.float64)
    lse = row.max() + math.log(np.exp(row - row.max()).sum())
    best = int(np.argmax(row))
    assert content[0].logprob == pytest.approx(row[best] - lse, abs=1e-9)
    assert content[0].token == gemma_model.detokenize([best])
    assert [t.logprob for t in content[0].top_logprobs] == sorted(
        (t.logprob for t in content[0].top_logprobs), reverse=True
    )
    r = c.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0, logprobs=2)
    assert len(r.choices[0].logprobs.token_logprobs) == 2
    assert all(len(t) == 2 for t in r.choices[0].logprobs.top_logprobs)


def test_logprob_tokens_carry_their_own_bytes(gemma_model):
    """A character spelled by byte-fallback tokens: each token's ``bytes`` are its own, and
    they join to the text (the per-token text can only show U+FFFD for a part)."""
    from edgeinfer.apps.server import _Logprobs
    from edgeinfer.batching import Piece, TokenLogprob

    ids = [gemma_model.tokenizer.vocab.token_to_id[f"<0x{b:02X}>"] for b in "€".encode()]
    ids.append(gemma_model.tokenize(" ok", add_special=False)[0])
    pieces = [Piece("", (t,), (TokenLogprob(t, -1.0, ((t, -1.0),)),)) for t in ids]
    chat, legacy = _Logprobs(gemma_model, chat=True), _Logprobs(gemma_model, chat=False)
    for p in pieces:
        chat.add(p)
        legacy.add(p)
    content = chat.take()["content"]
    assert [c["bytes"] for c in content[:3]] == [[0xE2], [0x82], [0xAC]]
    assert bytes(b for c in content for b in c["bytes"]).decode() == "€ ok"
    assert content[0]["top_logprobs"][0]["bytes"] == [0xE2]
    assert legacy.take()["text_offset"] == [0, 0, 0, 1]


CONCURRENT = [
    (
        f"Item {i}: " + "a story about the sea and the wind " * (i % 5 * 4),
        dict(
            temperature=[0, 0.8, 1.1][i % 3],
            seed=i,
            max_tokens=8 + i % 9,
            **({"stop": ["."]} if i % 4 == 0 else {}),
        ),
    )
    for i in range(32)
]


def test_32_concurrent_clients_each_get_what_they_get_alone(server):
    """Every response equals the same request sent alone: none mixed, cut short or lost."""
    c = server.client(timeout=300)

    def one(i):
        prompt, options = CONCURRENT[i]
        if i % 2:
            chunks = list(_chat(c, prompt, stream=True, **options))
            return "".join(ch.choices[0].delta.content or "" for ch in chunks)
        r = c.completions.create(model=MODEL, prompt=prompt, **options)
        return r.choices[0].text, r.usage.completion_tokens, r.choices[0].finish_reason

    alone = [one(i) for i in range(len(CONCURRENT))]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(one, range(len(CONCURRENT))))
    assert together == alone


def _metric(server, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(server.get("/metrics").text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(name)


def test_a_client_that_disconnects_frees_its_sequence(server):
    cancelled = _metric(server, "edgeinfer:requests_total", outcome="cancelled")
    body = {
        "model": MODEL,
        "prompt": "Tell me everything about",
        "max_tokens": 900,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=headers) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
    deadline = time.monotonic() + 30
    while server.get("/slots").json() != [] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.get("/slots").json() == []
    assert _metric(server, "edgeinfer:requests_total", outcome="cancelled") == cancelled + 1


def test_max_completion_tokens_wins_over_max_tokens(server):
    r = server.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 9,
            "max_completion_tokens": 3,
            "temperature": 0,
        },
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3


def test_a_shared_system_prompt_shows_cached_tokens(server):
    c = server.client()
    system = "You are a terse assistant for a hardware shop. Answer in five words. " * 5

    def ask(q):
        return c.chat.completions.create(
            model=MODEL,
            max_tokens=4,
            temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": q}],
        )

    ask("Do you sell nails?")
    r = ask("Do you sell glue?")
    assert r.usage.prompt_tokens_details.cached_tokens >= 32


def test_bad_requests_get_the_right_errors_and_the_server_stays_up(server):
    cases = [
        (server.post("/v1/completions", b"{not json"), 400, None),
        (
            server.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "3"}),
            400,
            "max_tokens",
        ),
        (
            server.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 10**9}),
            400,
            "max_tokens",
        ),
        (
            server.post("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}),
            400,
            "temperature",
        ),
        (
            server.post("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {}}),
            400,
            "logit_bias",
        ),
        (server.post("/v1/completions", {"model": MODEL, "prompt": "hello " * 1100}), 400, None),
        (server.post("/v1/chat/completions", {"model": MODEL, "messages": []}), 400, "messages"),
        (server.post("/v1/completions", {"model": "other", "prompt": "x"}), 404, "model"),
        (server.post("/v1/completions", {"model": MODEL, "prompt": "x"}, key=None), 401, None),
        (server.post("/v1/completions", {"model": MODEL, "prompt": "x"}, key="wrong"), 401, None),
        (server.post("/v1/completions", b"x" * (9 << 20)), 413, None),
        (server.post("/v1/completions", b"[" * 100000 + b"]" * 100000), 400, None),
        (
            server.post("/v1/completions", b'{"prompt": "x", "temperature": 1' + b"0" * 400 + b"}"),
            400,
            "temperature",
        ),
        (server.post("/v1/completions", {"prompt": "x", "stop": ["y" * 257]}), 400, "stop"),
    ]
    for response, status, param in cases:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["message"] and error["type"]
        if param:
            assert error["param"] == param
    overflow = cases[5][0].json()["error"]
    assert overflow["code"] == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert server.client().models.list().data[0].id == MODEL


def test_metrics_count_the_traffic_sent(gemma_path, gemma_model):
    s = Server(gemma_path, "--parallel", "2", "-c", "512")
    try:
        c = s.client()
        prompts = ["The sky is", "Rivers flow to", "The sky is blue and"]
        usage = [
            c.completions.create(model=MODEL, prompt=p, max_tokens=5, temperature=0).usage
            for p in prompts
        ]
        s.post("/v1/completions", {"model": "nope", "prompt": "x"})
        s.post("/v1/completions", b"[")
        assert _metric(s, "edgeinfer:requests_total", outcome="length") == 3
        assert _metric(s, "edgeinfer:requests_total", outcome="rejected_404") == 1
        assert _metric(s, "edgeinfer:requests_total", outcome="rejected_400") == 1
        assert _metric(s, "edgeinfer:tokens_predicted_total") == 15
        evaluated = _metric(s, "edgeinfer:prompt_tokens_total")
        cached = _metric(s, "edgeinfer:prompt_tokens_cached_total")
        assert evaluated + cached == sum(u.prompt_tokens for u in usage)
        assert _metric(s, "edgeinfer:time_to_first_token_seconds_count") == 3
        assert _metric(s, "edgeinfer:inter_token_latency_seconds_count") == 3 * 4
        assert _metric(s, "edgeinfer:requests_processing") == 0
        assert _metric(s, "edgeinfer:kv_cache_blocks", state="used") == 0
    finally:
        rc, err = s.stop(signal.SIGINT)
    assert rc == 0 and "Traceback" not in err, err


def test_an_overflowing_queue_gets_429_while_others_are_served(gemma_path):
    s = Server(gemma_path, "--parallel", "1", "--max-queue", "1", "-c", "512")
    try:
        body = {"model": MODEL, "prompt": "Count:", "max_tokens": 200, "temperature": 0}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            running = pool.submit(s.post, "/v1/completions", {**body, "stream": False})
            while s.get("/slots").json() == []:
                time.sleep(0.02)
            queued = pool.submit(s.post, "/v1/completions", {**body, "max_tokens": 2})
            while len(s.get("/slots").json()) < 2:
                time.sleep(0.02)
            refused = s.post("/v1/completions", body)
            assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["code"] == "queue_full"
            assert running.result().json()["usage"]["completion_tokens"] == 200
            assert queued.result().status_code == 200
    finally:
        rc, err = s.stop()
    assert rc == 0, err


def test_health_is_503_while_loading_and_a_bad_file_is_reported(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    proc = subprocess.Popen(
        [EDGEINFER, "serve", str(bad), "--port", "0"], stderr=subprocess.PIPE, text=True
    )
    try:
        url = re.search(r"(http://\S+)", proc.stderr.readline()).group(1)
        assert "edgeinfer: error:" in proc.stderr.readline()
        r = httpx.get(url + "/health")
        assert r.status_code == 503 and r.json() == {"status": "error"}
        assert httpx.post(url + "/v1/completions", json={"prompt": "x"}).status_code == 503
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_a_context_policy_serves_prompts_over_the_context(gemma_path):
    """With --context-policy a prompt over the context is served (not a 400) and generation
    goes on past the context's end: the same tokens as the model's own stream."""
    import edgeinfer

    prompt = "The history of the printing press begins in the fifteenth century. " * 20
    with edgeinfer.load(gemma_path, n_threads=2, n_ctx=128, context_policy="streaming") as m:
        assert len(m.tokenize(prompt)) > 128
        want = m.generate(prompt, max_tokens=150, temperature=0).text
    s = Server(gemma_path, "--parallel", "2", "-c", "128", "--context-policy", "streaming",
               "--api-key", KEY)  # fmt: skip
    try:
        r = s.client().completions.create(model=MODEL, prompt=prompt, max_tokens=150, temperature=0)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 150
        assert r.choices[0].text == want
    finally:
        rc, err = s.stop()
    assert rc == 0, err
