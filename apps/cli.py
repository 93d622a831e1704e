"""The `edgeinfer` command: run, chat, info, bench, convert, perplexity, doctor."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections import Counter
from typing import Any, NoReturn

from edgeinfer import errors
from edgeinfer.apps import convert as convert_cmd
from edgeinfer.apps import exit_status
from edgeinfer.apps import server as server_cmd
from edgeinfer.engines import ENGINE_CHOICES
from edgeinfer.engines.base import MAX_N_THREADS


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line on stderr (exit status 2), like the others."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"edgeinfer: error: {message} (see: {self.prog} --help)\n")


def _count(lo: int, hi: int | None = None) -> Any:
    """An argparse type: an integer in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"lie in [{lo}, {hi}]" if hi is not None else f"be >= {lo}"
            raise argparse.ArgumentTypeError(f"must {bound}, got {value}")
        return value

    parse.__name__ = "integer"  # what argparse names in its messages
    return parse


_THREADS = _count(1, MAX_N_THREADS)
_CTX = _count(1)


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--ctx", type=_CTX, default=None, help="context size in tokens")
    p.add_argument(
        "-t", "--threads", type=_THREADS, default=None, help="threads (default: physical cores)"
    )
    p.add_argument("--engine", default="auto", choices=ENGINE_CHOICES,
                   help="compute engine (default: the native one where it runs)")  # fmt: skip
    _add_cache_options(p)
    _add_gpu_options(p)


def _gpu_layers(text: str) -> str:
    """-ngl's value: a count of layers, 'auto' or 'all' (load() checks the count's range)."""
    if text in ("auto", "all") or text.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"expected a number, 'auto' or 'all', got {text!r}")


_gpu_layers.__name__ = "n_gpu_layers"  # what argparse names in its messages


def _add_gpu_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("GPU offload (Vulkan)")
    g.add_argument(
        "-ngl", "--n-gpu-layers", type=_gpu_layers, default=None, metavar="N|auto|all",
        help="the output and the last N-1 layers on the GPU, as llama.cpp counts them; auto: "
        "as many as fit in its free memory (EDGEINFER_VULKAN_BUDGET forces a size); all: "
        "every layer (default: none)",
    )  # fmt: skip
    g.add_argument("--gpu-device", type=_count(0), default=None, metavar="I",
                   help="the Vulkan device's index (edgeinfer doctor lists them; default: "
                   "the first discrete GPU, else integrated, else the first)")  # fmt: skip


def _add_cache_options(p: argparse.ArgumentParser, policy: bool = True) -> None:
    """The KV cache's types (llama.cpp's -ctk / -ctv) and, with ``policy``, what happens at
    the end of the context."""
    from edgeinfer.context_policy import CONTEXT_POLICIES, DEFAULT_N_SINK
    from edgeinfer.kivi import GROUPS
    from edgeinfer.kv_cache import CACHE_TYPES, KIVI_GROUP, KIVI_RESIDUAL

    g = p.add_argument_group("KV cache")
    g.add_argument(
        "-ctk",
        "--cache-type-k",
        choices=list(CACHE_TYPES),
        default=None,
        help="type of the cached keys (default: the file's recommendation, else f16)",
    )
    g.add_argument(
        "-ctv",
        "--cache-type-v",
        choices=list(CACHE_TYPES),
        default=None,
        help="type of the cached values (default: as for the keys)",
    )
    g.add_argument("--swa-full", action="store_true",
                   help="sliding-window layers keep the whole context, not a ring of their "
                   "window + the batch")  # fmt: skip
    g.add_argument("--kivi-group", type=int, default=None, metavar="G",
                   help=f"kivi4/kivi2: positions per key group, {'/'.join(map(str, GROUPS))} "
                   f"(default {KIVI_GROUP})")  # fmt: skip
    g.add_argument("--kivi-residual", type=_count(0), default=None, metavar="R",
                   help=f"kivi4/kivi2: the newest positions kept in f16 (default "
                   f"{KIVI_RESIDUAL})")  # fmt: skip
    if not policy:
        return
    g.add_argument("--kv-budget", default=None, metavar="SIZE",
                   help="memory for the pool of cache blocks, e.g. 512MiB (default: what the "
                   "context needs)")  # fmt: skip
    g.add_argument("--context-policy", choices=CONTEXT_POLICIES, default="error",
                   help="past the context: error; shift (keep --n-keep tokens, drop half of "
                   "the rest, as llama.cpp); streaming (keep --n-sink attention sinks and the "
                   "most recent tokens, as StreamingLLM); h2o (keep the sinks, the recent "
                   "tokens and the most attended others, as H2O)")  # fmt: skip
    g.add_argument("--n-keep", type=_count(0), default=0, help="tokens shift never drops")
    g.add_argument("--n-sink", type=_count(0), default=DEFAULT_N_SINK,
                   help=f"attention sinks streaming and h2o keep "
                   f"(default {DEFAULT_N_SINK})")  # fmt: skip


def _cache_options(args: argparse.Namespace) -> dict[str, Any]:
    """load()'s cache options from the parsed arguments (only those given)."""
    out: dict[str, Any] = {"swa_full": args.swa_full}
    if args.cache_type_k is not None:
        out["cache_type_k"] = args.cache_type_k
    if args.cache_type_v is not None:
        out["cache_type_v"] = args.cache_type_v
    for name in ("kv_budget", "kivi_group", "kivi_residual", "n_gpu_layers", "gpu_device"):
        if getattr(args, name, None) is not None:
            out[name] = getattr(args, name)
    if getattr(args, "context_policy", "error") != "error":
        out.update(context_policy=args.context_policy, n_keep=args.n_keep, n_sink=args.n_sink)
    return out


def _load(args: argparse.Namespace, path: str) -> Any:
    import edgeinfer

    model = edgeinfer.load(
        path, n_threads=args.threads, n_ctx=args.ctx, engine=args.engine, **_cache_options(args)
    )
    _print_gpu_plan(args, model)
    return model


def _print_gpu_plan(args: argparse.Namespace, model: Any) -> None:
    """With -ngl, what went to the GPU and why, on stderr (stdout is the text)."""
    plan = model.gpu_plan
    if getattr(args, "n_gpu_layers", None) is not None and plan is not None:
        print(plan.describe(), file=sys.stderr)


def _add_sampling_options(p: argparse.ArgumentParser, n_default: int | None) -> None:
    p.add_argument(
        "-n",
        "--max-tokens",
        type=int,
        default=n_default,
        help="tokens to generate (-1: until the context is full)"
        + ("" if n_default is not None else "; default: what suits the model (/stats says)"),
    )
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--seed", type=int, default=None, help="same seed, same text")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _add_prompt_cache_option(p: argparse.ArgumentParser, when: str) -> None:
    p.add_argument(
        "--prompt-cache", metavar="FILE", default=None,
        help="saved session: its tokens and KV cache are loaded from FILE when it exists (and "
        f"the common prefix reused), and saved to it {when}; a FILE saved for another model "
        "or other cache settings is an error",
    )  # fmt: skip


def _restore_prompt_cache(model: Any, args: argparse.Namespace) -> None:
    """Loads --prompt-cache FILE when it exists; one for another model is a typed error (not
    recomputed: saving over it would destroy the other model's file)."""
    if args.prompt_cache and os.path.exists(args.prompt_cache):
        model.load_state(args.prompt_cache)


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    """Generation options from the command line; those left unset (chat's --max-tokens,
    --repetition-guard) are left to the defaults of the command (the chat's suit its model)."""
    options = dict(
        max_tokens=args.max_tokens, stop=args.stop, temperature=args.temp, top_k=args.top_k,
        top_p=args.top_p, min_p=args.min_p, repeat_penalty=args.repeat_penalty,
        repeat_last_n=args.repeat_last_n, seed=args.seed,
        repetition_guard=getattr(args, "repetition_guard", None),
    )  # fmt: skip
    return {k: v for k, v in options.items() if v is not None or k == "seed"}


def _add_repetition_guard_option(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument(
        "--repetition-guard", action=argparse.BooleanOptionalAction, default=None,
        help="end a reply once it loops (the same n-gram over and over), with finish reason "
        f"'repetition' (default: {default})",
    )  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="edgeinfer", description="Run language models on this device.")
    p.add_argument("--version", action="version", version=f"edgeinfer {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="continue a prompt; the continuation goes to stdout")
    run.add_argument("model", help="GGUF file")
    run.add_argument("-p", "--prompt", required=True, help="prompt text ('-' reads stdin)")
    _add_model_options(run)
    _add_sampling_options(run, 128)
    _add_repetition_guard_option(run, "off")
    run.add_argument(
        "--no-special", action="store_true", help="do not parse special tokens in the prompt"
    )
    _add_prompt_cache_option(run, "after the prompt")

    chat = sub.add_parser("chat", help="interactive chat (default model when none is given)")
    chat.add_argument("model", nargs="?", help="GGUF file (default: the embedded Gemma 3 270M)")
    chat.add_argument("-s", "--system", default=None, help="system prompt")
    _add_model_options(chat)
    _add_sampling_options(chat, None)
    _add_repetition_guard_option(chat, "on")
    _add_prompt_cache_option(chat, "at the end of the chat")

    info = sub.add_parser("info", help="describe a model file")
    info.add_argument("model")
    info.add_argument("--json", action="store_true")
    info.add_argument(
        "-c", "--ctx", type=_CTX, default=None, help="context size for the memory estimate"
    )
    info.add_argument("-b", "--batch", type=_count(1, 4096), default=512,
                      help="tokens per step, which sizes the sliding-window rings")  # fmt: skip
    _add_cache_options(info, policy=False)

    bench = sub.add_parser("bench", help="measure prompt and generation speed (like llama-bench)")
    bench.add_argument("model")
    bench.add_argument("-t", "--threads", type=_THREADS, default=None)
    bench.add_argument("-p", "--n-prompt", type=_count(1), default=512, help="prompt tokens (pp)")
    bench.add_argument("-n", "--n-gen", type=_count(1), default=128, help="generated tokens (tg)")
    bench.add_argument("-r", "--repetitions", type=_count(1), default=3)
    bench.add_argument("--engine", default="auto", choices=ENGINE_CHOICES)
    bench.add_argument("--isa", default=None, help="force an instruction-set variant")
    bench.add_argument("--fixed-threads", action="store_true",
                       help="decode on every thread even when fewer would be faster (by "
                       "default decoding moves to fewer while another program holds a "
                       "core)")  # fmt: skip
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--profile", action="store_true",
                       help="where the time goes, per op, for one prompt step and for decoding "
                       "(-r repeats the prompt step)")  # fmt: skip
    bench.add_argument("-c", "--ctx", type=_CTX, default=None,
                       help="context (default: prompt + generated tokens); smaller, the policy "
                       "makes room")  # fmt: skip
    _add_cache_options(bench)
    _add_gpu_options(bench)

    convert_cmd.add_parser(sub)

    serve = server_cmd.add_parser(sub)
    _add_model_options(serve)
    _add_sampling_options(serve, -1)

    ppl = sub.add_parser("perplexity", help="perplexity of a text file (as llama-perplexity)")
    ppl.add_argument("model")
    ppl.add_argument("-f", "--file", required=True, help="UTF-8 text file")
    ppl.add_argument("-c", "--ctx", type=_count(2), default=512, help="window size in tokens")
    ppl.add_argument(
        "--chunks", type=_count(1), default=None, help="score at most this many windows"
    )
    ppl.add_argument("-t", "--threads", type=_THREADS, default=None)
    ppl.add_argument("--engine", default="auto", choices=ENGINE_CHOICES)
    ppl.add_argument("--json", action="store_true")
    _add_cache_options(ppl)
    _add_gpu_options(ppl)
    baseline = ppl.add_mutually_exclusive_group()
    baseline.add_argument(
        "--save-logits", metavar="BASE", default=None,
        help="also save every scored token's distribution to BASE, for --kl-base "
        "(2 bytes per vocabulary entry and token: 0.5 MiB per token for Gemma 3)",
    )  # fmt: skip
    baseline.add_argument(
        "--kl-base", metavar="BASE", default=None,
        help="compare with the baseline BASE (same text and -c): KL divergence, top-1 "
        "agreement, RMS of the observed token's probability change",
    )  # fmt: skip

    desktop = sub.add_parser("desktop", help="the desktop chat app (a window)")
    desktop.add_argument("rest", nargs=argparse.REMAINDER, help="its options (--help)")
    doctor = sub.add_parser("doctor", help="describe this machine and the backends found")
    doctor.add_argument("--json", action="store_true")
    return p


def _version() -> str:
    import edgeinfer

    return edgeinfer.__version__


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    handler = {
        "run": cmd_run, "chat": cmd_chat, "info": cmd_info, "doctor": cmd_doctor,
        "bench": cmd_bench, "convert": convert_cmd.main, "perplexity": cmd_perplexity,
        "serve": cmd_serve, "desktop": cmd_desktop,
    }[args.command]  # fmt: skip
    signal.signal(signal.SIGTERM, _terminate)  # unwind (and clean up) as Ctrl-C does
    try:
        return handler(args)
    except errors.EdgeInferError as e:
        return exit_status.report(e)
    except OSError as e:
        if isinstance(e, BrokenPipeError):
            return _broken_pipe()
        print(
            f"edgeinfer: error: {e.strerror or e}{f': {e.filename}' if e.filename else ''}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _broken_pipe() -> int:
    # the reader went away (`edgeinfer run ... | head`): exit quietly, and keep Python's
    # final flush of stdout from failing again
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise errors.InputFileError(
            f"{what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None


# --- run -------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    prompt = (
        _utf8(sys.stdin.buffer.read(), "the prompt on stdin") if args.prompt == "-" else args.prompt
    )
    interrupted = False
    with _load(args, args.model) as model:
        _restore_prompt_cache(model, args)
        stream = model.stream(prompt, parse_special=not args.no_special, **_sampling(args))
        saved = not args.prompt_cache
        try:
            for piece in stream:
                if not saved:  # the prompt is evaluated (with the tokens of this first piece)
                    model.save_state(args.prompt_cache)
                    saved = True
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            stream.close()
            interrupted = True
        if not saved:  # no text came: what was evaluated is saved at the end
            model.save_state(args.prompt_cache)
        if sys.stdout.isatty():
            sys.stdout.write("\n")  # for the shell prompt; a pipe gets the continuation only
            sys.stdout.flush()
        _print_stats(stream.stats, model.load_s)
    return 130 if interrupted else 0


def _print_stats(stats: Any, load_s: float | None = None) -> None:
    cached = f" ({stats.cached_tokens} cached)" if stats.cached_tokens else ""
    parts = [
        f"prompt {stats.prompt_tokens} tok{cached}",
        f"{stats.prompt_tok_s:.1f} tok/s",
        f"generated {stats.generated_tokens} tok, {stats.gen_tok_s:.1f} tok/s",
        f"first token {stats.ttft_s * 1000:.0f} ms",
        f"stop: {stats.finish_reason}",
    ]
    if load_s is not None:
        parts.insert(0, f"load {load_s:.2f} s")
    print("[" + " | ".join(parts) + "]", file=sys.stderr, flush=True)


# --- chat ------------------------------------------------------------------------------------

CHAT_HELP = "commands: /reset (forget the conversation), /stats, /help, /exit (or Ctrl-D)"


def _default_model() -> str:
    from edgeinfer.default_model import default_model_path

    bar = _ProgressBar("assembling the default model")
    path = default_model_path(progress=bar)
    bar.done()
    return str(path)


class _ProgressBar:
    """A bar redrawn in place on a terminal; a line at the start and one at the end elsewhere."""

    def __init__(self, label: str) -> None:
        self.label, self.shown = label, False
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if self.tty:
            width = 30
            filled = width * done // max(total, 1)
            sys.stderr.write(
                f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                f"{done / 1e6:.0f}/{total / 1e6:.0f} MB"
            )
        elif not self.shown:
            sys.stderr.write(f"{self.label} ({total / 1e6:.0f} MB) ...")
        sys.stderr.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\n" if self.tty else " done\n")
            sys.stderr.flush()


def cmd_chat(args: argparse.Namespace) -> int:
    from edgeinfer.conversation import Conversation

    path = args.model or _default_model()
    with _load(args, path) as model:
        _restore_prompt_cache(model, args)
        conversation = Conversation(model, system=args.system, **_sampling(args))
        name = model.metadata.get("general.name", model.config.arch)
        print(
            f"{name} ready ({model.engine} engine, {model.n_threads} threads, context "
            f"{model.n_ctx}, template {conversation.defaults.template}); {CHAT_HELP}",
            file=sys.stderr, flush=True,
        )  # fmt: skip
        notice = conversation.defaults.notice(name)
        if notice:
            print(f"note: {notice}", file=sys.stderr, flush=True)
        status = _chat_loop(_ChatSession(conversation))
        if args.prompt_cache:
            model.save_state(args.prompt_cache)
        return status


def _read_line() -> str | None:
    try:
        # no prompt when the input is a file or a pipe: stdout then holds the replies only
        return input("> " if sys.stdin.isatty() else "")
    except EOFError:
        return None


def _chat_loop(session: _ChatSession) -> int:
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401 (imported for its effect: line editing and history for input())
    while True:
        try:
            line = _read_line()
        except KeyboardInterrupt:  # Ctrl-C at the prompt ends the chat, as Ctrl-D does
            line = None
        if line is None:
            print(file=sys.stderr)
            return 0
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            if not session.command(text):
                return 0
            continue
        session.reply(text)


class _ChatSession:
    """The terminal's side of a conversation: /commands, the streamed replies, Ctrl-C."""

    def __init__(self, conversation: Any) -> None:
        self.conversation = conversation
        self.last: Any = None

    def command(self, text: str) -> bool:
        """Runs a /command; False when it ends the chat."""
        cmd = text.split()[0].lower()
        if cmd in ("/exit", "/quit", "/bye"):
            return False
        if cmd == "/reset":
            self.conversation.reset()
            print("(conversation cleared)", file=sys.stderr, flush=True)
        elif cmd == "/stats":
            print(f"chat: {self.conversation.defaults.describe()}", file=sys.stderr, flush=True)
            if self.last is None:
                print("(no reply yet)", file=sys.stderr, flush=True)
            else:
                _print_stats(self.last)
        else:
            print(CHAT_HELP, file=sys.stderr, flush=True)
        return True

    def reply(self, text: str) -> None:
        """Streams the model's reply to ``text``; Ctrl-C cuts it short and keeps what came."""
        with _ctrl_c_cancels() as interrupt:
            try:
                stream = self.conversation.send(text)
            except errors.ContextOverflowError:
                print(
                    "(the conversation no longer fits the context: /reset to start over)",
                    file=sys.stderr,
                )
                return
            except (errors.TokenizerError, errors.TemplateError) as e:  # this line only: not sent
                print(f"(not sent: {exit_status.one_line(e)})", file=sys.stderr, flush=True)
                return
            interrupt.stream = stream
            if interrupt.pressed:  # before the reply began: as if the line was never sent
                stream.close()
                self.conversation.retract()
                print(file=sys.stderr)
                return
            for piece in stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
        if interrupt.pressed:
            sys.stdout.write(" [interrupted]")
        sys.stdout.write("\n")
        sys.stdout.flush()
        self.conversation.finish(stream)
        self.last = stream.stats
        _print_stats(self.last)


class _Interrupt:
    """Ctrl-C while a reply streams: whether it was pressed, and the stream it cancels."""

    def __init__(self) -> None:
        self.pressed = False
        self.stream: Any = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.pressed = True
        if self.stream is not None:
            self.stream.cancel()  # sets flags and wakes waiters; never blocks or raises


@contextlib.contextmanager
def _ctrl_c_cancels() -> Any:
    """Ctrl-C cancels the reply (it ends after its current step) instead of raising
    KeyboardInterrupt inside the library, which could land while the model's turn is half
    taken or half given back and leave the next call waiting for ever."""
    interrupt = _Interrupt()
    try:
        previous = signal.signal(signal.SIGINT, interrupt)
    except ValueError:  # not the main thread: Ctrl-C stays KeyboardInterrupt
        yield interrupt
        return
    try:
        yield interrupt
    finally:
        signal.signal(signal.SIGINT, previous)


# --- info ------------------------------------------------------------------------------------


def model_info(
    path: str,
    n_ctx: int | None,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    n_batch: int = 512,
    ring: bool = True,
    kivi_group: int | None = None,
    kivi_residual: int | None = None,
) -> dict[str, Any]:
    from edgeinfer.api import DEFAULT_N_CTX
    from edgeinfer.gguf import GGUFFile
    from edgeinfer.kv_cache import (
        DEFAULT_CACHE_TYPE,
        KIVI_GROUP,
        KIVI_RESIDUAL,
        cache_summary,
        check_kivi_options,
    )
    from edgeinfer.models import config_from_gguf

    group = KIVI_GROUP if kivi_group is None else kivi_group
    residual = KIVI_RESIDUAL if kivi_residual is None else kivi_residual
    with GGUFFile(path) as f:
        cfg = config_from_gguf(f)
        ctx = n_ctx or min(cfg.n_ctx_train, DEFAULT_N_CTX)
        weights = sum(t.nbytes for t in f.tensors.values())
        k_type = cache_type_k or DEFAULT_CACHE_TYPE
        check_kivi_options(k_type, cache_type_v or k_type, group, residual)
        cache = cache_summary(
            cfg, ctx, k_type, cache_type_v or k_type, n_batch, ring, group, residual
        )
        kv = cache["total_bytes"]
        windows = sorted({cfg.layer_window(il) for il in range(cfg.n_layer)} - {0})
        types = Counter(t.ggml_type.name for t in f.tensors.values())
        return {
            "path": os.path.abspath(path),
            "name": f.metadata.get("general.name", ""),
            "architecture": cfg.arch,
            "gguf_version": f.version,
            "file_size": f.file_size,
            "parameters": cfg.n_params(f),
            "context_length": cfg.n_ctx_train,
            "embedding_length": cfg.n_embd,
            "layers": cfg.n_layer,
            "heads": cfg.n_head,
            "kv_heads": cfg.n_head_kv,
            "vocab_size": cfg.n_vocab,
            "tokenizer": f.metadata.get("tokenizer.ggml.model", ""),
            "chat_template": bool(f.metadata.get("tokenizer.chat_template")),
            "tensor_types": dict(sorted(types.items())),
            "tensors": len(f.tensors),
            "sliding_windows": windows,
            "kv_cache": cache,
            "memory_estimate": {
                "context": ctx,
                "kv_cache_type": cache["cache_type_k"],
                "weights_bytes": weights,
                "kv_cache_bytes": kv,
                "total_bytes": weights + kv,
            },
        }


def cmd_info(args: argparse.Namespace) -> int:
    info = model_info(
        args.model, args.ctx, args.cache_type_k, args.cache_type_v, args.batch, not args.swa_full,
        args.kivi_group, args.kivi_residual,
    )  # fmt: skip
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    mem = info["memory_estimate"]
    rows = [
        ("file", f"{info['path']} ({info['file_size'] / 1e6:.1f} MB, "
                 f"GGUF v{info['gguf_version']})"),
        ("name", info["name"]),
        ("architecture", info["architecture"]),
        ("parameters", f"{info['parameters'] / 1e6:.1f} M"),
        ("context length", str(info["context_length"])),
        ("layers / heads / kv heads", f"{info['layers']} / {info['heads']} / {info['kv_heads']}"),
        ("embedding", str(info["embedding_length"])),
        ("vocabulary", f"{info['vocab_size']} ({info['tokenizer']})"),
        ("chat template", "yes" if info["chat_template"] else "no (built-in)"),
        ("tensor types", ", ".join(f"{k} x{v}" for k, v in info["tensor_types"].items())),
        ("sliding window", ", ".join(map(str, info["sliding_windows"])) or "none"),
        ("KV cache", _cache_line(info["kv_cache"])),
        ("memory estimate", f"{mem['total_bytes'] / 1e6:.0f} MB at context {mem['context']} "
         f"(weights {mem['weights_bytes'] / 1e6:.0f} MB, "
         f"KV cache {mem['kv_cache_bytes'] / 1e6:.0f} MB)"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def _cache_line(c: dict[str, Any]) -> str:
    """K/V types, bits per value, bytes per token of context and the total."""
    rings = ", sliding-window layers in rings" if c["rings"] else ""
    kivi = (
        f" in groups of {c['kivi_group']}, the newest {c['kivi_residual']} in f16"
        if "kivi_group" in c else ""
    )  # fmt: skip
    return (
        f"K {c['cache_type_k']} ({c['bits_per_value_k']:g} bits), V {c['cache_type_v']} "
        f"({c['bits_per_value_v']:g} bits){kivi}; {c['bits_per_value']:g} bits a value at "
        f"context {c['context']}: {c['bytes_per_token'] / 1024:.2f} KiB per token{rings}, "
        f"{c['total_bytes'] / 1e6:.1f} MB in all"
    )


# --- bench -----------------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    from edgeinfer.bench import run

    if args.profile:
        return _bench_profile(args)
    r = run(
        args.model, n_prompt=args.n_prompt, n_gen=args.n_gen, n_threads=args.threads,
        repetitions=args.repetitions, engine=args.engine, isa=args.isa, n_ctx=args.ctx,
        fixed_threads=args.fixed_threads, **_cache_options(args),
    )  # fmt: skip
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"{os.path.basename(r['model'])}: {r['engine']} engine ({r['isa']}), {r['threads']} threads"
    )
    print(f"pp{r['n_prompt']:<5} {r['pp_tok_s']:9.1f} ± {r['pp_tok_s_sd']:.1f} tok/s")
    print(f"tg{r['n_gen']:<5} {r['tg_tok_s']:9.1f} ± {r['tg_tok_s_sd']:.1f} tok/s")
    if r["decode_threads"] is not None and r["decode_threads"] != r["threads"]:
        print(
            f"         decoding ended on {r['decode_threads']} of the {r['threads']} threads "
            "(it ran faster so: another program holds a core)"
        )
    print(
        f"ttft     {r['ttft_s'] * 1000:9.1f} ms ({r['n_prompt']}-token prompt; "
        f"{r['ttft_cold_s'] * 1000:.1f} ms the first after loading)"
    )
    if r["gpu"] is not None and r["gpu"]["n_gpu_layers"]:
        g = r["gpu"]
        print(
            f"gpu      {g['n_gpu_layers']} of {g['n_layer'] + 1} (layers and the output) on "
            f"{g['device_name']}, {g['total_bytes'] / (1 << 20):.1f} MiB"
        )
    print(f"load     {r['load_s']:9.2f} s")
    print(f"peak RSS {r['peak_rss_mb']:9.1f} MB")
    if r.get("weight_copies_mb"):
        print(
            f"         of which {r['weight_copies_mb']:.1f} MB of weights copied into "
            "interleaved rows"
        )
    if r["kv_cache"]:
        print(f"KV cache {_cache_line(r['kv_cache'])}")
    if r["dropped_tokens"]:
        print(f"         {r['dropped_tokens']} tokens dropped past the context ({r['policy']})")
    return 0


def _bench_profile(args: argparse.Namespace) -> int:
    from edgeinfer.bench import profile

    options = _cache_options(args)
    for name in ("context_policy", "n_keep", "n_sink"):  # the profile's context always fits
        options.pop(name, None)
    r = profile(
        args.model, n_prompt=args.n_prompt, n_gen=args.n_gen, n_threads=args.threads,
        repetitions=args.repetitions, engine=args.engine, isa=args.isa, **options,
    )  # fmt: skip
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"{os.path.basename(r['model'])}: {r['engine']} engine ({r['isa']}), {r['threads']} "
        "threads, per-op profile"
    )
    for title, phase in (
        (f"prompt step of {r['n_prompt']} tokens", r["prompt"]),
        (f"decoding, {r['n_gen']} steps of one token", r["decode"]),
    ):
        print()
        print("\n".join(_profile_table(title, phase)))
    return 0


def _profile_table(title: str, phase: dict[str, Any]) -> list[str]:
    """A phase of a profile: its times per step, then a row per op, largest first."""

    def rate(v: float | None) -> str:
        return f"{v:9.1f}" if v is not None else " " * 9

    lines = [
        f"{title}: {phase['step_ms']:.3f} ms a step, {phase['engine_ms']:.3f} in the engine; "
        f"the parts add up to {phase['parts_ms']:.3f}",
        f"  {'op':<36} {'calls':>7} {'ms':>9} {'share':>6} {'GFLOP/s':>9} {'GB/s':>9}",
    ]
    for row in phase["ops"]:
        lines.append(
            f"  {row['op']:<36} {row['calls']:7.4g} {row['ms']:9.3f} {row['share']:6.1%} "
            f"{rate(row['gflops'])} {rate(row['gbps'])}".rstrip()
        )
    return lines


# --- perplexity ------------------------------------------------------------------------------


def cmd_perplexity(args: argparse.Namespace) -> int:
    import edgeinfer
    from edgeinfer.perplexity import kl_divergence, perplexity

    with open(args.file, "rb") as f:
        text = _utf8(f.read(), args.file)
    options = _cache_options(args)
    if "context_policy" in options:
        return _policy_perplexity(args, text, options)
    with edgeinfer.load(
        args.model, n_threads=args.threads, n_ctx=args.ctx, engine=args.engine, **options
    ) as model:
        _print_gpu_plan(args, model)
        if args.kl_base is not None:
            kl = kl_divergence(model, text, args.kl_base, n_ctx=args.ctx, max_windows=args.chunks)
            print(json.dumps(kl.as_dict(), indent=2) if args.json else "\n".join(_kl_lines(kl)))
            return 0
        r = perplexity(
            model, text, n_ctx=args.ctx, max_windows=args.chunks, save_logits=args.save_logits
        )
    return _report(
        args, r, f"perplexity {r.perplexity:.4f} over {r.scored_tokens} tokens "
        f"({r.windows} windows of {args.ctx})",
    )  # fmt: skip


def _report(args: argparse.Namespace, result: Any, line: str) -> int:
    """A perplexity result: every figure as JSON with --json, else the one line."""
    print(json.dumps(result.as_dict(), indent=2) if args.json else line)
    return 0


def _policy_perplexity(args: argparse.Namespace, text: str, options: dict[str, Any]) -> int:
    """The text as one stream through a context of -c under the policy: every token scored
    (the comparison StreamingLLM makes), rather than in independent windows."""
    import edgeinfer
    from edgeinfer.perplexity import stream_perplexity

    if args.save_logits is not None or args.kl_base is not None:
        raise errors.InvalidOptionError("--context-policy scores a stream; baselines are windows")
    with edgeinfer.load(
        args.model, n_threads=args.threads, n_ctx=args.ctx, engine=args.engine, **options
    ) as model:
        _print_gpu_plan(args, model)
        r = stream_perplexity(model, text, max_tokens=args.chunks and args.chunks * args.ctx)
    return _report(
        args, r, f"perplexity {r.perplexity:.4f} over {r.scored_tokens} tokens streamed through "
        f"a context of {args.ctx} ({args.context_policy}, {r.tok_s:.1f} tok/s)",
    )  # fmt: skip


def _kl_lines(r: Any) -> list[str]:
    """A comparison with a baseline in llama.cpp's units: KL in nats, agreement and delta p in %."""
    return [
        f"perplexity {r.perplexity:.4f} (baseline {r.base_perplexity:.4f}) over "
        f"{r.scored_tokens} tokens ({r.windows} windows)",
        f"KL divergence mean {r.kl_mean:.6f} +/- {r.kl_stderr:.6f}, median {r.kl_median:.6f}, "
        f"p99 {r.kl_p99:.6f}, max {r.kl_max:.6f}",
        f"top-1 agreement {100 * r.top1_agreement:.2f} +/- {100 * r.top1_stderr:.2f} %",
        f"RMS delta p {100 * r.rms_delta_p:.3f} %",
    ]


# --- doctor ----------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    load_options = dict(
        n_threads=args.threads, n_ctx=args.ctx, engine=args.engine, **_cache_options(args)
    )
    return server_cmd.main(args, load_options, _sampling(args))


def cmd_desktop(args: argparse.Namespace) -> int:
    from edgeinfer.apps.desktop.app import main as desktop_main

    return desktop_main(args.rest)


def cmd_doctor(args: argparse.Namespace) -> int:
    from edgeinfer.system import doctor

    report = doctor()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    cpu, mem = report["cpu"], report["memory"]
    print(f"edgeinfer {report['edgeinfer']}  python {report['python']}  {report['os']}")
    print(
        f"cpu       {cpu['model']} ({cpu['arch']}), "
        f"{cpu['physical_cores']} cores / {cpu['logical_cores']} threads"
    )
    print(f"features  {' '.join(cpu['features']) or '(none detected)'}")
    if mem:
        print(
            f"memory    {mem.get('total_mb', 0)} MB total, "
            f"{mem.get('available_mb', 0)} MB available"
        )
    for b in report["backends"]:
        state = "yes" if b["available"] else "no"
        print(f"backend   {b['name']:<12} {state:<4} {b.get('detail', '')}")
        if b.get("library"):
            print(f"          {'':<12} {'':<4} library {b['library']}")
    _print_gpus(report["gpus"])
    if report["frozen"]:
        print(f"frozen    yes (bundle {report['frozen']})")
    return 0


def _print_gpus(gpus: dict[str, Any]) -> None:
    if not gpus["devices"]:
        print(f"gpu       none ({gpus['none']})")
    for i, d in enumerate(gpus["devices"]):
        budget = d["budget_bytes"]
        free = f", {budget / 2**20:.0f} MiB free (budget)" if budget is not None else ""
        print(f"gpu {i:<5} {d['name']} ({d['type']}), Vulkan {d['api_version']}")
        print(f"          driver {d['driver'] or '?'} {d['driver_version']} {d['driver_info']}")
        print(
            f"          memory {d['device_local_bytes'] / 2**20:.0f} MiB device-local{free}; "
            f"one buffer up to {d['max_storage_buffer_bytes'] / 2**20:.0f} MiB"
        )
        features = [n for n in ("fp16", "int8", "storage16", "integer_dot_product") if d[n]]
        print(
            f"          features {' '.join(features) or '(none)'}; subgroups of "
            f"{d['subgroup_size']} ({' '.join(d['subgroup_ops']) or 'no operations'})"
        )
        uses = d.get("uses", {})
        if "error" in uses:
            print(f"          offload  unavailable: {uses['error']}")
        elif uses:
            used = [
                "subgroup shuffles" if uses["subgroups"] else "shared-memory sums (no subgroups)",
                "integer dot product" if uses["integer_dot"] else "scalar int8 dots",
                f"free memory from the {uses['free_memory']}",
            ]
            print(f"          offload  uses {', '.join(used)}")


if __name__ == "__main__":
    sys.exit(main())
