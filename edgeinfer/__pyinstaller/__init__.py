"""PyInstaller support, registered through the ``pyinstaller40`` entry points.

``hook-dirs``: an app that imports edgeinfer and is frozen gets the native library (loaded
with ctypes, so PyInstaller's import analysis cannot see it; the runtime reads no other
data file) and the modules edgeinfer imports on first use; the optional engines and the
converters' dependencies (onnxruntime, onnx, torch, transformers) stay out unless the app
imports them itself. ``tests``: the frozen-app tests, for ``python -m
PyInstaller.utils.run_tests --include_only edgeinfer.``.
"""

from __future__ import annotations

import importlib.util
import os


def get_hook_dirs() -> list[str]:
    return [os.path.dirname(__file__)]


def get_PyInstaller_tests() -> list[str]:
    return [os.path.join(os.path.dirname(__file__), "tests")]


def package_search_dirs(name: str) -> list[str] | None:
    """The folder to look for package ``name`` in, as the running interpreter imports it.

    An editable install (``pip install -e``) maps edgeinfer, edgeinfer.apps and
    edgeinfer.converters to folders of the checkout through an import hook of its own, which
    PyInstaller's module graph does not run: without this it finds no edgeinfer at all, or
    no edgeinfer.apps. None when the package is missing or is not laid out as a folder of
    that name (PyInstaller then searches as usual)."""
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if len(locations) != 1:
        return None
    folder = os.path.normpath(locations[0])
    if os.path.basename(folder) != name.rpartition(".")[2]:
        return None
    return [os.path.dirname(folder)]
