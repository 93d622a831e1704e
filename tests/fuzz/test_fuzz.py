"""The fuzz targets' smoke runs (about 20 s each) and the replay of every finding kept."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz import harness

ROOT = Path(__file__).resolve().parents[2]
TARGETS = sorted(p.stem for p in Path(__file__).parent.glob("fuzz_*.py"))
SMOKE_SECONDS = int(os.environ.get("EDGEINFER_FUZZ_SECONDS", "20"))


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_smoke_run_finds_nothing(target: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    artifacts = tmp_path / "findings"
    # Linux keeps a process's peak RSS across exec, and libFuzzer's rss limit reads it: a
    # child started straight from this worker (which may have held gigabytes for other
    # tests) would begin "over" the limit. A shell forks it instead: a fresh peak.
    cmd = [
        "sh", "-c", '"$0" "$@"; exit $?',
        sys.executable, "-m", f"tests.fuzz.{target}", "--seconds", str(SMOKE_SECONDS),
        "--corpus", str(tmp_path / "corpus"), "--artifacts", str(artifacts),
    ]  # fmt: skip
    run = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=SMOKE_SECONDS * 6 + 120
    )
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, tail
    assert not list(artifacts.glob("*")), tail
    execs = [line for line in run.stderr.splitlines() if "stat::number_of_executed_units" in line]
    assert execs and int(execs[-1].split(":")[-1]) > 0, tail


@pytest.mark.parametrize("target", TARGETS)
def test_kept_findings_stay_fixed(target: str) -> None:
    module = importlib.import_module(f"tests.fuzz.{target}")
    folder = harness.REGRESSIONS / target
    inputs = [*module.seeds(), *(p.read_bytes() for p in sorted(folder.glob("*")))]
    check = harness.guarded(module.one_input)
    for data in inputs:
        check(data)
