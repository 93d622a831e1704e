"""The avx512 variant against the scalar reference on any x86-64 CPU.

Most machines that build edgeinfer lack AVX-512 (the target laptops are AVX2-only), so the
variant's source is also compiled against SIMDe, which emulates each AVX-512 intrinsic with
narrower instructions (simd/x86_avx512/simd.h fills in the ones SIMDe lacks). Each
build links the C check drivers (tests/simd/check_kernels.c, tests/simd/check_edges.c, the
guard-page driver below and test_native_kernels' tile driver, which also checks gemm_x16)
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
    "guard": None,  # GUARD_DRIVER below, written out at test time
    "tiles": None,  # test_native_kernels.TILE_DRIVER (gemm and gemm_x16), likewise
}

# Rows that end right before an inaccessible page: the last row of the last tensor of a
# mapped file is followed by nothing, so no kernel may read past a row's end, however many
# blocks the row has and whatever the tile shape.
GUARD_DRIVER = r"""
#define _DEFAULT_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../common/ei_kernels.h"

void EI_CHECK_INIT(ei_kernels *k);

static int passed, failed;
static uint32_t rng = 12345;
static uint32_t next(void) { rng = rng * 1664525u + 1013904223u; return rng >> 8; }

/* n bytes ending at a PROT_NONE page */
static uint8_t *guarded(size_t n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), span = (n + page - 1) / page * page;
    uint8_t *m = mmap(NULL, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    mprotect(m + span, page, PROT_NONE);
    return m + span - n;
}

static void check(const char *what, int ok) {
    if (ok) { passed++; return; }
    failed++;
    printf("FAIL %s\n", what);
}

int main(void) {
    ei_kernels ref, var;
    ei_kernels_init_ref(&ref);
    EI_CHECK_INIT(&var);
    printf("guard pages for %s against %s\n", var.name, ref.name);
    static const int types[] = {EI_TYPE_Q4_0, EI_TYPE_Q4_1, EI_TYPE_Q5_0, EI_TYPE_Q5_1, EI_TYPE_Q8_0, EI_TYPE_Q2_K,
                                EI_TYPE_Q3_K, EI_TYPE_Q4_K, EI_TYPE_Q5_K, EI_TYPE_Q6_K, EI_TYPE_F16, EI_TYPE_BF16, EI_TYPE_F32};
    static const int counts[] = {1, 2, 3, 5, 7, 8, 9, 17};
    char what[128];
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            const int type = types[ti], pt = ei_partner_type(type);
            const int n = counts[ci] * (ei_block_size(type) == 1 ? 16 : ei_block_size(type));
            const size_t wrow = ei_row_size(type, n), arow = ei_row_size(pt, n);
            uint8_t *w = guarded(4 * wrow), *a = guarded(4 * arow);
            float *x = (float *)guarded(4 * sizeof(float) * (size_t)n), *back = (float *)guarded(sizeof(float) * (size_t)n);
            for (size_t i = 0; i < 4 * wrow; i++) w[i] = (uint8_t)next();
            for (int i = 0; i < 4 * n; i++) x[i] = (float)((int)(next() % 2001) - 1000) / 300.0f;
            /* sane scales: decode each row and quantize it back as its own type where possible */
            for (int r = 0; r < 4; r++) {
                if (!ref.from_float[type]) { /* a quantized type: small fp16 scales in every block */
                    const int bs = (int)ei_row_size(type, ei_block_size(type));
                    for (int b = 0; b < counts[ci]; b++) {
                        uint8_t *blk = w + (size_t)r * wrow + (size_t)b * bs;
                        const ei_f16 h = ei_fp32_to_fp16(0.01f);
                        if (type == EI_TYPE_Q2_K) { memcpy(blk + 80, &h, 2); memcpy(blk + 82, &h, 2); }
                        else if (type == EI_TYPE_Q3_K) memcpy(blk + 108, &h, 2);
                        else if (type == EI_TYPE_Q6_K) memcpy(blk + 208, &h, 2);
                        else {
                            memcpy(blk, &h, 2);
                            if (type == EI_TYPE_Q4_1 || type == EI_TYPE_Q5_1 || type == EI_TYPE_Q4_K || type == EI_TYPE_Q5_K) memcpy(blk + 2, &h, 2);
                        }
                    }
                } else {
                    ref.from_float[type](x + (size_t)r * n, w + (size_t)r * wrow, n);
                }
                var.from_float[pt](x + (size_t)r * n, a + (size_t)r * arow, n);
            }
            float *decoded = (float *)guarded(sizeof(float) * (size_t)n);
            var.to_float[type](w + 3 * wrow, back, n);
            ref.to_float[type](w + 3 * wrow, decoded, n);
            snprintf(what, sizeof(what), "to_float type %d n %d", type, n);
            check(what, memcmp(back, decoded, sizeof(float) * (size_t)n) == 0);
            float want[16];
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 4; c++) ref.vec_dot[type](n, &want[4 * c + r], w + (size_t)r * wrow, a + (size_t)c * arow);
            for (int r0 = 0; r0 < 4; r0++) {
                float got;
                var.vec_dot[type](n, &got, w + (size_t)r0 * wrow, a + 3 * arow);
                snprintf(what, sizeof(what), "vec_dot type %d n %d row %d", type, n, r0);
                check(what, memcmp(&got, &want[12 + r0], 4) == 0);
            }
            if (!var.gemm[type]) continue;
            for (int nr = 1; nr <= 4; nr++)
                for (int nc = 1; nc <= 4; nc++) { /* the tile's last row and column end at the guard */
                    float s[16];
                    var.gemm[type](n, nr, nc, s, 4, w + (size_t)(4 - nr) * wrow, wrow, a + (size_t)(4 - nc) * arow, arow);
                    int ok = 1;
                    for (int c = 0; c < nc; c++)
                        for (int r = 0; r < nr; r++) ok &= memcmp(&s[4 * c + r], &want[4 * (4 - nc + c) + 4 - nr + r], 4) == 0;
                    snprintf(what, sizeof(what), "gemm type %d n %d tile %dx%d", type, n, nr, nc);
                    check(what, ok);
                }
            if (!var.gemm_x16[type] || !ei_x16_size(type, n)) continue;
            /* rows 0..3 four times over, interleaved into a copy that ends at a guard, against
             * activations whose last row ends at theirs */
            uint8_t *rows16 = guarded(EI_X16 * wrow), *packed = guarded(ei_x16_size(type, n));
            for (int r = 0; r < EI_X16; r++) memcpy(rows16 + (size_t)r * wrow, w + (size_t)(r % 4) * wrow, wrow);
            ei_pack_x16(type, rows16, wrow, n, packed);
            for (int nc = 1; nc <= 4; nc++) {
                float s[4 * EI_X16];
                var.gemm_x16[type](n, nc, s, EI_X16, packed, a + (size_t)(4 - nc) * arow, arow);
                int ok = 1;
                for (int c = 0; c < nc; c++)
                    for (int r = 0; r < EI_X16; r++) ok &= memcmp(&s[EI_X16 * c + r], &want[4 * (4 - nc + c) + r % 4], 4) == 0;
                snprintf(what, sizeof(what), "gemm_x16 type %d n %d columns %d", type, n, nc);
                check(what, ok);
            }
        }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
"""  # noqa: E501 (C source, held to the style of simd/, not to the Python line length)

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
    if source is None:
        if driver == "guard" and platform.system() not in ("Linux", "Darwin"):
            pytest.skip("guard pages need mmap")
        source = tmp_path / f"check_{driver}.c"
        source.write_text(GUARD_DRIVER if driver == "guard" else TILE_DRIVER)
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
    # the fallback is what an AVX-512 CPU without VNNI gets; the table's name says which
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
