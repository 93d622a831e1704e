"""The PyInstaller hook: the frozen-app tests the package registers for PyInstaller's own
test runner (edgeinfer/__pyinstaller/tests), run here on a small fixture GGUF."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

pytest.importorskip("PyInstaller")

from edgeinfer.__pyinstaller import get_PyInstaller_tests
from edgeinfer.__pyinstaller.tests.test_edgeinfer import (  # noqa: F401 (collected here)
    test_frozen_app_runs_the_native_engine,
)


@pytest.fixture
def frozen_model(fixture_models) -> Path:
    return fixture_models["llama"]


def test_hook_and_tests_are_registered():
    points = importlib.metadata.entry_points(group="pyinstaller40")
    hooks = {p.name: p.value for p in points if p.value.startswith("edgeinfer.")}
    assert hooks == {
        "hook-dirs": "edgeinfer.__pyinstaller:get_hook_dirs",
        "tests": "edgeinfer.__pyinstaller:get_PyInstaller_tests",
    }
    (folder,) = get_PyInstaller_tests()
    assert (Path(folder) / "test_edgeinfer.py").is_file()
