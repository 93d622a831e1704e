"""Builds the native core (simd/) into one shared library that edgeinfer/_native.py loads.

Every instruction-set variant is compiled separately with its own flags, never
-march=native, so one build runs on any CPU of its architecture and picks the best variant
at run time. The library is declared as an extension module only so that setuptools builds
and installs it next to the package; it is loaded with ctypes, never imported.
"""

from __future__ import annotations

import os
import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent
SIMD = ROOT / "simd"

GCC_BASE = [
    "-O2",
    "-std=c11",
    "-ffp-contract=off",
    "-fvisibility=hidden",
    "-fno-math-errno",
    "-Wall",
]
MSVC_BASE = ["/O2", "/std:c11", "/experimental:c11atomics", "/fp:precise"]
# EDGEINFER_SANITIZE=address,undefined (GCC/Clang) builds with -fsanitize=<that> plus these, at
# compile and link time, for the CI sanitizer job (.ci/sanitize); unset, the build is unchanged.
# -O1 (after GCC_BASE's -O2) halves the instrumented build's compile time; results do not
# depend on it (-ffp-contract=off and no fast-math: no optimisation level reorders arithmetic)
SANITIZE_ENV = "EDGEINFER_SANITIZE"
SANITIZE_FLAGS = ["-O1", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined", "-g"]

# directory -> (gcc/clang flags, msvc flags, the define that tells the dispatcher it was built)
X86_VARIANTS = {
    "x86_avx2": (["-mavx2", "-mfma", "-mf16c"], ["/arch:AVX2"], "EI_HAVE_AVX2"),
    "x86_avx512": (
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mfma", "-mf16c"],
        ["/arch:AVX512"],
        "EI_HAVE_AVX512",
    ),
}
NEON_LEVELS = {  # the arm_neon sources are compiled once per level
    0: (["-march=armv8-a"], [], "EI_HAVE_NEON"),
    1: (["-march=armv8.2-a+dotprod"], [], "EI_HAVE_NEON_DOTPROD"),
    2: (["-march=armv8.2-a+dotprod+i8mm"], [], "EI_HAVE_NEON_I8MM"),
}


# EDGEINFER_ISAS=avx2,... builds only those instruction-set variants (edgeinfer._native's
# names) besides the portable one: the sanitizer job builds what the CPU it runs on can test
ISAS_ENV = "EDGEINFER_ISAS"
ISA_OF_VARIANT = {"x86_avx2": "avx2", "x86_avx512": "avx512", 0: "neon", 1: "neon-dotprod",
                  2: "neon-i8mm"}  # fmt: skip


def _wanted(variant: str | int) -> bool:
    names = os.environ.get(ISAS_ENV, "").strip()
    return not names or ISA_OF_VARIANT[variant] in names.split(",")


def _sanitizer_flags() -> list[str]:
    names = os.environ.get(SANITIZE_ENV, "").strip()
    return [f"-fsanitize={names}", *SANITIZE_FLAGS] if names else []


def _arch() -> str:
    machine = os.environ.get("EDGEINFER_TARGET_ARCH") or platform.machine()
    machine = machine.lower()
    if machine in ("x86_64", "amd64", "x64"):
        return "x86_64"
    if machine in ("aarch64", "arm64"):
        return "aarch64"
    return machine


class BuildNative(build_ext):
    def build_extension(self, ext: Extension) -> None:
        cc = self.compiler
        msvc = cc.compiler_type == "msvc"
        base = MSVC_BASE if msvc else GCC_BASE + _sanitizer_flags()
        arch = _arch()
        defines: list[tuple[str, str | None]] = []
        groups: list[tuple[list[str], list[str], list[tuple[str, str | None]], str]] = []
        # a variant whose flags this compiler does not know is left out (an older GCC lacks
        # +i8mm or -mavx512vnni), and the dispatcher is told which variants exist
        if arch == "x86_64":
            for folder, (gnu, ms, define) in X86_VARIANTS.items():
                flags = ms if msvc else gnu
                if _wanted(folder) and self._accepts(base + flags):
                    defines.append((define, None))
                    groups.append((_sources(folder), flags, [], folder))
        elif arch == "aarch64" and not msvc:  # NEON needs GCC/Clang (__fp16, ACLE feature macros)
            for level, (gnu, _, define) in NEON_LEVELS.items():
                if not (_wanted(level) and self._accepts(base + gnu)):
                    break  # each level needs the ones below it
                defines.append((define, None))
                groups.append(
                    (_sources("arm_neon"), gnu, [("EI_NEON_LEVEL", str(level))], f"neon{level}")
                )
        base_sources = _sources("common") + _sources("ref") + _sources("gpu_vulkan")
        groups.insert(0, (base_sources, [], defines, "base"))

        def compile_one(job: tuple[str, list[str], list[tuple[str, str | None]], str]) -> list[str]:
            source, flags, macros, tag = job
            return cc.compile(
                [source], output_dir=os.path.join(self.build_temp, tag), macros=macros,
                include_dirs=[str(SIMD / "include")], extra_postargs=base + flags,
                depends=_headers(),
            )  # fmt: skip

        # one compiler process per source file, as many at once as there are cores (each
        # call spawns its own process; the objects keep the order of the sources)
        jobs = [
            (src, flags, macros, tag) for sources, flags, macros, tag in groups for src in sources
        ]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            objects = [obj for objs in pool.map(compile_one, jobs) for obj in objs]
        # dl: the Vulkan loader is opened at run time (simd/gpu_vulkan), never linked
        libraries = [] if msvc or sys.platform == "darwin" else ["m", "pthread", "dl"]
        cc.link_shared_object(
            objects, self.get_ext_fullpath(ext.name), libraries=libraries,
            export_symbols=self.get_export_symbols(ext), build_temp=self.build_temp,
            extra_postargs=[] if msvc else _sanitizer_flags(), target_lang="c",
        )  # fmt: skip

    def _accepts(self, flags: list[str]) -> bool:
        """Whether the compiler builds a trivial file with these flags."""
        probe_dir = os.path.join(self.build_temp, "probe")
        os.makedirs(probe_dir, exist_ok=True)
        src = os.path.join(probe_dir, "probe.c")
        with open(src, "w", encoding="ascii") as f:
            f.write("int ei_probe(int x) { return x + 1; }\n")
        try:
            self.compiler.compile([src], output_dir=probe_dir, extra_postargs=flags)
            return True
        except Exception:  # distutils' CompileError, or the compiler missing a flag
            return False


def _sources(folder: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (SIMD / folder).glob("*.c"))


def _headers() -> list[str]:
    return sorted(str(p) for p in SIMD.rglob("*.h"))


ext_modules = []
if not os.environ.get("EDGEINFER_NO_NATIVE"):
    ext_modules.append(Extension("edgeinfer._edgeinfer_native", sources=_sources("common")))

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildNative})
