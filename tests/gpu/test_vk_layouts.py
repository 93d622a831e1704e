"""simd/gpu_vulkan/vk_min.h against Khronos' vulkan_core.h (tests/gpu/check_vk_layouts.c):
every structure the backend declares for itself has the header's size and field offsets.
Compiled where the header is installed (libvulkan-dev; CI installs it); the package's own
build never needs it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HEADER = Path("/usr/include/vulkan/vulkan_core.h")


def test_declared_structures_match_the_vulkan_headers():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not HEADER.exists():
        if os.environ.get("CI"):
            pytest.fail("CI must have a C compiler and vulkan_core.h (libvulkan-dev)")
        pytest.skip("no C compiler or no vulkan_core.h (libvulkan-dev) here")
    done = subprocess.run(
        [cc, "-std=c11", "-fsyntax-only", str(HERE / "check_vk_layouts.c")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
