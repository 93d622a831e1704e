"""Tests of the Vulkan backend (simd/gpu_vulkan/)."""

from __future__ import annotations

import os

import pytest

from edgeinfer import _native


def need_vulkan() -> list[dict]:
    """The Vulkan devices; without any the calling test skips, saying why, or fails in CI
    (which installs Mesa's lavapipe)."""
    devices, why = _native.vulkan_devices()
    if not devices:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have a Vulkan driver (lavapipe): {why}")
        pytest.skip(f"no Vulkan driver here: {why}")
    return devices
