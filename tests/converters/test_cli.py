"""The convert subcommand: its parser plugs into the CLI's subparsers; the dry run prints
the plan and writes nothing; errors are one line on stderr with exit status 1; progress
bars appear on request (or on a terminal) and never on stdout; SIGTERM leaves no file."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import pytest

from edgeinfer.apps.convert import add_parser, main, run
from tests.converters.conftest import leftovers


def test_plugs_into_subparsers(checkpoints):
    parser = argparse.ArgumentParser(prog="edgeinfer")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    args = parser.parse_args(["convert", str(checkpoints["llama"]), "-o", "x.gguf",
                              "--type", "q4_k_m", "--max-memory", "2GiB", "--ctx", "512",
                              "--dry-run"])  # fmt: skip
    assert (
        args.command == "convert" and args.type == "q4_k_m" and args.ctx == 512 and callable(main)
    )


def test_dry_run_prints_the_plan(checkpoints, out_dir, capsys):
    assert (
        run(
            [
                str(checkpoints["gemma3"]),
                "-o",
                str(out_dir / "m.gguf"),
                "--type",
                "q4_k_m",
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Gemma3ForCausalLM -> GGUF gemma3, q4_k_m" in out
    assert "token_embd.weight" in out and "Q8_0" in out and "blk.6.ffn_down.weight" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("blk.0.attn_q.weight"))
    assert (
        line.split()[2:4] == ["Q5_0", "56320"] and float(line.split()[4]) > 0
    )  # type, bytes, error
    assert leftovers(out_dir) == []


def test_dry_run_with_a_budget(checkpoints, capsys):
    assert (
        run([str(checkpoints["llama"]), "--max-memory", "8MiB", "--ctx", "256", "--dry-run"]) == 0
    )
    out = capsys.readouterr().out
    assert "fitted" in out and "KV cache (f16, 256 tokens)" in out and "fits" in out


def test_dry_run_when_nothing_fits(checkpoints, capsys):
    assert run([str(checkpoints["llama"]), "--max-memory", "1MB", "--ctx", "256", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("edgeinfer: error: nothing fits")
        and "short by" in err
        and err.count("\n") == 1
    )


def test_convert_with_progress(checkpoints, out_dir, capsys):
    out = out_dir / "m.gguf"
    assert run([str(checkpoints["qwen2"]), "-o", str(out), "--type", "q8_0", "--progress"]) == 0
    captured = capsys.readouterr()
    assert out.exists() and captured.out == ""
    assert "writing" in captured.err and "#" * 30 in captured.err and f"wrote {out}" in captured.err


def test_no_progress_when_not_a_terminal(checkpoints, out_dir, capsys):
    assert run([str(checkpoints["qwen2"]), "-o", str(out_dir / "m.gguf"), "--type", "q8_0"]) == 0
    assert "[" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, match, status",
    [(["--type", "q9", "--dry-run"], "unknown type 'q9'", 2), ([], "needs -o OUT", 2),
     (["-o", "OUT/folder"], "OUT: no such folder", 1)],
)  # fmt: skip
def test_errors(checkpoints, capsys, argv, match, status):
    assert run([str(checkpoints["llama"]), *argv]) == status
    err = capsys.readouterr().err
    assert match in err and err.startswith("edgeinfer: error:")


def test_sigterm_leaves_no_file(checkpoints, tmp_path):
    """A conversion killed politely (SIGTERM) while writing removes its temporary file."""
    out = tmp_path / "m.gguf"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeinfer.apps.convert", str(checkpoints["gemma3"]), "-o", str(out),
         "--type", "q4_k_m", "--progress"],
        stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    buf = ""
    while "writing" not in buf and proc.poll() is None:
        buf += proc.stderr.read(1)
    time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the conversion finished before the signal arrived")
    assert proc.returncode == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
