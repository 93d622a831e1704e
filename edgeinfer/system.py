"""What the machine offers: CPU model, cores, instruction-set features, memory, backends."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
from typing import Any

from edgeinfer import errors

# the features that matter to our kernels, by the names Linux's /proc/cpuinfo uses
INTERESTING = (
    "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "avx_vnni",
    "amx_int8", "asimd", "asimddp", "i8mm", "sve", "fphp", "asimdhp", "bf16",
)  # fmt: skip


def _cpuinfo() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if ":" in line:
                    k, v = line.split(":", 1)
                    fields.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return fields


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def physical_cores() -> int:
    """Physical cores this process may use (hyper-threads share execution units, matmuls do
    not gain from them), capped by its CPU affinity and its cgroup's CPU quota."""
    cores = _cores_in_cpuinfo() or max(1, (os.cpu_count() or 2) // 2)
    return max(1, min(cores, usable_cpus()))


def _cores_in_cpuinfo() -> int:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            cores = set()
            phys = None
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    cores.add((phys, line.split(":")[1].strip()))
            return len(cores)
    except OSError:
        return 0


CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"  # "quota period" (or "max ...") under cgroup v2


def usable_cpus() -> int:
    """Logical CPUs this process may run on: its affinity mask, and a container's quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        with open(CGROUP_CPU_MAX, encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, -(-int(quota) // int(period))))  # ceil: 1.5 CPUs -> 2 threads
    except (OSError, ValueError):
        pass
    return max(1, n)


def cpu_info() -> dict[str, Any]:
    info = _cpuinfo()
    model = info.get("model name") or info.get("Model") or info.get("Hardware") or ""
    flags = set((info.get("flags") or info.get("Features") or "").split())
    if sys.platform == "darwin":
        model = model or _sysctl("machdep.cpu.brand_string")
        if platform.machine() == "arm64":
            flags |= {"asimd", "fphp", "asimdhp"}
            if _sysctl("hw.optional.arm.FEAT_DotProd") == "1":
                flags.add("asimddp")
            if _sysctl("hw.optional.arm.FEAT_I8MM") == "1":
                flags.add("i8mm")
    return {
        "model": model or platform.processor() or "unknown",
        "arch": platform.machine(),
        "logical_cores": os.cpu_count() or 1,
        "usable_cores": usable_cpus(),
        "physical_cores": physical_cores(),
        "features": [f for f in INTERESTING if f in flags],
    }


def memory_info() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            for line in f:
                k, v = line.split(":", 1)
                if k in ("MemTotal", "MemAvailable"):
                    out["total_mb" if k == "MemTotal" else "available_mb"] = (
                        int(v.split()[0]) // 1024
                    )
    except OSError:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            out["total_mb"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    return out


CGROUP_MEMORY = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current")


def available_memory() -> int:
    """Bytes a new allocation can get without paging: psutil's "available" (free memory
    plus what the page cache can give back), capped by the room left under this process's
    cgroup memory limit (a container's)."""
    import psutil

    available = int(psutil.virtual_memory().available)
    try:
        with open(CGROUP_MEMORY[0], encoding="ascii") as f:
            limit = f.read().strip()
        with open(CGROUP_MEMORY[1], encoding="ascii") as f:
            current = int(f.read().strip())
        if limit != "max":
            available = min(available, max(0, int(limit) - current))
    except (OSError, ValueError):
        pass
    return available


def backends() -> list[dict[str, Any]]:
    """Every registered engine, whether it is usable here and why not; the native engine's
    entry lists its instruction-set variants and which one is chosen."""
    from edgeinfer import engines

    found = engines.report()
    for entry in found:
        if entry["name"] == "native" and entry["available"]:
            from edgeinfer import _native

            entry["isa"] = _native.isa_report()
            chosen = [v["name"] for v in entry["isa"] if v["chosen"]]
            entry["detail"] = f"{', '.join(chosen)} kernels ({_native.cpu_features()})"
            entry["library"] = str(_native.library_path_looked_for())
    return found


def gpus() -> dict[str, Any]:
    """The Vulkan devices the native library finds (``devices``), and why there are none
    (``none``: no native library, no Vulkan loader, no driver; "" when there are). Each
    device's ``uses`` says what layer offload would use on it, from a context opened on it:
    the subgroup and integer dot product shader variants, and where its free memory is read
    (or ``error``: why no context opened)."""
    from edgeinfer import _native

    loaded, why = _native.available()
    if not loaded:
        return {"devices": [], "none": f"the native library is not available: {why}"}
    devices, why = _native.vulkan_devices()
    for i, d in enumerate(devices):
        try:
            with _native.VulkanKernels(i) as ctx:
                info = ctx.info()
        except errors.EdgeInferError as e:
            d["uses"] = {"error": str(e)}
            continue
        d["uses"] = {
            "subgroups": info["subgroups"],
            "integer_dot": info["integer_dot"],
            "free_memory": "VK_EXT_memory_budget" if d["budget_bytes"] is not None else "heap size",
        }
    return {"devices": devices, "none": why}


def doctor() -> dict[str, Any]:
    return {
        "edgeinfer": _version(),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu_info(),
        "memory": memory_info(),
        "backends": backends(),
        "gpus": gpus(),
        # a PyInstaller bundle's folder (where edgeinfer found its library), else ""
        "frozen": str(getattr(sys, "_MEIPASS", "")) if getattr(sys, "frozen", False) else "",
    }


def _version() -> str:
    import edgeinfer

    return edgeinfer.__version__
