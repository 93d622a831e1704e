"""Type-checks edgeinfer/, apps/ and converters/ as the one package edgeinfer, with mypy.

The package maps apps/ to edgeinfer.apps and converters/ to edgeinfer.converters
(package-dir in pyproject.toml). mypy finds modules by folder only and cannot follow the
editable install's import hook, so this lays the package out as it is installed, as symbolic
links under build/typecheck/edgeinfer/, runs "mypy -p edgeinfer" there with the settings of
pyproject.toml's [tool.mypy], and prints each finding with its path in the source tree.

    python .ci/mypy.py [more mypy options]

Exits with mypy's status: 0 when there are no findings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
# the installed package's subpackages that live outside edgeinfer/ in the source tree
MAPPED = {"apps": ROOT / "apps", "converters": ROOT / "converters"}


def lay_out_package() -> Path:
    """build/typecheck/edgeinfer/: links to every entry of edgeinfer/ plus the mapped folders."""
    package = TREE / "edgeinfer"
    shutil.rmtree(TREE, ignore_errors=True)
    package.mkdir(parents=True)
    for entry in sorted((ROOT / "edgeinfer").iterdir()):
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    for name, folder in MAPPED.items():
        (package / name).symlink_to(folder, target_is_directory=True)
    return package


def source_path(line: str, package: Path) -> str:
    """A mypy output line with its build/typecheck path turned back into the source path."""
    prefixes = [(f"{package / name}{os.sep}", f"{name}{os.sep}") for name in MAPPED]
    prefixes.append((f"{package}{os.sep}", f"edgeinfer{os.sep}"))
    for linked, real in prefixes:
        for shown in (linked, os.path.relpath(linked, ROOT) + os.sep):
            if line.startswith(shown):
                return real + line[len(shown) :]
    return line


def main(argv: list[str]) -> int:
    package = lay_out_package()
    env = dict(os.environ, MYPYPATH=str(TREE))
    command = [sys.executable, "-m", "mypy", "-p", "edgeinfer", *argv]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    for line in result.stdout.splitlines():
        print(source_path(line, package))
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
