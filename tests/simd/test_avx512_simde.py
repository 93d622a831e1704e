"""The avx512 variant against the scalar reference on any x86-64 CPU.

Most machines that build edgeinfer lack AVX-512 (the target laptops are AVX2-only), so the
variant's source is also compiled against SIMDe, which emulates each AVX-512 intrinsic with
narrower instructions (simd/x86_avx512/simd.h fills in the ones SIMDe lacks). Each
build links the C check drivers (tests/simd/check_kernels.c, tests/simd/check_edges.c,
tests/simd/check_guard.c and test_native_kernels' tile driver, which also checks gemm_x16)
with the reference and runs them: every kernel must equal the reference bit for bit,
"0 failed". Where the CPU has AVX-512 the same drivers also run natively, built with
setup.py's flags. Both the VNNI kernels and the fallback chosen on AVX-512 CPUs without
VNNI are checked, and the fallback is checked to contain no VNNI instruction.
"""

from __future__ import annotations

import ast
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.simd.platform_gates import missing_tool, sanitizer_flags
from tests.simd.test_native_kernels import TILE_DRIVER

ROOT = Path(__file__).resolve().parents[2]
SIMD = ROOT / "simd"
HERE = Path(__file__).resolve().parent
FOLDER = SIMD / "x86_avx512"
DRIVERS = {
    "kernels": HERE / "check_kernels.c",
    "edges": Path(__file__).with_name("check_edges.c"),
    "guard": HERE / "check_guard.c",
    "tiles": None,  # test_native_kernels.TILE_DRIVER (gemm and gemm_x16), written out at test time
}

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="the avx512 variant is x86-64 only",
)


def _setup_literal(name: str):
    """A constant of setup.py (the compiler flags), read without running setup.py."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise LookupError(name)


def _compiler() -> str:
    for cc in (os.environ.get("CC"), "gcc", "clang", "cc"):
        if cc and shutil.which(cc):
            return cc
    missing_tool("no C compiler")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def _runs_avx512() -> bool:
    """The CPU and the OS run AVX-512 F/BW/VL/DQ (the dispatcher's own verdict when the
    library is built, else the kernel's CPU flags)."""
    from edgeinfer import _native

    if _native.available()[0]:
        return bool(_native.library().ei_isa_supported(_native.ISA_NAMES.index("avx512")))
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= _cpu_flags()


def _has_simde(cc: str) -> bool:
    probe = subprocess.run(
        [cc, "-E", "-x", "c", "-", "-o", os.devnull],
        input="#include <simde/x86/avx512.h>\n", capture_output=True, text=True, check=False,
    )  # fmt: skip
    return probe.returncode == 0


# build name -> extra flags; native builds add setup.py's flags for the folder
BUILDS = {
    "simde": ["-DEI_USE_SIMDE"],
    "simde-novnni": ["-DEI_USE_SIMDE", "-DEI_AVX512_NO_VNNI"],
    # SIMDe's AVX2 paths, as on the Zen 3 laptops
    "simde-avx2": ["-DEI_USE_SIMDE", "-mavx2", "-mfma", "-mf16c"],
    "native": [],
    "native-novnni": ["-DEI_AVX512_NO_VNNI"],
}


def _build_flags(build: str) -> list[str]:
    flags = [*_setup_literal("GCC_BASE"), *sanitizer_flags(), "-Wno-psabi", *BUILDS[build]]
    if build.startswith("simde"):
        # an intrinsic neither SIMDe nor simd.h defines must not compile to a call
        return [*flags, "-Werror=implicit-function-declaration"]
    return [*flags, *_setup_literal("X86_VARIANTS")["x86_avx512"][0]]


def _skip_unless_compilable(build: str, cc: str) -> None:
    if build.startswith("simde") and not _has_simde(cc):
        missing_tool("SIMDe headers not installed (Debian: libsimde-dev)")


def _skip_unless_runnable(build: str) -> None:
    if build == "simde-avx2" and not {"avx2", "fma", "f16c"} <= _cpu_flags():
        pytest.skip("the CPU lacks AVX2/FMA/F16C")
    if build.startswith("native") and not _runs_avx512():
        pytest.skip("the CPU (or OS) does not run AVX-512")


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    """build name -> object files of the reference and the avx512 variant, compiled once."""
    cc = _compiler()
    built: dict[str, list[Path]] = {}

    def get(build: str) -> list[Path]:
        if build not in built:
            _skip_unless_compilable(build, cc)
            out = tmp_path_factory.mktemp(build)
            sources = [
                SIMD / "common" / "numeric.c", SIMD / "common" / "types.c",
                *sorted((SIMD / "ref").glob("*.c")), *sorted(FOLDER.glob("*.c")),
            ]  # fmt: skip
            objs = []
            for src in sources:
                obj = out / f"{src.parent.name}_{src.stem}.o"
                cmd = [
                    cc,
                    *_build_flags(build),
                    f"-I{SIMD / 'include'}",
                    "-c",
                    str(src),
                    "-o",
                    str(obj),
                ]
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                assert done.returncode == 0, f"{src.name} ({build}):\n{done.stderr[-4000:]}"
                objs.append(obj)
            built[build] = objs
        return built[build]

    return cc, get


@pytest.mark.parametrize("driver", sorted(DRIVERS))
@pytest.mark.parametrize("build", list(BUILDS))
def test_check_driver(objects, tmp_path, build, driver):
    cc, get = objects
    source = DRIVERS[driver]
    if driver == "guard" and platform.system() not in ("Linux", "Darwin"):
        pytest.skip("guard pages need mmap")
    if source is None:
        source = tmp_path / f"check_{driver}.c"
        source.write_text(TILE_DRIVER)
    if not source.exists():
        pytest.skip(f"{source.name} is not in this checkout")
    _skip_unless_runnable(build)
    objs = get(build)
    exe = tmp_path / f"check_{driver}"
    cmd = [
        cc, *_build_flags(build), "-DEI_CHECK_INIT=ei_kernels_init_avx512", f"-I{SIMD / 'include'}",
        f"-I{SIMD / 'tests'}", str(source), *map(str, objs), "-o", str(exe), "-lm",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, check=False)
    out = run.stdout
    assert run.returncode == 0 and re.search(r"\b0 failed", out), out[-4000:]
    # the fallback is what an AVX-512 CPU without VNNI gets; the table's name says which (the
    # tile driver prints none: the other drivers check the same build's table)
    if driver == "tiles":
        return
    assert ("avx512 against" in out) == build.endswith("novnni"), out.splitlines()[0]


def test_fallback_kernels_contain_no_vnni(objects):
    """On AVX-512 CPUs without VNNI the table takes the functions without "vnni" in their
    name: none of them may contain vpdpbusd / vpdpwssd (the folder is compiled with
    -mavx512vnni, so the compiler could emit them anywhere). Compiling needs no AVX-512."""
    _, get = objects
    objdump = shutil.which("objdump")
    if not objdump:
        missing_tool("objdump not installed")
    offenders = []
    for obj in (o for o in get("native") if o.name.startswith("x86_avx512_")):
        listing = subprocess.run(
            [objdump, "-d", "--no-show-raw-insn", str(obj)],
            capture_output=True,
            text=True,
            check=True,
        )
        func = None
        for line in listing.stdout.splitlines():
            head = re.match(r"^[0-9a-f]+ <([^>]+)>:", line)
            if head:
                func = head.group(1)
            elif func and "vnni" not in func and re.search(r"\bvpdp(busd|wssd)s?\b", line):
                offenders.append(f"{obj.name}:{func}")
    assert not offenders, sorted(set(offenders))
