"""What a (non-editable) install ships: every package folder and the data files it reads."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder(package: str, package_dir: dict[str, str]) -> Path:
    """The source folder of a package, through the longest package-dir prefix."""
    prefix = max((p for p in package_dir if package == p or package.startswith(p + ".")), key=len)
    rest = package[len(prefix) :].lstrip(".")
    return ROOT / package_dir[prefix] / Path(*rest.split(".") if rest else ())


def test_every_package_folder_is_listed():
    cfg = _setuptools_config()
    found = set()
    for name, folder in cfg["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(ROOT / folder).parts]))
    assert found == set(cfg["packages"])


def test_package_data_globs_match_files():
    cfg = _setuptools_config()
    for package, globs in cfg.get("package-data", {}).items():
        folder = _folder(package, cfg["package-dir"])
        for pattern in globs:
            assert list(folder.glob(pattern)), f"{package}: {pattern} matches nothing in {folder}"
