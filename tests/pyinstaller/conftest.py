# PyInstaller's own fixtures (pyi_builder freezes a script and runs the bundle)
from PyInstaller.utils.conftest import *  # noqa: F403 (the fixtures are the whole module)
