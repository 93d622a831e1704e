"""`edgeinfer convert`: a Hugging Face folder to a GGUF file, optionally fitted to a device,
or to an ONNX folder for onnxruntime(-genai).

    edgeinfer convert SRC_DIR -o OUT.gguf [--type q4_k_m] [--target rpi5]
                      [--max-memory 4GiB --ctx 4096] [-ctk q8_0] [-ctv q8_0]
                      [--calib FILE] [--dry-run]
    edgeinfer convert SRC_DIR -o OUT_DIR --format onnx [--type f32|int4|int8]
                      [--block-size 32|64|128] [--zero-points]
                      [--kv-type f32|f16|int8|int4] [--ctx N]

The KV cache types (``-ctk`` / ``-ctv``, ``--kv-type`` for both) are each format's own: a
GGUF file's cache is counted in the memory fit and recorded as the file's recommendation,
which ``load()`` uses unless told otherwise.

``--dry-run`` prints the plan (tensor, type, bytes, error) on stdout and writes nothing.
Progress bars go to stderr when it is a terminal (or with ``--progress``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import ClassVar, TextIO

from edgeinfer import errors
from edgeinfer.apps import exit_status

TYPES_HELP = (
    "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q4_k, q5_k, q6_k, q4_k_m, q4_k_s, q5_k_m, q5_k_s"
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "convert", help="convert a Hugging Face model folder to GGUF",
        description="Convert a Hugging Face checkpoint (Llama, Mistral, Qwen 2/3, Gemma 3) "
                    "to GGUF.",
    )  # fmt: skip
    p.add_argument(
        "source", metavar="SRC_DIR", help="folder with config.json, *.safetensors, tokenizer files"
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="output .gguf file, or a new folder for ONNX (required unless --dry-run)",
    )
    p.add_argument("--format", choices=["gguf", "onnx"], default=None, help="default: from OUT")
    p.add_argument(
        "--type",
        default=None,
        help=f"weight type or llama.cpp mix: {TYPES_HELP} (default f16); ONNX: f32, int4 "
        "(default), int8",
    )
    p.add_argument("--pure", action="store_true", help="every matrix in --type, no mix")
    p.add_argument(
        "--target",
        metavar="PROFILE",
        default=None,
        help="device profile (avx2-laptop, avx512-desktop, arm64-phone, rpi5, or a .toml file)",
    )
    p.add_argument(
        "--max-memory",
        metavar="SIZE",
        default=None,
        help="budget for weights + KV cache, e.g. 4GiB; types are chosen to fit",
    )
    p.add_argument(
        "--ctx", type=int, default=None, help="context the KV cache must hold (with --max-memory)"
    )
    p.add_argument(
        "--calib",
        metavar="FILE",
        default=None,
        help="calibration text (or saved .npz statistics) to weight the errors",
    )
    p.add_argument(
        "--calib-tokens", type=int, default=4096, help="tokens of the calibration text to run"
    )
    p.add_argument("--block-size", type=int, default=32, choices=[32, 64, 128],
                   help="ONNX: MatMulNBits block size (default 32)")  # fmt: skip
    p.add_argument("--zero-points", action="store_true",
                   help="ONNX: asymmetric blocks with zero points (default symmetric)")  # fmt: skip
    for short, flag, what in (
        ("-ctk", "--cache-type-k", "keys"),
        ("-ctv", "--cache-type-v", "values"),
    ):
        p.add_argument(short, flag, metavar="TYPE", default=None,
                       help=f"KV cache type of the {what}: GGUF f16 (default, or the profile's), "
                            "f32, q8_0, q4_0, counted in --max-memory and recommended by the "
                            "file; ONNX f32 (default), f16, int8, int4")  # fmt: skip
    p.add_argument("--kv-type", metavar="TYPE", default=None,
                   help="sets both cache types; ONNX int8/int4 scales are calibrated on --calib "
                        "or a built-in text (needs onnxruntime)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on stderr (default: when it is a terminal)")  # fmt: skip
    return p


class ProgressBar:
    """A one-line bar per stage on ``stream``, redrawn at most ten times a second."""

    LABELS: ClassVar[dict[str, str]] = {
        "measure": "measuring",
        "write": "writing",
        "calibrate": "calibrating",
    }

    def __init__(self, stream: TextIO, width: int = 30) -> None:
        self.stream, self.width = stream, width
        self._last = 0.0
        self._stage: str | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        finished = done >= total
        if stage == self._stage and not finished and now - self._last < 0.1:
            return
        self._stage, self._last = stage, now
        filled = self.width * done // max(total, 1)
        label = self.LABELS.get(stage, stage)
        self.stream.write(
            f"\r{label:<12}[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total}"
        )
        if finished:
            self.stream.write("\n")
            self._stage = None
        self.stream.flush()


def main(args: argparse.Namespace) -> int:
    from edgeinfer.converters.convert import Conversion, ConvertOptions, load_stats, output_format

    if args.output is None and not args.dry_run:
        raise errors.InvalidOptionError("convert needs -o OUT (or --dry-run)")
    options = ConvertOptions(
        type=args.type, pure=args.pure, target=args.target, max_memory=args.max_memory,
        n_ctx=args.ctx, calib=args.calib, calib_tokens=args.calib_tokens, format=args.format,
        measure=args.dry_run, block_size=args.block_size, zero_points=args.zero_points,
        kv_type=args.kv_type, cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v,
    )  # fmt: skip
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    progress = ProgressBar(sys.stderr) if show else _quiet
    fmt = output_format(args.output, args.format) if args.output else (args.format or "gguf")
    if fmt == "onnx":
        return _main_onnx(args, options, progress)
    t0 = time.perf_counter()
    conversion = Conversion(args.source)
    workdir = None if args.output is None else _parent(args.output)
    stats = load_stats(conversion, options, progress, workdir)
    plan = conversion.plan(options, stats, progress)
    if args.dry_run:
        print_plan(plan, sys.stdout)
        return 0
    for note in plan.notes:
        print(f"edgeinfer: note: {note}", file=sys.stderr)
    conversion.write_gguf(plan, args.output, stats, progress)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(plan.type_counts().items()))
    print(
        f"wrote {args.output}: {_size(plan.file_size)}, {len(plan.tensors)} tensors ({counts}) "
        f"in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


def _main_onnx(args: argparse.Namespace, options, progress) -> int:
    from edgeinfer.converters.convert import Conversion
    from edgeinfer.converters.onnx.export import export_onnx, kv_type, onnx_plan

    t0 = time.perf_counter()
    conversion = Conversion(args.source)
    tensors = onnx_plan(conversion, options)
    if args.dry_run:
        print(f"{conversion.ckpt.architecture} -> ONNX, {options.type or 'int4'} weights, "
              f"{kv_type(options)} KV cache", file=sys.stdout)  # fmt: skip
        print(f"{'tensor':<36} {'shape':>16} {'stored as':>38} {'bytes':>12}", file=sys.stdout)
        for t in tensors:
            shape = "x".join(map(str, t.shape))
            print(f"{t.name:<36} {shape:>16} {t.kind:>38} {t.nbytes:>12}", file=sys.stdout)
        total = sum(t.nbytes for t in tensors)
        print(f"weights {_size(total)} ({total} bytes)", file=sys.stdout)
        for note in conversion.notes:
            print(f"note: {note}", file=sys.stdout)
        return 0
    result = export_onnx(conversion, args.output, options, progress)
    for note in result.notes:
        print(f"edgeinfer: note: {note}", file=sys.stderr)
    print(
        f"wrote {args.output}/: {_size(result.file_size)}, {len(tensors)} tensors "
        f"({result.weight_type} weights, {result.kv_type} KV cache, context "
        f"{result.context_length}) in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


def _quiet(stage: str, done: int, total: int) -> None:
    pass


def _parent(path: str):
    from pathlib import Path

    return Path(path).resolve().parent


def _size(n: int) -> str:
    from edgeinfer.converters.fitting import format_bytes

    return format_bytes(n)


def print_plan(plan, out: TextIO) -> None:
    """The plan as a table, then the totals against the budget."""
    head = f"{plan.source_arch} -> GGUF {plan.arch}, {plan.recipe}"
    if plan.profile is not None:
        head += f", target {plan.profile.name} ({plan.profile.description}; isa {plan.profile.isa})"
    print(head, file=out)
    print(f"{'tensor':<36} {'shape':>16} {'type':>6} {'bytes':>12} {'error':>10}", file=out)
    for c in plan.tensors:
        shape = "x".join(map(str, c.source.shape))
        err = "" if c.error is None else f"{c.error:.3e}"
        print(f"{c.name:<36} {shape:>16} {c.ggml_type.name:>6} {c.nbytes:>12} {err:>10}", file=out)
    errs = [c.error for c in plan.tensors if c.error is not None]
    total_err = f", total error {sum(errs):.4e}" if errs else ""
    print(f"file {_size(plan.file_size)} ({plan.file_size} bytes){total_err}", file=out)
    if plan.n_ctx:
        print(
            f"KV cache ({plan.cache.label()}, {plan.n_ctx} tokens) {_size(plan.kv_bytes)} "
            f"({plan.kv_bytes} bytes, {plan.kv_bytes_per_token} bytes per token); "
            f"file + KV {_size(plan.total_bytes)}",
            file=out,
        )
        if plan.kv_rings:
            print(f"KV cache: {plan.kv_rings}", file=out)
    else:
        print(f"KV cache ({plan.cache.label()}) {plan.kv_bytes_per_token} bytes per token "
              "(--ctx N for the total)", file=out)  # fmt: skip
    if plan.budget is not None:
        left = plan.budget - plan.total_bytes
        print(f"budget {_size(plan.budget)}: fits, {_size(left)} left", file=out)
    for note in plan.notes:
        print(f"note: {note}", file=out)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run(argv: list[str] | None = None) -> int:
    """``python -m edgeinfer.apps.convert ...``: the subcommand on its own."""
    parser = argparse.ArgumentParser(prog="edgeinfer")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["convert", *(sys.argv[1:] if argv is None else argv)])
    signal.signal(signal.SIGTERM, _terminate)  # unwind (removing the temporary file) as Ctrl-C does
    try:
        return main(args)
    except errors.EdgeInferError as e:
        return exit_status.report(e)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(run())
