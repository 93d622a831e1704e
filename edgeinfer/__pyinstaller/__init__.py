"""PyInstaller support, registered through the ``pyinstaller40`` entry point: an app that
imports edgeinfer and is frozen gets the native library (loaded with ctypes, so PyInstaller's
import analysis cannot see it) and the modules edgeinfer imports on first use."""

from __future__ import annotations

import os


def get_hook_dirs() -> list[str]:
    return [os.path.dirname(__file__)]
