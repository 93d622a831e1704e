"""The desktop chat app: frozen with the hook, driven on a virtual screen (Xvfb) with
xdotool as a person would, its window state read through the app's test hook (--state-file);
the conversation store against a kill mid-save; errors shown in the window."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeinfer.apps.desktop.store import Store
from edgeinfer.conversation import Conversation
from tests.api.conftest import load
from tests.apps.screenshots import distinct_colours, grab, write_png

QUESTION = "What is the capital of France?"
LAUNCHER = "import sys\nfrom edgeinfer.apps.desktop.app import main\nsys.exit(main())\n"
NEEDS_X = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("xdotool") and shutil.which("xwd")),
    reason="needs Xvfb, xdotool and xwd (.ci/run installs them)",
)


@pytest.fixture
def display():
    """A virtual screen of its own (Xvfb picks a free display number)."""
    read, write = os.pipe()
    xvfb = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write), "-screen", "0", "1024x768x24", "-nolisten", "tcp"],
        pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(write)
    with os.fdopen(read) as f:
        number = f.readline().strip()
    yield f":{number}"
    xvfb.terminate()
    xvfb.wait(timeout=10)


def _wait_state(path: Path, until, proc: subprocess.Popen, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    state: dict = {}
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the app exited with {proc.returncode}"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            state = {}
        if state and until(state):
            return state
        time.sleep(0.1)
    pytest.fail(f"the window never reached the state awaited; last: {state}")


def _xdotool(display: str, *args: str) -> str:
    return subprocess.run(
        ["xdotool", *args], env={**os.environ, "DISPLAY": display}, capture_output=True,
        text=True, check=True, timeout=60,
    ).stdout  # fmt: skip


def _launch(argv: list[str], display: str, data: Path, state: Path) -> subprocess.Popen:
    env = {
        "DISPLAY": display, "EDGEINFER_DESKTOP_DIR": str(data), "HOME": os.environ.get("HOME", "/"),
    }  # fmt: skip
    return subprocess.Popen([*argv, "--state-file", str(state)], env=env, cwd=data)


def _quit(proc: subprocess.Popen, display: str) -> None:
    _xdotool(display, "key", "ctrl+q")
    assert proc.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def frozen_desktop(tmp_path_factory) -> Path:
    """The desktop app frozen with plain ``pyinstaller --onedir`` (no options: the hook)."""
    pytest.importorskip("PyInstaller")
    work = tmp_path_factory.mktemp("frozen-desktop")
    (work / "edgeinfer_desktop.py").write_text(LAUNCHER)
    subprocess.run(
        [sys.executable, "-m", "PyInstaller", "--onedir", "--noconfirm", "--log-level", "WARN",
         "edgeinfer_desktop.py"], cwd=work, check=True, timeout=900,
    )  # fmt: skip
    return work / "dist" / "edgeinfer_desktop" / "edgeinfer_desktop"


@NEEDS_X
@pytest.mark.slow
def test_frozen_app_chats_and_restores_the_conversation(
    frozen_desktop, display, gemma_path, tmp_path
):
    data, state = tmp_path / "data", tmp_path / "state.json"
    data.mkdir()
    (data / "desktop.json").write_text(json.dumps({"options": {"temperature": 0}}))
    app = _launch([str(frozen_desktop), str(gemma_path)], display, data, state)
    loaded = _wait_state(state, lambda s: s["engine"], app)
    assert loaded["engine"] == "native" and "base model" in loaded["notice"]
    window = _xdotool(display, "search", "--sync", "--name", "edgeinfer chat").split()[0]
    _xdotool(display, "windowfocus", "--sync", window)
    _xdotool(display, "type", "--delay", "10", QUESTION)
    _xdotool(display, "key", "Return")
    done = _wait_state(state, lambda s: s["stats"] and not s["busy"], app)
    with load(gemma_path) as model:  # the API's reply to the same conversation
        stream = Conversation(model, temperature=0).send(QUESTION)
        expected = "".join(stream).strip()
    assert expected and done["transcript"] == f"You: {QUESTION}\nModel: {expected}\n"
    assert "tok/s" in done["stats"] and "MiB" in done["stats"] and not done["error"]
    shot = grab(display)
    write_png(shot, tmp_path / "desktop.png")
    assert distinct_colours(shot) > 50, "the screenshot is blank"
    _quit(app, display)
    saved = json.loads((data / "desktop.json").read_text())
    assert saved["messages"] == [
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": expected},
    ]  # fmt: skip
    assert saved["recent"] == [str(gemma_path)]
    # the next start opens the last model and shows the saved conversation
    state.unlink()
    again = _launch([str(frozen_desktop)], display, data, state)
    restored = _wait_state(state, lambda s: s["engine"], again)
    assert restored["transcript"] == done["transcript"]
    _quit(again, display)


@NEEDS_X
def test_a_bad_model_file_is_shown_in_the_window(display, tmp_path):
    data, state = tmp_path / "data", tmp_path / "state.json"
    data.mkdir()
    bad = tmp_path / "hostile.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    argv = [sys.executable, "-m", "edgeinfer.apps.desktop.app", str(bad)]
    app = _launch(argv, display, data, state)
    shown = _wait_state(state, lambda s: s["error"], app, timeout=60)
    assert "ModelFileError" in shown["error"] or "Error" in shown["error"]
    assert app.poll() is None  # the app lives on
    _quit(app, display)


SAVER = """
import sys
from pathlib import Path
from edgeinfer.apps.desktop.store import Store

store = Store(Path(sys.argv[1]))
i = 0
while True:
    i += 1
    store.state["messages"] = [{"role": "user", "content": str(i) * 200_000}]
    store.save()
"""


def test_the_store_survives_a_kill_during_a_save(tmp_path):
    """SIGKILL at random points of a stream of saves: the file is always a whole save."""
    seen = set()
    for delay in (0.3, 0.45, 0.6, 0.75, 0.9):
        saver = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path)])
        time.sleep(delay)
        saver.send_signal(signal.SIGKILL)
        saver.wait()
        store = Store(tmp_path)
        messages = store.load()["messages"]
        assert not store.error, store.error
        if messages:  # (the first save may not have happened yet)
            content = messages[0]["content"]
            unit = content[: len(content) // 200_000]
            assert unit.isdigit() and content == unit * 200_000  # one whole save
            seen.add(content[:8])
    assert seen, "no save completed"
