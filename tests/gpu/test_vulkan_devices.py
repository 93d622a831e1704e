"""Vulkan devices as the native library reports them (simd/gpu_vulkan/device.c), against
Khronos' own `vulkaninfo` on the same machine: Mesa's lavapipe in CI (mesa-vulkan-drivers,
vulkan-tools). Without a Vulkan driver these skip, saying so; in CI they must run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from edgeinfer import _native
from tests.gpu import need_vulkan

pytestmark = pytest.mark.skipif(not _native.available()[0], reason="no native library")


def _devices() -> list[dict]:
    return need_vulkan()


def _vulkaninfo(*args: str) -> str:
    tool = shutil.which("vulkaninfo")
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have vulkaninfo (vulkan-tools)")
        pytest.skip("vulkaninfo (vulkan-tools) is not installed")
    env = {**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")}
    return subprocess.run(
        [tool, *args], capture_output=True, text=True, env=env, check=True, timeout=120
    ).stdout


def _first(text: str, key: str) -> str:
    match = re.search(rf"^\s*{key}\s*=\s*(.+?)\s*$", text, re.M)
    assert match, f"vulkaninfo printed no {key}"
    return match.group(1)


def test_devices_match_vulkaninfo():
    devices = _devices()
    summary = _vulkaninfo("--summary")
    sections = re.split(r"^GPU\d+:\s*$", summary.split("Devices:", 1)[1], flags=re.M)[1:]
    assert len(sections) == len(devices)
    for ours, theirs in zip(devices, sections, strict=True):
        assert ours["name"] == _first(theirs, "deviceName")
        kind = ours["type"].replace(" GPU", "_GPU").upper()
        assert _first(theirs, "deviceType") == f"PHYSICAL_DEVICE_TYPE_{kind}"
        assert ours["api_version"] == _first(theirs, "apiVersion")
        assert ours["driver"] == _first(theirs, "driverName")
        assert ours["driver_info"] == _first(theirs, "driverInfo")
        assert int(_first(theirs, "vendorID"), 16) == ours["vendor_id"]


def test_limits_features_and_memory_match_vulkaninfo():
    devices = _devices()
    if len(devices) != 1:
        pytest.skip("vulkaninfo's full report is read for one device")
    (ours,) = devices
    full = _vulkaninfo()
    assert ours["max_storage_buffer_bytes"] == int(_first(full, "maxStorageBufferRange"))
    assert ours["max_allocation_bytes"] == int(_first(full, "maxMemoryAllocationSize"), 0)
    assert ours["subgroup_size"] == int(_first(full, "subgroupSize"))
    for key, name in (("fp16", "shaderFloat16"), ("int8", "shaderInt8"),
                      ("storage16", "storageBuffer16BitAccess"),
                      ("integer_dot_product", "shaderIntegerDotProduct")):  # fmt: skip
        assert ours[key] == (_first(full, name) == "true"), name
    heap = r"memoryHeaps\[\d+\]:\s*size\s*=\s*(\d+).*?flags:(.*?)(?=memoryHeaps|memoryTypes)"
    heaps = re.findall(heap, full, re.S)
    local = sum(int(size) for size, flags in heaps if "DEVICE_LOCAL" in flags)
    assert local and ours["device_local_bytes"] == local
    assert (ours["budget_bytes"] is not None) == ("VK_EXT_memory_budget" in full)


def test_doctor_lists_the_devices():
    devices = _devices()
    report = json.loads(
        subprocess.run(
            [sys.executable, "-m", "edgeinfer.apps.cli", "doctor", "--json"],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout
    )  # fmt: skip
    uses = [d.pop("uses") for d in report["gpus"]["devices"]]
    assert report["gpus"] == {"devices": devices, "none": ""}
    for i, used in enumerate(uses):  # what a context on the device runs
        with _native.VulkanKernels(i) as ctx:
            info = ctx.info()
        assert used == {
            "subgroups": info["subgroups"], "integer_dot": info["integer_dot"],
            "free_memory": "VK_EXT_memory_budget" if devices[i]["budget_bytes"] else "heap size",
        }  # fmt: skip
    text = subprocess.run(
        [sys.executable, "-m", "edgeinfer.apps.cli", "doctor"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert f"gpu 0     {devices[0]['name']}" in text and "one buffer up to" in text
    assert "offload  uses " in text


@pytest.mark.parametrize(
    "env, reason",
    [
        ({"EDGEINFER_VULKAN_LOADER": "/nonexistent/libvulkan.so.1"}, "no Vulkan loader"),
        ({"VK_ICD_FILENAMES": "/nonexistent/icd.json", "VK_DRIVER_FILES": "/nonexistent/icd.json"},
         "no Vulkan driver"),
    ],
)  # fmt: skip
def test_no_vulkan_is_no_gpu_not_an_error(env, reason):
    """A machine without a loader or a driver reports no GPU, and the rest works."""
    if "VK_ICD_FILENAMES" in env and _native.vulkan_devices()[1].startswith("no Vulkan loader"):
        if os.environ.get("CI"):
            pytest.fail("CI must have a Vulkan loader (libvulkan1)")
        pytest.skip("no Vulkan loader here, so no run without a driver")
    out = subprocess.run(
        [sys.executable, "-m", "edgeinfer.apps.cli", "doctor", "--json"],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    gpus = json.loads(out.stdout)["gpus"]
    assert gpus["devices"] == [] and gpus["none"].startswith(reason), gpus
