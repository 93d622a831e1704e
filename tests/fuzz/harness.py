"""The one driver behind every fuzz target in this folder (atheris, i.e. libFuzzer for Python).

A target module defines ``one_input(data: bytes) -> None`` and ``seeds() -> Iterable[bytes]``
(inputs built from real files), imports what it fuzzes under ``atheris.instrument_imports()``,
and ends with ``harness.main(one_input, seeds)``. The contract it checks: every input either
passes or raises an :class:`edgeinfer.errors.EdgeInferError` subclass; anything else (another
exception, a crash, a hang past ``--timeout``, memory past ``--rss-mb``) is a finding, which
libFuzzer writes to ``crash-*`` / ``timeout-*`` / ``oom-*`` files in ``--artifacts``.

    python -m tests.fuzz.fuzz_gguf --runs 1000000        # a long run
    python -m tests.fuzz.fuzz_gguf --seconds 20          # the smoke run of the test suite
    python -m coverage run --include='edgeinfer/gguf/*' -m tests.fuzz.fuzz_gguf --replay DIR
    python -m coverage report                            # line coverage of a corpus

Findings that were fixed live on as files in ``tests/fuzz/regressions/<target>/``, which
``test_fuzz.py`` replays through ``one_input`` on every test run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

REGRESSIONS = Path(__file__).parent / "regressions"


def expected_errors() -> tuple[type[BaseException], ...]:
    """What a target may raise: the typed errors (imported late: the target instruments them)."""
    from edgeinfer.errors import EdgeInferError

    return (EdgeInferError,)


def guarded(fn: Callable[[bytes], None]) -> Callable[[bytes], None]:
    """``fn`` with its typed errors swallowed, so that only the contract's breaches escape."""
    allowed = expected_errors()

    def one_input(data: bytes) -> None:
        with contextlib.suppress(*allowed):
            fn(data)

    return one_input


def write_seeds(seeds: Iterable[bytes], folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    for i, seed in enumerate(seeds):
        (folder / f"seed-{i:04d}").write_bytes(seed)
        n += 1
    return n


def replay(one_input: Callable[[bytes], None], folders: Iterable[Path]) -> int:
    """Runs every file of ``folders`` through the target; returns how many ran."""
    n = 0
    for folder in folders:
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            one_input(path.read_bytes())
            n += 1
    return n


def main(
    fn: Callable[[bytes], None],
    seeds: Callable[[], Iterable[bytes]],
    argv: list[str] | None = None,
) -> None:
    parser = argparse.ArgumentParser(description="run one fuzz target (see tests/fuzz/harness.py)")
    parser.add_argument("--runs", type=int, default=-1, help="stop after this many inputs")
    parser.add_argument("--seconds", type=int, default=0, help="stop after this long (0: never)")
    parser.add_argument("--corpus", type=Path, help="corpus folder (default: a fresh temp dir)")
    parser.add_argument("--artifacts", type=Path, default=Path("."), help="where findings go")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    parser.add_argument("--rss-mb", type=int, default=2048, help="memory the process may use")
    parser.add_argument("--max-len", type=int, default=0, help="longest input (0: libFuzzer's)")
    parser.add_argument("--replay", type=Path, nargs="*", help="only run these folders' files")
    args = parser.parse_args(argv)
    one_input = guarded(fn)
    if args.replay is not None:
        folders = args.replay or [REGRESSIONS / Path(sys.argv[0]).stem]
        print(f"replayed {replay(one_input, folders)} inputs")
        return
    import atheris

    corpus = args.corpus or Path(tempfile.mkdtemp(prefix="edgeinfer-fuzz-"))
    n_seeds = write_seeds(seeds(), corpus) if not any(corpus.glob("*")) else 0
    print(f"corpus {corpus} ({n_seeds} seeds written)", flush=True)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    flags = [
        f"-runs={args.runs}",
        f"-max_total_time={args.seconds}",
        f"-timeout={args.timeout}",
        f"-rss_limit_mb={args.rss_mb}",
        f"-artifact_prefix={args.artifacts}{os.sep}",
        "-print_final_stats=1",
    ]
    if args.max_len:
        flags.append(f"-max_len={args.max_len}")
    atheris.Setup([sys.argv[0], *flags, str(corpus)], one_input)
    atheris.Fuzz()
