"""What the desktop app keeps between starts: the conversation, the system prompt, the
options and the recent models, in one JSON file written atomically (a crash mid-save leaves
the previous file whole)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from edgeinfer.atomic_file import atomic_file

RECENT_MODELS = 8
STATE_FILE = "desktop.json"


def data_dir() -> Path:
    """EDGEINFER_DESKTOP_DIR, else the platform's per-user data folder."""
    override = os.environ.get("EDGEINFER_DESKTOP_DIR")
    if override:
        return Path(override)
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA", Path.home())) / "edgeinfer"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "edgeinfer"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "edgeinfer"


class Store:
    """The app's saved state; ``load`` never fails (a damaged file starts afresh, and is
    kept beside as ``.damaged`` for the user)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.path = (folder or data_dir()) / STATE_FILE
        self.state: dict[str, Any] = {"messages": [], "system": "", "recent": [], "options": {}}
        self.error = ""

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("messages", []), list):
                raise ValueError("not a saved state")
            self.state.update(data)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            self.error = f"the saved conversation could not be read ({e}); starting afresh"
            with contextlib.suppress(OSError):
                self.path.replace(self.path.with_suffix(".damaged"))
        return self.state

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(self.state, ensure_ascii=False, indent=1).encode("utf-8")
        with atomic_file(self.path) as out:
            out.write(data)

    def remember_model(self, path: str) -> None:
        recent = [p for p in self.state.get("recent", []) if p != path]
        self.state["recent"] = [path, *recent][:RECENT_MODELS]
