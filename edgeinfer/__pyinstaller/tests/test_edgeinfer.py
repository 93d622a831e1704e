"""Frozen-app tests of the hook, with PyInstaller's ``pyi_builder`` fixture, onedir and
onefile: a script that imports edgeinfer and generates 8 greedy tokens, frozen with no
options, prints exactly what it prints unfrozen, on the native engine, from the library
inside the bundle: run as the fixture runs it, with EDGEINFER_ISA=scalar, from another
working directory, and with a clean environment.

Without the hook the bundle lacked the native library (loaded with ctypes, invisible to
PyInstaller) and edgeinfer fell back silently to the numpy engine, bit-identical and 20x
slower: identical text proved nothing, so the script reports its engine and library.

The model: the ``frozen_model`` fixture; here EDGEINFER_TEST_MODEL, else the default model
(the ``default-model`` extra). edgeinfer's own test suite gives a small fixture GGUF.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FROZEN_SCRIPT = """
import json
import sys
import warnings

warnings.simplefilter("error")  # a fallback to the numpy engine warns: it fails the run
import edgeinfer
from edgeinfer import system

with edgeinfer.load(sys.argv[1], n_ctx=64) as model:
    text = model.generate("Hello", max_tokens=8, temperature=0).text
    native = next(b for b in system.backends() if b["name"] == "native")
    print("RESULT " + json.dumps({
        "text": text, "engine": model.engine, "isa": model.backend.isa,
        "library": native.get("library"), "bundle": getattr(sys, "_MEIPASS", None),
    }))
"""
# a onefile bundle of this script in an environment that also holds torch, transformers and
# onnx (edgeinfer's test extras) was 304 MB before the hook kept them out
ONEFILE_LIMIT = 60 << 20
# what an app that does not import them must not carry
LEFT_OUT = ("torch", "transformers", "onnx", "onnxruntime", "edgeinfer.converters")


@pytest.fixture
def frozen_model() -> Path:
    path = os.environ.get("EDGEINFER_TEST_MODEL")
    if path:
        return Path(path)
    try:
        from edgeinfer.default_model import default_model_path

        return default_model_path()
    except Exception as e:
        pytest.skip(f"no model: set EDGEINFER_TEST_MODEL or install edgeinfer[default-model] ({e})")


def _result(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, output[-3000:]
    return json.loads(lines[0][len("RESULT ") :])


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> dict:
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _result(proc.stdout)


def _clean_env(**extra: str) -> dict[str, str]:
    """No PYTHONPATH, no virtual environment, no PATH: only what a desktop session has."""
    keep = {k: os.environ[k] for k in ("HOME", "LANG", "TMPDIR") if k in os.environ}
    return {**keep, **extra}


@pytest.mark.parametrize("pyi_builder", ["onedir", "onefile"], indirect=True)
def test_frozen_app_runs_the_native_engine(pyi_builder, frozen_model, capfd, tmp_path_factory):
    pyi_builder.test_source(FROZEN_SCRIPT, app_args=[str(frozen_model)])
    first = _result(capfd.readouterr().out)  # the fixture's own run (its environment lacks PATH)
    exe = next(
        p for p in (Path(pyi_builder._dist_dir) / "test_source" / "test_source",
                    Path(pyi_builder._dist_dir) / "test_source")
        if p.is_file()
    )  # fmt: skip
    script = Path(pyi_builder._tmp_path) / "unfrozen.py"
    script.write_text(FROZEN_SCRIPT)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    unfrozen = _run([sys.executable, str(script), str(frozen_model)], dict(os.environ), elsewhere)
    unfrozen_scalar = _run(
        [sys.executable, str(script), str(frozen_model)],
        {**os.environ, "EDGEINFER_ISA": "scalar"}, elsewhere,
    )  # fmt: skip
    frozen = [str(exe), str(frozen_model)]
    runs = {
        "the fixture's run": (first, unfrozen),
        "another directory": (_run(frozen, dict(os.environ), elsewhere), unfrozen),
        "a clean environment": (_run(frozen, _clean_env(), elsewhere), unfrozen),
        "EDGEINFER_ISA=scalar": (
            _run(frozen, _clean_env(EDGEINFER_ISA="scalar"), exe.parent),
            unfrozen_scalar,
        ),
    }
    assert unfrozen["engine"] == "native" and unfrozen_scalar["isa"] == "scalar"
    for what, (got, expected) in runs.items():
        assert got["text"] == expected["text"], what
        assert got["engine"] == "native" and got["isa"] == expected["isa"], what
        # the library the bundle carries, not the one of the environment it was built in
        assert got["bundle"] and Path(got["library"]).is_relative_to(got["bundle"]), what
    _check_contents(exe, pyi_builder._mode)


def _check_contents(exe: Path, mode: str) -> None:
    from PyInstaller.archive.readers import pkg_archive_contents

    names = pkg_archive_contents(str(exe))
    carried = sorted({n for n in names for m in LEFT_OUT if n == m or n.startswith(m + ".")})
    assert not carried, f"the bundle carries {carried[:10]}"
    if mode == "onedir":  # the library lies in the folder, beside the executable
        libraries = [str(p) for p in exe.parent.rglob("_edgeinfer_native*")]
        size = sum(p.stat().st_size for p in exe.parent.rglob("*") if p.is_file())
    else:
        libraries = [n for n in names if "_edgeinfer_native" in n]
        size = exe.stat().st_size
        assert size < ONEFILE_LIMIT, f"the onefile bundle is {size / 2**20:.1f} MiB"
    assert len(libraries) == 1, libraries
    print(f"{mode} bundle: {size / 2**20:.1f} MiB")
