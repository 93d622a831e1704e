"""What a model path may be: str, bytes or os.PathLike naming a regular file. Anything else
(a FIFO, a device, a directory, an int, a NUL inside) is a typed error at once, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer import errors
from edgeinfer.gguf import GGUFFile
from tests.gguf.craft import tiny_llama_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_path(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny_llama_spec().build())
    return path


class _BytesPath:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __fspath__(self) -> bytes:
        return os.fsencode(self.path)


def _in_child(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter, so that a hang is a timeout, not a stuck test."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


_OPEN_FIFO = """
import sys
import edgeinfer
from edgeinfer import errors
from edgeinfer.gguf import GGUFFile
for open_it in (GGUFFile, edgeinfer.load):
    try:
        open_it(sys.argv[1])
    except errors.NotARegularFileError as e:
        print(type(e).__name__, e)
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    # no writer ever opens the FIFO: a blocking open would wait forever
    run = _in_child(_OPEN_FIFO, str(fifo), timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 2, run.stdout + run.stderr[-2000:]
    for line in lines:
        assert line.startswith("NotARegularFileError") and str(fifo) in line
        assert "not a regular file" in line


def test_device_and_directory_are_refused(tmp_path):
    if os.path.exists("/dev/null"):
        with pytest.raises(errors.NotARegularFileError, match="/dev/null"):
            GGUFFile("/dev/null")
    with pytest.raises(errors.NotARegularFileError, match="directory"):
        GGUFFile(tmp_path)


@pytest.mark.parametrize("kind", ["str", "bytes", "Path", "bytes PathLike"])
def test_every_path_type_opens(tiny_path, kind):
    path = {
        "str": str(tiny_path), "bytes": os.fsencode(tiny_path), "Path": tiny_path,
        "bytes PathLike": _BytesPath(tiny_path),
    }[kind]  # fmt: skip
    with GGUFFile(path) as f:
        assert f.path == str(tiny_path)
        assert f.metadata["general.name"] == "tiny"


def test_load_takes_a_bytes_path(tiny_path):
    import edgeinfer

    with edgeinfer.load(os.fsencode(tiny_path), engine="reference") as model:
        assert model.n_vocab == 64


@pytest.mark.parametrize("path", [3, 2.5, None, ["m.gguf"], object()])
def test_other_types_are_invalid_options(path):
    with pytest.raises(errors.InvalidOptionError, match="str, bytes or os.PathLike"):
        GGUFFile(path)


@pytest.mark.parametrize("path", ["model\0.gguf", b"model\0.gguf"])
def test_nul_in_a_path_is_an_invalid_option(path):
    with pytest.raises(errors.InvalidOptionError, match="NUL"):
        GGUFFile(path)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(errors.ModelFileError, match="nope.gguf: no such file"):
        GGUFFile(os.fsencode(tmp_path / "nope.gguf"))
