# PyInstaller's own fixtures (pyi_builder freezes a script and runs the bundle); this folder is
# what the ``tests`` entry point names, for python -m PyInstaller.utils.run_tests
from PyInstaller.utils.conftest import *  # noqa: F403 (the fixtures are the whole module)
