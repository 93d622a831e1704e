"""PyInstaller hook for edgeinfer (found through ``edgeinfer.__pyinstaller.get_hook_dirs``)."""

from PyInstaller.utils.hooks import collect_dynamic_libs, collect_submodules

# the native core: a shared library named like an extension module, opened with ctypes from
# the folder of edgeinfer/_native.py, so it goes next to the package in the bundle
binaries = collect_dynamic_libs("edgeinfer", search_patterns=["_edgeinfer_native*"])

# imported on first use (edgeinfer.__getattr__) or through the engine registry (importlib)
hiddenimports = [
    "edgeinfer.api",
    "edgeinfer.generation",
    "edgeinfer.sampling",
    *collect_submodules("edgeinfer.engines"),
]
