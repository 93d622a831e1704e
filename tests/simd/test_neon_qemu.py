"""NEON variants on aarch64, cross-compiled here and run under qemu-aarch64.

The native library is built for aarch64 by setup.py's own build (BuildNative, with
EDGEINFER_TARGET_ARCH=aarch64 and the cross compiler as CC), so every object is compiled with
the flags a real aarch64 install uses. From those objects:

- each NEON level's kernels run against the scalar reference (tests/simd/check_kernels.c and
  tests/simd/check_edges.c, which must print "0 failed"), under ``-cpu max`` and under the
  oldest CPU model that has the level's instructions (an instruction from a later level would
  stop the program with SIGILL there);
- the tile driver of test_native_kernels (every gemm tile shape, and the products of rows
  interleaved by 16, gemm_x16, with 1..4 activation rows on several block counts) against
  vec_dot and the interleaved layout's scalar reference, for each level;
- tests/simd/check_guard.c: rows, interleaved copies and activations that end at an
  inaccessible page, for each level;
- a static program calls the dispatcher on CPU models with and without dotprod and i8mm;
- the whole forward pass (tests/simd/engine_parity.c) gives the scalar logits bit for bit
  with every level;
- where clang is installed, each level built by clang passes the kernel check too.

CI installs gcc-aarch64-linux-gnu and qemu-user-static (.ci/run) and sets CI=1, so a missing
tool fails there (tests/simd/platform_gates.py); elsewhere the tests are skipped with the
missing tool's name.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simd.platform_gates import missing_tool
from tests.simd.test_native_kernels import TILE_DRIVER

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SIMD = ROOT / "simd"
HERE = Path(__file__).resolve().parent

# level -> (init function, variant name, oldest qemu CPU model with the level's instructions)
LEVELS = {
    0: ("ei_kernels_init_neon", "neon", "cortex-a53"),
    1: ("ei_kernels_init_neon_dotprod", "neon-dotprod", "cortex-a76"),
    2: ("ei_kernels_init_neon_i8mm", "neon-i8mm", "max"),
}
EM_AARCH64 = 183


def _need(names: list[str], package: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    missing_tool(f"{' or '.join(names)} not found (Debian package {package})")


@pytest.fixture(scope="module")
def cc() -> str:
    return _need(["aarch64-linux-gnu-gcc"], "gcc-aarch64-linux-gnu")


@pytest.fixture(scope="module")
def qemu() -> str:
    return _need(["qemu-aarch64", "qemu-aarch64-static"], "qemu-user-static")


def _run(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def _check(proc: subprocess.CompletedProcess, what: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{out[-4000:]}"
    return out


# setup.py's build, without setup() reading the project metadata: BuildNative compiles every
# group (base, neon0..2) with its flags and links the shared library.
_SETUP_BUILD = r"""
import runpy, sys
import setuptools
from setuptools import Distribution
setuptools.setup = lambda **kw: kw
ns = runpy.run_path("setup.py", run_name="edgeinfer_setup")
cmd = ns["BuildNative"](Distribution({"name": "edgeinfer", "ext_modules": ns["ext_modules"]}))
cmd.build_temp, cmd.build_lib = sys.argv[1], sys.argv[2]
cmd.ensure_finalized()
cmd.run()
print(cmd.get_ext_fullpath(ns["ext_modules"][0].name))
"""


def _setup_literals() -> dict:
    """GCC_BASE and NEON_LEVELS as setup.py states them."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id in ("GCC_BASE", "NEON_LEVELS"):
            found[target.id] = ast.literal_eval(node.value)
    return found


def _build_direct(cc: str, temp: Path, lib: Path) -> Path:
    """setup.py's aarch64 build by hand, for interpreters without setuptools."""
    lit = _setup_literals()
    levels = lit["NEON_LEVELS"].items()
    groups = [("base", ["common", "ref"], [f"-D{define}" for _, (_, _, define) in levels])]
    groups += [
        (f"neon{lv}", ["arm_neon"], [*gnu, f"-DEI_NEON_LEVEL={lv}"]) for lv, (gnu, _, _) in levels
    ]
    objects = []
    for tag, folders, flags in groups:
        for folder in folders:
            for src in sorted((SIMD / folder).glob("*.c")):
                obj = temp / tag / "simd" / folder / (src.stem + ".o")
                obj.parent.mkdir(parents=True, exist_ok=True)
                cmd = [cc, "-fPIC", *lit["GCC_BASE"], *flags, f"-I{SIMD / 'include'}", "-c"]
                cmd += [str(src), "-o", str(obj)]
                _check(_run(cmd), f"compiling {src.name} ({tag})")
                objects.append(str(obj))
    out = lib / "edgeinfer" / "_edgeinfer_native.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    _check(_run([cc, "-shared", *objects, "-lm", "-lpthread", "-o", str(out)]), "linking")
    return out


@pytest.fixture(scope="module")
def aarch64_build(cc, tmp_path_factory) -> dict:
    """The library built for aarch64, and its objects by group (base, neon0, neon1, neon2)."""
    out = tmp_path_factory.mktemp("aarch64")
    temp, lib = out / "temp", out / "lib"
    try:
        import setuptools  # noqa: F401 (only whether it is installed matters)
    except ImportError:
        library = _build_direct(cc, temp, lib)
    else:
        drop = ("CFLAGS", "CPPFLAGS", "LDFLAGS", "EDGEINFER_NO_NATIVE")  # host settings
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(CC=cc, LDSHARED=f"{cc} -shared", EDGEINFER_TARGET_ARCH="aarch64")
        cmd = [sys.executable, "-c", _SETUP_BUILD, str(temp), str(lib)]
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
        )
        library = Path(_check(proc, "setup.py build for aarch64").strip().splitlines()[-1])
    groups = {d.name: sorted(str(p) for p in d.rglob("*.o")) for d in temp.iterdir() if d.is_dir()}
    return {"library": library, "groups": groups}


def _link(cc: str, main: Path, out: Path, objects: list[str], defines: list[str]) -> Path:
    cmd = [cc, "-O2", "-std=c11", "-static", *defines, str(main), *objects, "-lm", "-lpthread"]
    cmd += ["-o", str(out)]
    _check(_run(cmd), f"building {main.name}")
    return out


def _variant_objects(build: dict, level: int) -> list[str]:
    """A level's objects and the ones its kernel check needs: numerics, types, the reference."""
    base = [
        o
        for o in build["groups"]["base"]
        if Path(o).parent.name == "ref" or Path(o).stem in ("numeric", "types")
    ]
    return base + build["groups"][f"neon{level}"]


def test_library_links_for_aarch64(aarch64_build, cc):
    library = aarch64_build["library"]
    header = library.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_AARCH64
    assert {"base", "neon0", "neon1", "neon2"} <= set(aarch64_build["groups"])
    nm = shutil.which(cc.replace("gcc", "nm"))
    if nm:
        symbols = _check(_run([nm, str(library)]), "nm")
        for init, _, _ in LEVELS.values():
            assert f" {init}\n" in symbols, f"{init} missing from the library"
        exported = _check(_run([nm, "-D", "--defined-only", str(library)]), "nm -D")
        assert " ei_isa_best\n" in exported and "ei_kernels_init" not in exported


def _check_level(
    cc, qemu, build, tmp_path, main: Path, level: int, cpu: str, *args: str
) -> None:  # fmt: skip
    init, name, _ = LEVELS[level]
    objects = _variant_objects(build, level)
    exe = _link(cc, main, tmp_path / f"{main.stem}{level}", objects, [f"-DEI_CHECK_INIT={init}"])
    out = _check(_run([qemu, "-cpu", cpu, str(exe), *args]), f"{main.name} for {name} on {cpu}")
    assert f" {name} against scalar" in out.splitlines()[0], out[:200]
    assert out.rstrip().endswith(" 0 failed"), out[-4000:]


# every level on the richest CPU model, and the lower levels on the oldest that can run them
RUNS = [(lv, "max") for lv in sorted(LEVELS)] + [
    (lv, LEVELS[lv][2]) for lv in sorted(LEVELS) if LEVELS[lv][2] != "max"
]


@pytest.mark.parametrize("level, cpu", RUNS)
def test_kernels_match_reference(cc, qemu, aarch64_build, tmp_path, level, cpu):
    # on the oldest model of a level every kernel runs once ("quick"): what it proves is that
    # none needs a newer instruction; the values are checked in full on "max"
    quick = () if cpu == "max" else ("quick",)
    _check_level(cc, qemu, aarch64_build, tmp_path, HERE / "check_kernels.c", level, cpu, *quick)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_edge_cases_match_reference(cc, qemu, aarch64_build, tmp_path, level):
    _check_level(cc, qemu, aarch64_build, tmp_path, HERE / "check_edges.c", level, "max")


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_guard_pages_match_reference(cc, qemu, aarch64_build, tmp_path, level):
    """No kernel of a level reads past rows, interleaved copies or activations that end at an
    inaccessible page (check_guard.c)."""
    _check_level(cc, qemu, aarch64_build, tmp_path, HERE / "check_guard.c", level, "max")


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_tiles_match_reference(cc, qemu, aarch64_build, tmp_path, level):
    """gemm tiles and gemm_x16 of each level: the x86 tile driver, cross-built, under qemu."""
    init, name, _ = LEVELS[level]
    driver = tmp_path / "tiles.c"
    header = SIMD / "common" / "ei_kernels.h"
    driver.write_text(TILE_DRIVER.replace('"../common/ei_kernels.h"', f'"{header}"'))
    objects = _variant_objects(aarch64_build, level)
    exe = _link(cc, driver, tmp_path / f"tiles{level}", objects, [f"-DEI_CHECK_INIT={init}"])
    out = _check(_run([qemu, "-cpu", "max", str(exe)]), f"tile driver for {name}")
    assert out.rstrip().endswith(" 0 failed"), out[-4000:]


@pytest.fixture(scope="module")
def dispatch_program(cc, aarch64_build, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dispatch") / "neon_dispatch"
    objects = [o for group in aarch64_build["groups"].values() for o in group]
    return _link(cc, HERE / "neon_dispatch.c", out, objects, [])


@pytest.mark.parametrize(
    "cpu, expected",
    [
        ("max", "neon-i8mm"),
        ("cortex-a76", "neon-dotprod"),
        ("neoverse-n1", "neon-dotprod"),
        ("cortex-a53", "neon"),
    ],
)
def test_dispatch_picks_best_supported(qemu, dispatch_program, cpu, expected):
    out = _check(_run([qemu, "-cpu", cpu, str(dispatch_program)]), f"dispatch on {cpu}")
    assert out.splitlines()[0] == f"best {expected}", out
    assert out.rstrip().endswith("ok"), out


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_kernels_match_reference_with_clang(qemu, tmp_path, level):
    """The same sources through clang (Android and macOS build with it), when it is here."""
    clang, lld = shutil.which("clang"), shutil.which("ld.lld")
    if not (clang and lld):
        pytest.skip("clang and ld.lld not found: the clang build is checked where they are")
    lit = _setup_literals()
    init, name, _ = LEVELS[level]
    sources = [HERE / "check_kernels.c", SIMD / "common" / "numeric.c"]
    sources += [SIMD / "common" / "types.c", *sorted((SIMD / "ref").glob("*.c"))]
    sources += sorted((SIMD / "arm_neon").glob("*.c"))
    exe = tmp_path / f"check_clang{level}"
    cmd = [clang, "--target=aarch64-linux-gnu", "-fuse-ld=lld", "-static", *lit["GCC_BASE"]]
    cmd += [*lit["NEON_LEVELS"][level][0], f"-DEI_NEON_LEVEL={level}", f"-DEI_CHECK_INIT={init}"]
    cmd += [*map(str, sources), "-lm", "-o", str(exe)]
    _check(_run(cmd), f"clang build of {name}")
    out = _check(_run([qemu, "-cpu", "max", str(exe)]), f"clang-built {name}")
    assert out.rstrip().endswith(" 0 failed"), out[-4000:]


def test_engine_logits_match_scalar(cc, qemu, aarch64_build, tmp_path):
    """The whole forward pass, every NEON level against scalar, bit for bit (-cpu max has all)."""
    objects = [o for group in aarch64_build["groups"].values() for o in group]
    exe = _link(cc, HERE / "engine_parity.c", tmp_path / "engine_parity", objects, [])
    out = _check(_run([qemu, "-cpu", "max", str(exe)]), "engine parity")
    # 3 levels x 16 runs: 2 models x 4 cache type pairs x 2 thread counts
    assert out.rstrip().endswith("48 passed, 0 failed"), out[-4000:]
