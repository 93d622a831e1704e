"""The PyInstaller hook: a script that imports edgeinfer, frozen with PyInstaller's own test
fixture, runs the native engine in the bundle (without the hook, ctypes' library is not
collected and edgeinfer silently ran the numpy reference)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

pytest.importorskip("PyInstaller")
pytestmark = pytest.mark.slow

FROZEN_SCRIPT = """
import sys
import warnings

warnings.simplefilter("error")  # a fallback to the numpy engine fails the run
import edgeinfer

with edgeinfer.load(sys.argv[1], n_ctx=64) as model:
    text = model.generate("Hello", max_tokens=4, temperature=0).text
    print("engine", model.engine, model.backend.isa, repr(text))
    assert model.engine == "native", model.engine
"""


def test_hook_is_registered():
    points = importlib.metadata.entry_points(group="pyinstaller40")
    hooks = {p.name: p.value for p in points if p.value.startswith("edgeinfer.")}
    assert hooks == {"hook-dirs": "edgeinfer.__pyinstaller:get_hook_dirs"}


@pytest.mark.parametrize("pyi_builder", ["onedir"], indirect=True)
def test_frozen_app_runs_the_native_engine(pyi_builder, fixture_models):
    pyi_builder.test_source(FROZEN_SCRIPT, app_args=[str(fixture_models["llama"])])
    bundle = Path(pyi_builder._dist_dir)  # the fixture keeps its dist folder here
    libraries = list(bundle.rglob("_edgeinfer_native*"))
    assert len(libraries) == 1 and libraries[0].parent.name == "edgeinfer"
    # the optional backend stays out of an app that does not import it (it pulls in torch)
    assert not list(bundle.rglob("onnxruntime")), "onnxruntime was bundled"
