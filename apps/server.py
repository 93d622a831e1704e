"""`edgeinfer serve`: an OpenAI-compatible HTTP server over the model's batcher.

    edgeinfer serve MODEL [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx N]
                          [--kv-budget SIZE] [--api-key KEY] [--max-queue N]
                          [cache and sampling defaults]

Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (streamed as server-sent
events or not), ``GET /v1/models``, ``GET /health`` (503 while the model loads), ``GET /slots``
(the requests running and waiting) and ``GET /metrics`` (Prometheus text).

Requests run together in :class:`edgeinfer.batching.Batcher` steps; this module only speaks
HTTP and OpenAI's JSON. It runs on Starlette and uvicorn (the ``[server]`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import hmac
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeinfer import errors
from edgeinfer.apps import exit_status
from edgeinfer.metrics import MetricFamily, prometheus_text

if TYPE_CHECKING:  # the batcher pulls in numpy and the engines: loaded with the model
    from edgeinfer.batching import Piece, Request

DEFAULT_PORT = 8080
MAX_BODY_BYTES = 8 << 20  # a request's JSON: a context's worth of text and then some
MAX_STOPS = 16
MAX_STOP_CHARS = 256  # each stop string (a held-back tail is scanned against every length)
SHUTDOWN_GRACE_S = 10

# the fields each route takes; any other is refused by name (not ignored)
_COMMON = {
    "model", "max_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty",
    "frequency_penalty", "stream", "stream_options", "n", "user", "top_k", "min_p",
    "repeat_penalty", "repeat_last_n",
}  # fmt: skip
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs"}
# sampling fields passed to the batcher as they are, with their JSON types
_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p",
            "repeat_penalty")  # fmt: skip
_INTEGERS = ("seed", "top_k", "repeat_last_n")


class HTTPError(Exception):
    """A refusal in OpenAI's error shape: status, message, type, the parameter, a code."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error",
        param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}  # fmt: skip


@dataclass
class ServerOptions:
    path: str
    model_id: str
    load_options: dict[str, Any]
    defaults: dict[str, Any]  # sampling defaults of this server
    api_key: str | None = None
    max_queue: int = 64
    max_body: int = MAX_BODY_BYTES


@dataclass
class ServerState:
    """What the routes share: the model once loaded, and the server's own counters."""

    options: ServerOptions
    model: Any = None
    load_error: BaseException | None = None
    rejected: dict[str, int] = field(default_factory=dict)  # refusals by HTTP status
    started: float = field(default_factory=time.time)

    def load(self) -> None:
        import edgeinfer

        try:
            model = edgeinfer.load(self.options.path, **self.options.load_options)
            plan = model.gpu_plan
            if self.options.load_options.get("n_gpu_layers") is not None and plan is not None:
                print(plan.describe(), file=sys.stderr, flush=True)  # -ngl: what went where
            model.batcher(max_queue=self.options.max_queue)
            self.model = model
        except BaseException as e:
            self.load_error = e
            print(f"edgeinfer: error: {exit_status.one_line(e)}", file=sys.stderr, flush=True)


# --- requests to batcher options ------------------------------------------------------------


def _check_fields(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise HTTPError(400, f"unsupported field(s): {', '.join(unknown)}", param=unknown[0],
                        code="unsupported_parameter")  # fmt: skip
    return body


def _typed(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in _tuple(kind))
    if not ok:
        raise HTTPError(400, f"'{name}' must be {what}, got {json.dumps(value)[:80]}", param=name)
    return value


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _options(
    body: Mapping[str, Any], state: ServerState, max_tokens_names: tuple[str, ...]
) -> dict[str, Any]:
    """The batcher's options for a request: the server's defaults, overridden by its fields."""
    model = state.model
    out = dict(state.options.defaults)
    for name in _NUMBERS:
        v = _typed(body, name, (int, float), "a number")
        if v is not None:
            try:
                out[name] = float(v)
            except OverflowError:
                raise HTTPError(400, f"'{name}' is out of range", param=name) from None
    for name in _INTEGERS:
        v = _typed(body, name, int, "an integer")
        if v is not None:
            out[name] = v
    if out.get("seed") is not None and not 0 <= out["seed"] < 2**64:
        raise HTTPError(400, "'seed' must lie in [0, 2**64)", param="seed")
    for name in max_tokens_names:
        v = _typed(body, name, int, "an integer")
        if v is not None:
            if not 1 <= v <= model.max_request_tokens:
                raise HTTPError(400, f"'{name}' must lie in [1, {model.max_request_tokens}] "
                                     "(the context, or 64 contexts under a context policy), "
                                f"got {v}", param=name)  # fmt: skip
            out["max_tokens"] = v
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)):
            raise HTTPError(
                400, "'stop' must be a non-empty string or a list of them", param="stop"
            )
        if len(stops) > MAX_STOPS or max(map(len, stops)) > MAX_STOP_CHARS:
            raise HTTPError(400, f"'stop' takes at most {MAX_STOPS} strings of at most "
                            f"{MAX_STOP_CHARS} characters", param="stop")  # fmt: skip
        out["stop"] = stops
    n = _typed(body, "n", int, "an integer")
    if n not in (None, 1):
        raise HTTPError(400, "'n' other than 1 is not supported", param="n",
                        code="unsupported_parameter")  # fmt: skip
    return out


def _stream_options(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = _typed(body, "stream", bool, "a boolean") or False
    so = body.get("stream_options")
    if so is None:
        return stream, False
    if not isinstance(so, dict) or set(so) - {"include_usage"}:
        raise HTTPError(400, "'stream_options' takes only include_usage", param="stream_options")
    if not stream:
        raise HTTPError(400, "'stream_options' needs 'stream': true", param="stream_options")
    return stream, _typed(so, "include_usage", bool, "a boolean") or False


def _check_model(body: Mapping[str, Any], state: ServerState) -> None:
    name = body.get("model")
    if name is not None and name != state.options.model_id:
        raise HTTPError(404, f"the model '{name}' does not exist; this server has "
                        f"'{state.options.model_id}'", param="model",
                        code="model_not_found")  # fmt: skip


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HTTPError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise HTTPError(400, f"messages[{i}] must be an object with a 'role'", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):  # fmt: skip
                    raise HTTPError(400, f"messages[{i}]: only text content parts are supported",
                                    param="messages")  # fmt: skip
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise HTTPError(400, f"messages[{i}].content must be a string", param="messages")
        out.append({"role": m["role"], "content": content})
    return out


def _prompt(body: Mapping[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return prompt
    raise HTTPError(400, "'prompt' must be a string or a list of token ids (one prompt)",
                    param="prompt")  # fmt: skip


def _submit(state: ServerState, make: Callable[[], Request]) -> Request:
    try:
        return make()
    except errors.QueueFullError as e:
        raise HTTPError(429, str(e), "rate_limit_error", code="queue_full",
                        headers={"Retry-After": str(int(e.retry_after_s))}) from None  # fmt: skip
    except errors.ContextOverflowError as e:
        raise HTTPError(400, str(e), code="context_length_exceeded") from None
    except errors.ModelClosedError as e:
        raise HTTPError(503, str(e), "server_error", code="shutting_down") from None
    except (errors.InvalidOptionError, errors.TemplateError, errors.TokenizerError) as e:
        raise HTTPError(400, str(e)) from None


# --- responses ------------------------------------------------------------------------------


def _usage(r: Request) -> dict[str, Any]:
    u = r.usage
    return {
        "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }  # fmt: skip


def _finish(r: Request) -> str:
    return {"stop": "stop", "length": "length"}.get(r.finish_reason, r.finish_reason)


class _Logprobs:
    """Token log-probabilities in the shape of each route (chat's list of objects, the
    completions' parallel lists). A token's text is its own bytes (``bytes`` gives them
    exactly: a character that byte-fallback tokens spell in parts shows as U+FFFD in each
    part's text); the completions' ``text_offset`` counts the characters before it."""

    def __init__(self, model: Any, chat: bool) -> None:
        self.tokenizer, self.chat = model.tokenizer, chat
        self.content: list[dict[str, Any]] = []
        self.tokens: list[str] = []
        self.token_logprobs: list[float] = []
        self.top: list[dict[str, float]] = []
        self.offsets: list[int] = []
        self._offset = 0
        self._chars = codecs.getincrementaldecoder("utf-8")("replace")

    def _piece(self, token: int) -> tuple[str, list[int]]:
        raw = self.tokenizer.token_to_piece(token)
        return raw.decode("utf-8", "replace"), list(raw)

    def add(self, piece: Piece) -> None:
        for lp in piece.logprobs:
            text, raw = self._piece(lp.token)
            if self.chat:
                top = []
                for i, v in lp.top:
                    t, b = self._piece(i)
                    top.append({"token": t, "logprob": v, "bytes": b})
                self.content.append(
                    {"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top}
                )
            else:
                self.tokens.append(text)
                self.token_logprobs.append(lp.logprob)
                self.top.append({self._piece(i)[0]: v for i, v in lp.top})
                self.offsets.append(self._offset)
                self._offset += len(self._chars.decode(bytes(raw)))

    def take(self) -> dict[str, Any]:
        """What was added since the last take, in the route's shape."""
        if self.chat:
            out: dict[str, Any] = {"content": self.content}
            self.content = []
            return out
        out = {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
               "top_logprobs": self.top, "text_offset": self.offsets}  # fmt: skip
        self.tokens, self.token_logprobs, self.top, self.offsets = [], [], [], []
        return out


async def _collect(request: Any, r: Request, logprobs: _Logprobs | None) -> None:
    """Reads every piece of ``r``; cancels it if the client goes away meanwhile."""

    async def watch() -> None:
        while not r.done:
            if await request.is_disconnected():
                r.cancel()
                return
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch())
    try:
        async for piece in r:
            if logprobs is not None:
                logprobs.add(piece)
    finally:
        watcher.cancel()
        r.cancel()  # a no-op when it has finished


def _sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def _stream(
    r: Request, chunk: Callable[[Piece | None, str | None], dict[str, Any]],
    include_usage: bool, head: dict[str, Any] | None,
) -> AsyncIterator[bytes]:  # fmt: skip
    """The SSE events of a streamed request; the request is cancelled if the client leaves
    (Starlette stops this generator then, and ``finally`` runs)."""
    try:
        if head is not None:
            yield _sse(head)
        async for piece in r:
            yield _sse(chunk(piece, None))
        yield _sse(chunk(None, _finish(r)))
        if include_usage:
            last = chunk(None, None)
            last["choices"] = []
            last["usage"] = _usage(r)
            yield _sse(last)
        yield b"data: [DONE]\n\n"
    except errors.EdgeInferError as e:
        yield _sse({"error": {"message": str(e), "type": "server_error", "param": None,
                              "code": None}})  # fmt: skip
    finally:
        r.cancel()


# --- the application ------------------------------------------------------------------------


def create_app(state: ServerState) -> Any:
    """The Starlette application of a server (``state.model`` set once loaded)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route

    class _CancellingStream(StreamingResponse):
        """A streamed request, cancelled however the response ends: also when the client
        left before the body's generator ever ran (whose own ``finally`` then never runs)."""

        def __init__(self, r: Request, body: AsyncIterator[bytes], **kw: Any) -> None:
            super().__init__(body, **kw)
            self._request = r

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                self._request.cancel()

    opts = state.options

    def error(e: HTTPError) -> Response:
        key = str(e.status)
        state.rejected[key] = state.rejected.get(key, 0) + 1
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    def authorize(request: HTTPRequest) -> None:
        if opts.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), opts.api_key.encode()
        )
        if not ok:
            raise HTTPError(401, "a valid API key is needed (Authorization: Bearer KEY)",
                            code="invalid_api_key")  # fmt: skip

    def ready() -> Any:
        if state.model is None:
            raise HTTPError(503, "the model is loading" if state.load_error is None
                            else "the model failed to load", "server_error",
                            code="model_loading", headers={"Retry-After": "1"})  # fmt: skip
        return state.model

    async def body_of(request: HTTPRequest) -> Any:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > opts.max_body):
            raise HTTPError(413, f"the request body exceeds {opts.max_body} bytes")
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > opts.max_body:
                raise HTTPError(413, f"the request body exceeds {opts.max_body} bytes")
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise HTTPError(400, f"the request body is not valid JSON: {e}") from None

    def handler(fn: Callable[[HTTPRequest], Any], auth: bool = True) -> Callable[..., Any]:
        async def run(request: HTTPRequest) -> Response:
            try:
                if auth:
                    authorize(request)
                return await fn(request)
            except HTTPError as e:
                return error(e)
            except Exception:  # a bug: a 500 in OpenAI's shape, the traceback in the log
                traceback.print_exc(file=sys.stderr)
                return error(HTTPError(500, "internal error (see the server's log)",
                                       "server_error"))  # fmt: skip

        return run

    async def health(request: HTTPRequest) -> Response:
        if state.model is None:
            status = "loading" if state.load_error is None else "error"
            return JSONResponse({"status": status}, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"status": "ok"})

    async def models(request: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": opts.model_id, "object": "model", "created": int(state.started),
            "owned_by": "edgeinfer",
        }]})  # fmt: skip

    async def slots(request: HTTPRequest) -> Response:
        model = ready()
        return JSONResponse(model.batcher().slots())

    async def metrics(request: HTTPRequest) -> Response:
        text = prometheus_text(_families(state))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def completions(request: HTTPRequest, chat: bool) -> Response:
        model = ready()
        body = _check_fields(await body_of(request), CHAT_FIELDS if chat else COMPLETION_FIELDS)
        _check_model(body, state)
        stream, include_usage = _stream_options(body)
        # both given: max_completion_tokens, applied last, wins (as OpenAI's)
        names = ("max_tokens", "max_completion_tokens") if chat else ("max_tokens",)
        options = _options(body, state, names)
        top = _logprob_option(body, chat)
        if top is not None:
            options["logprobs"] = top
        batcher = model.batcher()
        # templates and tokenizing take a while on a long prompt: off the event loop, which
        # keeps every open stream going meanwhile
        if chat:
            messages = _messages(body)
            r = await run_in_threadpool(
                _submit, state, lambda: batcher.submit_chat(messages, **options)
            )
        else:
            prompt = _prompt(body)
            r = await run_in_threadpool(_submit, state, lambda: batcher.submit(prompt, **options))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        lp = _Logprobs(model, chat) if top is not None else None
        if stream:
            return _CancellingStream(
                r, _stream(r, _chunker(rid, created, opts.model_id, chat, lp), include_usage,
                        _chat_head(rid, created, opts.model_id) if chat else None),
                media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
            )  # fmt: skip
        try:
            await _collect(request, r, lp)
        except errors.OutOfMemoryError as e:  # the request cannot fit the KV pool
            raise HTTPError(503, str(e), "server_error", code="kv_cache_full") from None
        except errors.EdgeInferError as e:
            raise HTTPError(500, f"generation failed: {e}", "server_error") from None
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(r),
                                  "logprobs": lp.take() if lp is not None else None}  # fmt: skip
        if chat:
            choice["message"] = {"role": "assistant", "content": r.text}
        else:
            choice["text"] = r.text
        return JSONResponse({"id": rid, "object": kind, "created": created,
                             "model": opts.model_id, "choices": [choice],
                             "usage": _usage(r)})  # fmt: skip

    async def chat_route(request: HTTPRequest) -> Response:
        return await completions(request, True)

    async def completion_route(request: HTTPRequest) -> Response:
        return await completions(request, False)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", handler(models), methods=["GET"]),
        Route("/slots", handler(slots), methods=["GET"]),
        Route("/metrics", handler(metrics), methods=["GET"]),
        Route("/v1/chat/completions", handler(chat_route), methods=["POST"]),
        Route("/v1/completions", handler(completion_route), methods=["POST"]),
    ]
    return Starlette(routes=routes)


def _logprob_option(body: Mapping[str, Any], chat: bool) -> int | None:
    """How many top tokens to report with each token's logprob; None: no logprobs."""
    from edgeinfer.batching import MAX_TOP_LOGPROBS

    if chat:
        wanted = _typed(body, "logprobs", bool, "a boolean")
        top = _typed(body, "top_logprobs", int, "an integer")
        if top is not None and not wanted:
            raise HTTPError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        if not wanted:
            return None
        top = top or 0
        name = "top_logprobs"
    else:
        top = _typed(body, "logprobs", int, "an integer")
        if top is None:
            return None
        name = "logprobs"
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise HTTPError(400, f"'{name}' must lie in [0, {MAX_TOP_LOGPROBS}]", param=name)
    return int(top)


def _chat_head(rid: str, created: int, model_id: str) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_id,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "finish_reason": None, "logprobs": None}]}  # fmt: skip


def _chunker(
    rid: str, created: int, model_id: str, chat: bool, lp: _Logprobs | None
) -> Callable[[Piece | None, str | None], dict[str, Any]]:
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(piece: Piece | None, finish: str | None) -> dict[str, Any]:
        text = piece.text if piece is not None else ""
        logprobs = None
        if lp is not None and piece is not None:
            lp.add(piece)
            logprobs = lp.take()
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
        if chat:
            choice["delta"] = {"content": text} if piece is not None else {}
        else:
            choice["text"] = text
        return {"id": rid, "object": kind, "created": created, "model": model_id,
                "choices": [choice]}  # fmt: skip

    return chunk


def _families(state: ServerState) -> list[MetricFamily]:
    """The /metrics families: llama-server's names (under edgeinfer:) where it has them."""
    fams: list[MetricFamily] = []

    def add(name: str, help: str, kind: str, *samples: tuple[dict[str, str], float]) -> None:
        fams.append(MetricFamily(f"edgeinfer:{name}", help, kind, list(samples)))

    rejected = [({"outcome": f"rejected_{k}"}, float(v)) for k, v in sorted(state.rejected.items())]
    model = state.model
    if model is None:
        add("requests_total", "requests by outcome", "counter", *rejected)
        return fams
    b = model.batcher()
    m = b.metrics
    add("prompt_tokens_total", "prompt tokens evaluated", "counter", ({}, m.prompt_tokens))
    add("prompt_tokens_cached_total", "prompt tokens taken from cached blocks", "counter",
        ({}, m.cached_prompt_tokens))  # fmt: skip
    add("tokens_predicted_total", "tokens generated", "counter", ({}, m.generated_tokens))
    add("n_decode_total", "engine steps run", "counter", ({}, m.steps))
    add("preemptions_total", "requests preempted for want of cache blocks", "counter",
        ({}, m.preemptions))  # fmt: skip
    add("requests_total", "requests by outcome", "counter",
        *[({"outcome": k}, float(v)) for k, v in m.requests.items()], *rejected)  # fmt: skip
    add("requests_processing", "requests holding a sequence", "gauge", ({}, b.running))
    add("requests_deferred", "requests waiting for a sequence", "gauge", ({}, b.queued))
    pool = b.pool_stats()
    if pool is not None:
        total = pool["used"] + pool["cached"] + pool["free"]
        add("kv_cache_blocks", "KV cache pool blocks by state", "gauge",
            *[({"state": s}, float(pool[s])) for s in ("used", "cached", "free")])  # fmt: skip
        add("kv_cache_usage_ratio", "KV cache pool blocks in use", "gauge",
            ({}, pool["used"] / total if total else 0.0))  # fmt: skip
        add("prefix_cache_hit_ratio", "prefix blocks found in the cache, of those looked up",
            "gauge", ({}, pool["hit_rate"]))  # fmt: skip
    for name, help, h in (
        ("time_to_first_token_seconds", "from a request's arrival to its first token", m.ttft),
        ("inter_token_latency_seconds", "between a request's tokens", m.inter_token),
        ("queue_wait_seconds", "from a request's arrival to its admission", m.queue_wait),
        ("request_latency_seconds", "from a request's arrival to its end", m.e2e),
        ("tokens_per_step", "tokens one engine step evaluated", m.step_tokens),
    ):
        fams.append(MetricFamily(f"edgeinfer:{name}", help, "histogram", histogram=h))
    return fams


# --- the command ----------------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="an OpenAI-compatible HTTP server (continuous batching)",
        description="Serve a model over OpenAI's HTTP API; requests run together.",
    )  # fmt: skip
    p.add_argument("model", help="GGUF file")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0: a free one, printed)")  # fmt: skip
    p.add_argument("--parallel", type=int, default=8, help="requests run together (default 8)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait beyond those (then 429; default 64)")  # fmt: skip
    p.add_argument("--api-key", default=os.environ.get("EDGEINFER_API_KEY"),
                   help="require this bearer key (default: $EDGEINFER_API_KEY)")  # fmt: skip
    p.add_argument("--alias", default=None, help="the model's id in the API (default: file name)")
    return p


def _stopped(signum: int, frame: Any) -> None:
    """Outside uvicorn's own handling (before it starts, after it stops): nothing to do."""


def main(args: argparse.Namespace, load_options: dict[str, Any], defaults: dict[str, Any]) -> int:
    try:
        import uvicorn
    except ImportError:
        print("edgeinfer: error: the server needs the [server] extra: "
              "pip install 'edgeinfer[server]'", file=sys.stderr)  # fmt: skip
        return 1
    if not 1 <= args.parallel <= 63:
        raise errors.InvalidOptionError(f"--parallel must lie in [1, 63], got {args.parallel}")
    if not 0 <= args.port <= 65535:
        raise errors.InvalidOptionError(f"--port must lie in [0, 65535], got {args.port}")
    if args.max_queue < 0:
        raise errors.InvalidOptionError(f"--max-queue must be >= 0, got {args.max_queue}")
    model_id = args.alias or os.path.basename(args.model)
    options = ServerOptions(
        args.model, model_id, {**load_options, "n_parallel": args.parallel}, defaults,
        api_key=args.api_key or None, max_queue=args.max_queue,
    )  # fmt: skip
    state = ServerState(options)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        sock.close()
        print(f"edgeinfer: error: cannot listen on {args.host}:{args.port}: {e.strerror}",
              file=sys.stderr)  # fmt: skip
        return 1
    sock.listen(2048)  # connections wait in the backlog from now on, not refused
    host, port = sock.getsockname()[:2]
    loader = threading.Thread(target=state.load, name="edgeinfer-load", daemon=True)
    loader.start()
    config = uvicorn.Config(
        create_app(state), log_level="warning", timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        lifespan="off",
    )  # fmt: skip
    server = uvicorn.Server(config)
    # uvicorn stops gracefully on SIGINT and SIGTERM, then raises them again for the handlers
    # it found: a stop asked for is this command's normal end (status 0), not an interruption
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stopped)
    print(f"edgeinfer: serving {model_id} on http://{host}:{port}", file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        loader.join()
        if state.model is not None:
            state.model.close()
        sock.close()
    return 0
