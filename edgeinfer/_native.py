"""The one place where Python meets the native core (simd/, built into _edgeinfer_native).

Every C signature is declared once in ``_SIGNATURES``; native status codes become typed
exceptions here; pointers never leave this module. The library reads the weights in place
from the memory map, which this module keeps alive for as long as an engine uses it.

The library is used only when it matches this module exactly: its API version, the size of
every struct mirrored here (``ei_struct_size``), the order of the layer tensors
(``ei_layer_tensor_name``, checked against :class:`edgeinfer.models.base.LayerTensors`) and
of the per-op profile's kinds (``ei_profile_kind_name``, against
:data:`edgeinfer.engines.base.PROFILE_KINDS`). Any
mismatch, or a missing file, leaves it unused with the reason in :func:`available` and the
file looked for in :func:`library_path_looked_for`: a struct read with the wrong layout would
corrupt memory. The library is looked for next to this module, or in the folder named by the
environment variable ``EDGEINFER_NATIVE_DIR`` (tests point it at an empty folder or at another
build; :func:`reset_for_tests` makes the next call look again).
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import importlib.machinery
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer import errors
from edgeinfer.engines import ENGINES
from edgeinfer.engines.base import PROFILE_KINDS, Batch, EngineProfile, OpTime, SequenceEngine
from edgeinfer.gguf import GGUFFile, TensorInfo
from edgeinfer.gguf.constants import GGMLType
from edgeinfer.gpu_offload import BUDGET_SOURCES, OffloadPlan
from edgeinfer.kv_cache import (
    BLOCK_SIZE,
    CACHE_TYPES,
    KIVI_GROUP,
    KIVI_RESIDUAL,
    WINDOW_SLACK,
    CacheLayout,
    CacheType,
    cache_type,
    check_kivi_options,
    layer_positions,
)
from edgeinfer.models.base import DecoderConfig, LayerTensors

ISA_NAMES = ("scalar", "avx2", "avx512", "neon", "neon-dotprod", "neon-i8mm")
API_VERSION = 16
NATIVE_DIR_ENV = "EDGEINFER_NATIVE_DIR"

c_int, c_int32, c_int64, c_float, c_size_t = (
    ctypes.c_int,
    ctypes.c_int32,
    ctypes.c_int64,
    ctypes.c_float,
    ctypes.c_size_t,
)
c_void_p, c_char_p = ctypes.c_void_p, ctypes.c_char_p


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("type", c_int32),
        ("layout", c_int32),
        ("ne0", c_int64),
        ("ne1", c_int64),
    ]


# the layer struct's tensors in LayerTensors' order; the library reports its own order
# (EI_LAYER_TENSORS in edgeinfer.h), which _load() compares with this one
_LAYER_TENSORS = tuple(f.name for f in dataclasses.fields(LayerTensors))


class LayerDesc(ctypes.Structure):
    _fields_ = [
        *[(name, Tensor) for name in _LAYER_TENSORS],
        ("window", c_int32), ("rope_base", c_float), ("rope_scale", c_float),
    ]  # fmt: skip


class ModelDesc(ctypes.Structure):
    _fields_ = [
        *[(n, c_int32) for n in ("n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv",
                                 "head_dim", "head_dim_v", "n_ff", "n_rot", "rope_neox",
                                 "act_gelu", "scale_q")],
        *[(n, c_float) for n in ("norm_eps", "embed_scale", "kq_scale", "final_softcap")],
        *[(n, Tensor) for n in ("tok_embd", "output_norm", "output", "rope_freqs")],
        ("layers", ctypes.POINTER(LayerDesc)),
    ]  # fmt: skip


class EngineParams(ctypes.Structure):
    _fields_ = [
        *[(n, c_int32)
          for n in ("n_ctx", "n_threads", "n_seq_max", "n_batch", "kv_type_k", "kv_type_v",
                    "kv_layout", "isa", "ring", "track_attention")],
        ("kv_budget", ctypes.c_int64),
        ("kivi_group", c_int32),
        ("kivi_residual", c_int32),
        ("release_weights", c_int32),
        ("fixed_threads", c_int32),
        ("n_gpu_layers", c_int32),
        ("gpu_device", c_int32),
    ]  # fmt: skip


class ProfileEntry(ctypes.Structure):
    _fields_ = [
        ("kind", c_int32), ("type", c_int32),
        *[(n, c_int64) for n in ("rows", "cols", "calls", "ns", "flops", "bytes")],
    ]  # fmt: skip


class VkDevice(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 256), ("driver_name", ctypes.c_char * 256),
        ("driver_info", ctypes.c_char * 256), ("type", c_int32),
        *[(n, ctypes.c_uint32)
          for n in ("api_version", "driver_version", "vendor_id", "device_id", "subgroup_size",
                    "subgroup_ops", "max_storage_buffer_range", "pad")],
        *[(n, ctypes.c_uint64)
          for n in ("max_allocation_bytes", "device_local_bytes", "budget_bytes")],
        *[(n, c_int32)
          for n in ("memory_budget", "fp16", "int8", "storage16", "integer_dot_product", "pad2")],
    ]  # fmt: skip


class GpuPlan(ctypes.Structure):
    _fields_ = [
        ("n_gpu_layers", c_int32), ("device", c_int32), ("budget_source", c_int32),
        ("pad", c_int32),
        *[(n, ctypes.c_uint64)
          for n in ("free_bytes", "margin_bytes", "weights_bytes", "cache_bytes", "buffer_bytes",
                    "held_bytes")],
        ("device_name", ctypes.c_char * 256), ("reason", ctypes.c_char * 256),
    ]  # fmt: skip


# ei_struct_size(which) -> the struct mirrored here, in the order of the C EI_STRUCT_* enum
_STRUCTS: tuple[type[ctypes.Structure], ...] = (
    Tensor, LayerDesc, ModelDesc, EngineParams, ProfileEntry, VkDevice, GpuPlan,
)  # fmt: skip

# cache element types the native attention reads and writes, as rows (CacheLayout.ROWS)
_NATIVE_CACHE_TYPES = frozenset({GGMLType.F16, GGMLType.F32, GGMLType.Q8_0, GGMLType.Q4_0})


_P = ctypes.POINTER
# ei_kernel_attn: isa, head dims, runs, types, row strides, scale, softcap, q, k, v, out
_ATTN_ARGS = (
    [c_int] * 4 + [c_void_p] + [c_int] * 2 + [c_size_t] * 2 + [c_float] * 2 + [c_void_p] * 4
)
_I64 = ctypes.c_int64
_VK_KERNEL_ARGS = [c_void_p, c_int, c_void_p, _I64, _I64, c_void_p, _I64, c_void_p]
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "ei_api_version": (c_int, []),
    "ei_last_error": (c_char_p, []),
    "ei_struct_size": (c_size_t, [c_int]),
    "ei_layer_tensor_name": (c_char_p, [c_int]),
    "ei_profile_kind_name": (c_char_p, [c_int]),
    "ei_isa_name": (c_char_p, [c_int]),
    "ei_isa_supported": (c_int, [c_int]),
    "ei_isa_reason": (c_char_p, [c_int]),
    "ei_isa_best": (c_int, []),
    "ei_cpu_features": (c_char_p, []),
    "ei_vk_devices": (c_int, [_P(VkDevice), c_int32, _P(c_int32)]),
    "ei_vk_open": (c_int, [c_int32, _P(c_void_p)]),
    "ei_vk_close": (None, [c_void_p]),
    "ei_vk_context_info": (
        c_int,
        [c_void_p, _P(VkDevice), _P(c_int32)] + [_P(ctypes.c_uint64)] * 3,
    ),
    # context, weight type, weight, rows, cols, input (x or row ids), n, output
    "ei_vk_kernel_gemm": (c_int, _VK_KERNEL_ARGS),
    "ei_vk_kernel_get_rows": (c_int, _VK_KERNEL_ARGS),
    "ei_vk_kernel_rms_norm": (c_int, [c_void_p, c_int32, c_int32] + [c_void_p] * 3 + [c_float]),
    "ei_vk_kernel_rope": (c_int, [c_void_p] + [c_int32] * 4 + [c_void_p, c_void_p, c_int32]),
    "ei_vk_kernel_glu": (c_int, [c_void_p, c_int32, c_int32] + [c_void_p] * 3),
    "ei_vk_kernel_op": (c_int, [c_void_p, c_int32, c_int32, c_void_p, c_void_p, c_float]),
    "ei_vk_kernel_hadamard": (c_int, [c_void_p, c_int32, c_int32, c_int32, c_void_p]),
    # context, type, n, width, x, rows, cache rows, row bytes, cache
    "ei_vk_kernel_set_rows": (
        c_int,
        [c_void_p, c_int32, c_int32, c_int32, c_void_p, c_void_p, c_int32, c_int64, c_void_p],
    ),
    # context, heads, KV heads, hd, hv, runs, types, row bytes, scale, softcap, q, k, v, out
    "ei_vk_kernel_attn": (
        c_int,
        [c_void_p]
        + [c_int32] * 5
        + [c_void_p, c_int32, c_int32, _I64, _I64, c_float, c_float]
        + [c_void_p, c_void_p, _I64, c_void_p, _I64, c_void_p],
    ),
    "ei_engine_create": (c_int, [_P(ModelDesc), _P(EngineParams), _P(c_void_p)]),
    "ei_engine_decode": (
        c_int,
        [c_void_p, c_int32, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p],
    ),
    "ei_engine_seq_clear": (c_int, [c_void_p, c_int32]),
    "ei_engine_seq_discard": (c_int, [c_void_p, c_int32, c_int32, c_int32, c_int32]),
    "ei_engine_seq_evict": (c_int, [c_void_p, c_int32, c_int32, c_void_p, c_int32]),
    "ei_engine_attention_scores": (c_int, [c_void_p, c_int32, c_int32, c_void_p]),
    "ei_engine_seq_fork": (c_int, [c_void_p, c_int32, c_int32, c_int32]),
    "ei_engine_seq_set_key": (c_int, [c_void_p, c_int32, c_int32, ctypes.c_uint64]),
    "ei_engine_seq_publish": (c_int, [c_void_p, c_int32, c_int32]),
    "ei_engine_seq_reuse": (c_int, [c_void_p, c_int32, c_int32, c_void_p, c_void_p]),
    "ei_engine_block_size": (c_int32, []),
    "ei_engine_block_positions": (c_int32, [c_void_p]),
    "ei_engine_pool_stats": (c_int32, [c_void_p, c_void_p, c_int32]),
    "ei_engine_row_bytes": (c_int, [c_void_p, _P(c_size_t), _P(c_size_t)]),
    "ei_engine_layer_rows": (c_int32, [c_void_p, c_int32]),
    "ei_engine_seq_rows": (
        c_int,
        [c_void_p, c_int32, c_int32, c_int32, c_int32, c_void_p, c_void_p, c_int32],
    ),
    "ei_engine_group_bytes": (c_int, [c_void_p, _P(c_size_t), _P(c_size_t)]),
    "ei_engine_layer_groups": (c_int32, [c_void_p, c_int32]),
    "ei_engine_seq_groups": (
        c_int,
        [c_void_p, c_int32, c_int32, c_int32, c_int32, c_void_p, c_void_p, c_int32],
    ),
    "ei_engine_seq_quantized": (c_int, [c_void_p, c_int32, _P(c_int32), c_int32]),
    "ei_engine_seq_key_shifts": (c_int, [c_void_p, c_int32, c_int32, c_void_p, c_int32]),
    "ei_engine_profile": (c_int, [c_void_p, c_int32]),
    "ei_engine_profile_read": (c_int, [c_void_p, _P(ProfileEntry), c_int32, _P(c_int32)]),
    "ei_engine_isa": (c_int, [c_void_p]),
    "ei_engine_threads": (c_int32, [c_void_p, c_int32]),
    "ei_engine_memory": (c_size_t, [c_void_p]),
    "ei_engine_gpu_plan": (c_int, [c_void_p, c_void_p]),
    "ei_engine_weight_copies": (c_size_t, [c_void_p]),
    "ei_engine_free": (None, [c_void_p]),
    "ei_kernel_from_float": (c_int, [c_int, c_int, c_void_p, c_void_p, c_int64]),
    "ei_kernel_to_float": (c_int, [c_int, c_int, c_void_p, c_void_p, c_int64]),
    "ei_kernel_vec_dot": (c_int, [c_int, c_int, c_int, c_void_p, c_void_p, c_void_p]),
    "ei_kernel_rms_norm": (c_int, [c_int, c_int, c_void_p, c_void_p, c_void_p, c_float]),
    "ei_kernel_rope": (c_int, [c_int, c_int, c_void_p, c_void_p, c_int]),
    "ei_kernel_glu": (c_int, [c_int, c_int, c_int, c_void_p, c_void_p, c_void_p]),
    "ei_kernel_softmax": (c_int, [c_int, c_int, c_void_p, c_void_p, c_void_p]),
    "ei_kernel_attn": (c_int, _ATTN_ARGS),
    "ei_kivi_k_block_size": (c_size_t, [c_int] * 3),
    "ei_kivi_v_row_size": (c_size_t, [c_int] * 3),
    # isa, bits, group, head dim, then the kernel's buffers and counts
    "ei_kernel_kivi_quantize_k": (c_int, [c_int] * 4 + [c_void_p, c_size_t, c_void_p]),
    "ei_kernel_kivi_k_dots": (c_int, [c_int] * 4 + [c_void_p, c_int, c_int, c_void_p, c_void_p]),
    "ei_kernel_kivi_quantize_v": (c_int, [c_int] * 4 + [c_void_p, c_void_p]),
    "ei_kernel_kivi_decode_v": (c_int, [c_int] * 4 + [c_void_p, c_size_t, c_int, c_void_p]),
    "ei_partner_type_of": (c_int, [c_int]),
}

_UNSUPPORTED = 3  # EI_ERR_UNSUPPORTED
_STATUS = {
    1: errors.InvalidOptionError,
    2: errors.OutOfMemoryError,
    _UNSUPPORTED: errors.UnsupportedModelError,
    4: errors.ContextOverflowError,
    5: errors.BackendError,
    6: errors.BackendError,  # EI_ERR_DEVICE: the GPU failed
}

_lib: ctypes.CDLL | None = None
_load_error: str | None = None
_looked_for: Path | None = None


def _library_dir() -> Path:
    override = os.environ.get(NATIVE_DIR_ENV)
    return Path(override) if override else Path(__file__).parent


def _library_path() -> Path:
    """The library file in the library folder, or the first name looked for if none exists."""
    folder = _library_dir()
    candidates = [folder / f"_edgeinfer_native{s}" for s in importlib.machinery.EXTENSION_SUFFIXES]
    return next((c for c in candidates if c.exists()), candidates[0])


def _mismatch(lib: ctypes.CDLL) -> str | None:
    """Why the loaded library does not match this module, or None when it does."""
    version = lib.ei_api_version()
    if version != API_VERSION:
        return f"it has API version {version}, this edgeinfer needs {API_VERSION}"
    if lib.ei_engine_block_size() != BLOCK_SIZE:
        return f"its KV blocks hold {lib.ei_engine_block_size()} positions, not {BLOCK_SIZE}"
    for which, struct in enumerate(_STRUCTS):
        native, mirrored = lib.ei_struct_size(which), ctypes.sizeof(struct)
        if native != mirrored:
            return f"its {struct.__name__} is {native} bytes, edgeinfer's mirror is {mirrored}"
    names: list[str] = []
    while (name := lib.ei_layer_tensor_name(len(names))) is not None:
        names.append(name.decode())
    if tuple(names) != _LAYER_TENSORS:
        return f"its layer tensors are {names}, edgeinfer's LayerTensors are {list(_LAYER_TENSORS)}"
    kinds: list[str] = []
    while (name := lib.ei_profile_kind_name(len(kinds))) is not None:
        kinds.append(name.decode())
    if tuple(kinds) != PROFILE_KINDS:
        return f"its profile kinds are {kinds}, edgeinfer's are {list(PROFILE_KINDS)}"
    return None


def _load() -> ctypes.CDLL | None:
    """The library, loaded and checked once (until :func:`reset_for_tests`); None when unusable."""
    global _lib, _load_error, _looked_for
    if _lib is not None or _load_error is not None:
        return _lib
    path = _looked_for = _library_path()
    if not path.exists():
        _load_error = f"the native library was not built: no {path.name} in {path.parent}"
        return None
    try:
        lib = ctypes.CDLL(str(path))
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except (OSError, AttributeError) as e:
        _load_error = f"the native library {path} does not load: {e}"
        return None
    why = _mismatch(lib)
    if why is not None:
        _load_error = f"the native library {path} is from another version of edgeinfer: {why}"
        return None
    _lib = lib
    return lib


def reset_for_tests() -> None:
    """Forgets the loaded library (and why it was refused), so the next call loads it again,
    from the folder :data:`NATIVE_DIR_ENV` names now. An engine still open keeps using the
    library it was made with."""
    global _lib, _load_error, _looked_for
    _lib, _load_error, _looked_for = None, None, None


def available() -> tuple[bool, str]:
    """Whether the native library can be used, and if not, precisely why."""
    lib = _load()
    return (lib is not None, _load_error or "loaded")


def library_path_looked_for() -> Path:
    """The library file that was loaded, or looked for when it was refused or missing."""
    _load()
    assert _looked_for is not None  # _load() always records where it looked
    return _looked_for


def library() -> ctypes.CDLL:
    lib = _load()
    if lib is None:
        raise errors.BackendError(f"native engine unavailable: {_load_error}")
    return lib


def native_cache_types() -> list[str]:
    """Names of the KV cache types (edgeinfer.kv_cache) the native engine supports."""
    return [n for n, t in CACHE_TYPES.items() if _native_cache_ok(t)]


def _native_cache_ok(t: CacheType) -> bool:
    return t.layout == CacheLayout.KIVI or (
        t.layout == CacheLayout.ROWS and t.ggml_type in _NATIVE_CACHE_TYPES
    )


def _native_cache_type(kv_type: str | CacheType, what: str = "kv_type") -> CacheType:
    t = cache_type(kv_type)
    if not _native_cache_ok(t):
        raise errors.InvalidOptionError(
            f"{what} {t.name} is not supported by the native engine "
            f"(one of {', '.join(native_cache_types())})"
        )
    return t


def check(status: int) -> None:
    if status != 0:
        message = library().ei_last_error().decode(errors="replace")
        raise _STATUS.get(status, errors.BackendError)(message)


def isa_report() -> list[dict[str, Any]]:
    """Every instruction-set variant: supported here or not, and why."""
    lib = library()
    best = lib.ei_isa_best()
    return [
        {
            "name": ISA_NAMES[i],
            "supported": bool(lib.ei_isa_supported(i)),
            "chosen": i == best,
            "reason": lib.ei_isa_reason(i).decode(),
        }
        for i in range(len(ISA_NAMES))
    ]


def cpu_features() -> str:
    return library().ei_cpu_features().decode()


VK_DEVICE_TYPES = ("other", "integrated GPU", "discrete GPU", "virtual GPU", "CPU")
VK_SUBGROUP_OPS = ("basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative",
                   "clustered", "quad")  # fmt: skip
VK_MAX_DEVICES = 16
_VK_LOCK = threading.Lock()


def _vk_version(v: int) -> str:
    return f"{(v >> 22) & 0x7F}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def _vk_device(d: VkDevice) -> dict[str, Any]:
    nvidia = d.vendor_id == 0x10DE  # NVIDIA numbers its drivers 10.8.8.6 bits
    driver = (
        f"{d.driver_version >> 22}.{(d.driver_version >> 14) & 0xFF}."
        f"{(d.driver_version >> 6) & 0xFF}.{d.driver_version & 0x3F}"
        if nvidia
        else _vk_version(d.driver_version)
    )
    return {
        "name": d.name.decode(errors="replace"),
        "type": VK_DEVICE_TYPES[d.type] if 0 <= d.type < len(VK_DEVICE_TYPES) else "other",
        "api_version": _vk_version(d.api_version),
        "driver": d.driver_name.decode(errors="replace"),
        "driver_info": d.driver_info.decode(errors="replace"),
        "driver_version": driver,
        "vendor_id": d.vendor_id,
        "device_id": d.device_id,
        "device_local_bytes": d.device_local_bytes,
        "budget_bytes": d.budget_bytes if d.memory_budget else None,
        "max_allocation_bytes": d.max_allocation_bytes,
        "max_storage_buffer_bytes": d.max_storage_buffer_range,
        "subgroup_size": d.subgroup_size,
        "subgroup_ops": [n for i, n in enumerate(VK_SUBGROUP_OPS) if d.subgroup_ops >> i & 1],
        "fp16": bool(d.fp16),
        "int8": bool(d.int8),
        "storage16": bool(d.storage16),
        "integer_dot_product": bool(d.integer_dot_product),
    }


def vulkan_devices() -> tuple[list[dict[str, Any]], str]:
    """The Vulkan devices, and why there are none ("" when there are). No loader or no driver
    is an answer ("no GPU"), not an error: libvulkan is opened at run time, never linked."""
    lib = library()
    out = (VkDevice * VK_MAX_DEVICES)()
    count = c_int32(0)
    with _VK_LOCK:  # the C side opens the loader once, unguarded
        status = lib.ei_vk_devices(out, VK_MAX_DEVICES, ctypes.byref(count))
    if status == _UNSUPPORTED:
        return [], lib.ei_last_error().decode(errors="replace")
    check(status)
    devices = [_vk_device(out[i]) for i in range(min(count.value, VK_MAX_DEVICES))]
    return devices, "" if devices else "the Vulkan loader lists no device"


class VulkanKernels:
    """A Vulkan compute context running single GPU kernels from host arrays, for tests and
    benchmarks. ``device`` -1 picks the first discrete GPU, else integrated, else the first.
    Raises UnsupportedModelError ("no GPU: ...") where there is no loader, driver or device."""

    def __init__(self, device: int = -1) -> None:
        self.lib = library()
        self._ctx = c_void_p()
        with _VK_LOCK:
            check(self.lib.ei_vk_open(device, ctypes.byref(self._ctx)))

    def info(self) -> dict[str, Any]:
        """The device as vulkan_devices() describes it, plus ``subgroups`` (the subgroup shader
        variants run), ``integer_dot`` (the products' packed int8 dot-product variants run),
        ``max_binding_bytes``, ``weight_part_bytes`` (the most one part of a split weight
        spans) and ``allocated_bytes`` (device memory held)."""
        d, sg = VkDevice(), c_int32()
        most, part, held = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        outs = [ctypes.byref(v) for v in (d, sg, most, part, held)]
        check(self.lib.ei_vk_context_info(self._live(), *outs))
        info = _vk_device(d)
        info.update(subgroups=bool(sg.value & 1), integer_dot=bool(sg.value & 2),
                    max_binding_bytes=most.value,
                    weight_part_bytes=part.value, allocated_bytes=held.value)  # fmt: skip
        return info

    def _live(self) -> ctypes.c_void_p:
        if not self._ctx:
            raise errors.InvalidOptionError("the Vulkan context is closed")
        return self._ctx

    def gemm(
        self, ggml_type: int, w: np.ndarray, rows: int, cols: int, x: np.ndarray
    ) -> np.ndarray:
        """x (n, cols) float32 times the (rows, cols) weight whose GGUF bytes are w -> (n, rows)."""
        w = np.ascontiguousarray(w, dtype=np.uint8)
        x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
        if x.shape[1] != cols:
            raise errors.InvalidOptionError(f"inputs of {x.shape[1]} values for rows of {cols}")
        y = np.zeros((x.shape[0], rows), dtype=np.float32)
        check(self.lib.ei_vk_kernel_gemm(
            self._live(), ggml_type, _ptr(w), rows, cols, _ptr(x), x.shape[0], _ptr(y)
        ))  # fmt: skip
        return y

    def get_rows(
        self, ggml_type: int, w: np.ndarray, rows: int, cols: int, ids: Sequence[int]
    ) -> np.ndarray:
        """The rows ``ids`` of the (rows, cols) weight whose GGUF bytes are w, decoded."""
        w = np.ascontiguousarray(w, dtype=np.uint8)
        idx = np.ascontiguousarray(ids, dtype=np.int32)
        y = np.zeros((idx.size, cols), dtype=np.float32)
        check(self.lib.ei_vk_kernel_get_rows(
            self._live(), ggml_type, _ptr(w), rows, cols, _ptr(idx), idx.size, _ptr(y)
        ))  # fmt: skip
        return y

    def rms_norm(self, x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
        """Each row of x (rows, n) normalised, times w (n,) when given."""
        x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
        y = np.empty_like(x)
        wp = _ptr(np.ascontiguousarray(w, dtype=np.float32)) if w is not None else None
        n, rows = x.shape[1], x.shape[0]
        check(self.lib.ei_vk_kernel_rms_norm(self._live(), n, rows, _ptr(y), _ptr(x), wp, eps))
        return y

    def rope(self, x: np.ndarray, cs: np.ndarray, neox: bool) -> np.ndarray:
        """x (n_tokens, n_heads, head_dim) with each token's first n_rot values of each head
        rotated by its (cos, sin) pairs cs (n_tokens, n_rot)."""
        y = np.array(x, dtype=np.float32, copy=True, order="C")
        cs = np.ascontiguousarray(cs, dtype=np.float32)
        n_tokens, n_heads, head_dim = y.shape
        check(self.lib.ei_vk_kernel_rope(
            self._live(), n_tokens, n_heads, head_dim, cs.shape[1], _ptr(y), _ptr(cs), int(neox)
        ))  # fmt: skip
        return y

    def glu(self, gelu: bool, g: np.ndarray, u: np.ndarray) -> np.ndarray:
        g, u = np.ascontiguousarray(g, dtype=np.float32), np.ascontiguousarray(u, dtype=np.float32)
        y = np.empty_like(g)
        check(self.lib.ei_vk_kernel_glu(self._live(), int(gelu), g.size, _ptr(y), _ptr(g), _ptr(u)))
        return y

    def op(
        self, name: str, y: np.ndarray, x: np.ndarray | None = None, s: float = 0.0
    ) -> np.ndarray:
        """``add`` (y + x), ``scale`` (y * s) or ``softcap`` (tanh(y / s) * s)."""
        out = np.array(y, dtype=np.float32, copy=True)
        xp = _ptr(np.ascontiguousarray(x, dtype=np.float32)) if x is not None else None
        op = ("add", "scale", "softcap").index(name)
        check(self.lib.ei_vk_kernel_op(self._live(), op, out.size, _ptr(out), xp, s))
        return out

    def hadamard(self, x: np.ndarray, block: int) -> np.ndarray:
        """Rows of x rotated in blocks of ``block`` values, as a quantized cache rotates them."""
        out = np.array(x, dtype=np.float32, copy=True, order="C")
        rows = out.reshape(-1, out.shape[-1])
        check(self.lib.ei_vk_kernel_hadamard(self._live(), rows.shape[0], rows.shape[1], block,
                                             _ptr(rows)))  # fmt: skip
        return out

    def set_rows(
        self, ggml_type: int, x: np.ndarray, rows: Sequence[int], cache: np.ndarray
    ) -> np.ndarray:
        """cache (n_rows, row bytes, uint8) with row rows[i] replaced by x[i] as the cache type
        stores it."""
        out = np.array(cache, dtype=np.uint8, copy=True, order="C")
        xs = np.ascontiguousarray(x, dtype=np.float32)
        ids = np.ascontiguousarray(rows, dtype=np.int32)
        check(self.lib.ei_vk_kernel_set_rows(
            self._live(), int(ggml_type), xs.shape[0], xs.shape[1], _ptr(xs), _ptr(ids),
            out.shape[0], out.shape[1], _ptr(out),
        ))  # fmt: skip
        return out

    def attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        runs: list[tuple[int, int]],
        scale: float,
        softcap: float,
        types: tuple[int, int],
        dims: tuple[int, int],
        n_head_kv: int,
    ) -> np.ndarray:
        """One token's query heads q (n_head, hd) over the runs (first row, rows) of the cache
        rows k and v ((T, bytes) uint8, n_head_kv heads of the given GGML types a row)."""
        q = np.ascontiguousarray(np.atleast_2d(q), dtype=np.float32)
        k, v = np.ascontiguousarray(k, dtype=np.uint8), np.ascontiguousarray(v, dtype=np.uint8)
        flat = np.ascontiguousarray(np.asarray(runs, dtype=np.int32).reshape(-1))
        (hd, hv), n_head = dims, q.shape[0]
        out = np.zeros((n_head, hv), dtype=np.float32)
        check(self.lib.ei_vk_kernel_attn(
            self._live(), n_head, n_head_kv, hd, hv, len(flat) // 2, _ptr(flat), types[0], types[1],
            k.shape[1], v.shape[1], scale, softcap, _ptr(q),
            _ptr(k), k.shape[0], _ptr(v), v.shape[0], _ptr(out),
        ))  # fmt: skip
        return out

    def close(self) -> None:
        if self._ctx:
            self.lib.ei_vk_close(self._ctx)
            self._ctx = c_void_p()

    def __enter__(self) -> VulkanKernels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def resolve_isa(name: str | None = None) -> int:
    """The variant to run: ``name``, else EDGEINFER_ISA, else the best one supported."""
    lib = library()
    name = name or os.environ.get("EDGEINFER_ISA") or None
    if name is None:
        return lib.ei_isa_best()
    if name not in ISA_NAMES:
        raise errors.InvalidOptionError(
            f"unknown instruction set {name!r} (one of {', '.join(ISA_NAMES)})"
        )
    isa = ISA_NAMES.index(name)
    if not lib.ei_isa_supported(isa):
        raise errors.BackendError(
            f"instruction set {name} is not available here: {lib.ei_isa_reason(isa).decode()}"
        )
    return isa


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _cache_type_of(rows: np.ndarray) -> int:
    """The GGML type of a cache held as a numpy array (-1 for a dtype with none)."""
    return {np.dtype(np.float16): int(GGMLType.F16), np.dtype(np.float32): int(GGMLType.F32)}.get(
        rows.dtype, -1
    )


def block_key(parent: int, tokens: Sequence[int]) -> int:
    """A full block's key: a hash of its parent block's key and its tokens (vLLM's automatic
    prefix caching), so that equal keys mean equal prefixes; never 0 (the pool's "none")."""
    h = hashlib.blake2b(digest_size=8, person=b"edgeinfer-kv")
    h.update(parent.to_bytes(8, "little"))
    h.update(np.asarray(tokens, dtype="<i4").tobytes())
    return int.from_bytes(h.digest(), "little") or 1


def block_keys(tokens: Sequence[int], block: int = BLOCK_SIZE) -> list[int]:
    """The keys of the full blocks of ``block`` positions of ``tokens``, in order."""
    keys: list[int] = []
    for start in range(0, len(tokens) - block + 1, block):
        keys.append(block_key(keys[-1] if keys else 0, tokens[start : start + block]))
    return keys


class NativeEngine(SequenceEngine):
    """The native engine (simd/): up to ``n_seq_max`` sequences, each with its KV cache."""

    spec = ENGINES["native"]

    def __init__(
        self, gguf: GGUFFile, cfg: DecoderConfig, n_ctx: int, *, n_threads: int,
        cache_type_k: str | CacheType = "f16", cache_type_v: str | CacheType = "f16",
        isa: str | None = None, n_batch: int = 512, n_seq_max: int = 1, swa_full: bool = False,
        kv_budget: int = 0, track_attention: bool = False, kivi_group: int = KIVI_GROUP,
        kivi_residual: int = KIVI_RESIDUAL, fixed_threads: bool = False, n_gpu_layers: int = 0,
        gpu_device: int = -1,
    ) -> None:  # fmt: skip
        super().__init__(n_ctx, cfg.n_vocab, n_seq_max)
        self._handle: ctypes.c_void_p | None = None
        self._map: np.ndarray | None = None
        lib = library()
        kt = _native_cache_type(cache_type_k, "cache_type_k")
        vt = _native_cache_type(cache_type_v, "cache_type_v")
        kivi_layout = check_kivi_options(kt, vt, kivi_group, kivi_residual)
        self.cache_type_k, self.cache_type_v = kt.name, vt.name
        self.kivi = (kivi_group, kivi_residual) if kivi_layout else None
        self.cfg = cfg
        self._map = np.frombuffer(gguf.buffer(), dtype=np.uint8)  # keeps the map alive
        base = _ptr(self._map)

        def tensor(name: str | None) -> Tensor:
            if not name:
                return Tensor()
            info: TensorInfo = gguf.tensors[name]
            ne1 = info.shape[1] if len(info.shape) > 1 else 1
            return Tensor(base + info.offset, int(info.ggml_type), 0, info.shape[0], ne1)

        self._layers = (LayerDesc * cfg.n_layer)()
        for il, lt in enumerate(cfg.layers):
            desc = self._layers[il]
            for field in _LAYER_TENSORS:
                setattr(desc, field, tensor(getattr(lt, field)))
            desc.window = cfg.layer_window(il)
            desc.rope_base = cfg.layer_rope_base(il)
            desc.rope_scale = cfg.layer_rope_scale(il)
        m = ModelDesc(
            n_vocab=cfg.n_vocab, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head,
            n_head_kv=cfg.n_head_kv, head_dim=cfg.head_dim, head_dim_v=cfg.head_dim_v,
            n_ff=cfg.n_ff, n_rot=cfg.n_rot, rope_neox=int(cfg.rope_neox),
            act_gelu=int(cfg.activation == "gelu"), scale_q=int(cfg.scale_q),
            norm_eps=cfg.norm_eps, embed_scale=cfg.embed_scale, kq_scale=cfg.kq_scale,
            final_softcap=cfg.final_logit_softcap, tok_embd=tensor("token_embd.weight"),
            output_norm=tensor("output_norm.weight"), output=tensor(cfg.output_tensor),
            rope_freqs=tensor(cfg.rope_freqs_tensor), layers=self._layers,
        )  # fmt: skip
        params = EngineParams(
            n_ctx=n_ctx, n_threads=n_threads, n_seq_max=n_seq_max, n_batch=n_batch,
            kv_type_k=kt.bits if kivi_layout else int(kt.ggml_type),
            kv_type_v=vt.bits if kivi_layout else int(vt.ggml_type), kv_layout=int(kt.layout),
            isa=resolve_isa(isa), ring=int(not swa_full), kv_budget=kv_budget,
            track_attention=int(track_attention), kivi_group=kivi_group,
            kivi_residual=kivi_residual, release_weights=1,  # the file's read-only map
            fixed_threads=int(fixed_threads), n_gpu_layers=n_gpu_layers, gpu_device=gpu_device,
        )  # fmt: skip
        handle = c_void_p()
        check(lib.ei_engine_create(ctypes.byref(m), ctypes.byref(params), ctypes.byref(handle)))
        self._handle = handle
        self.tracks_attention = track_attention
        self._isa = ISA_NAMES[lib.ei_engine_isa(handle)]
        self.n_batch = n_batch
        self.block_size = int(lib.ei_engine_block_positions(handle))
        if kivi_layout:  # its f16 residual is a ring: a deeper rewind evaluates again (what
            # a drop keeps is held as quantized groups or residual rows: no window to keep)
            self.ring_slack = WINDOW_SLACK
        rings = [  # the windows of the layers that release blocks behind them (kv_pool.h)
            w for w in map(cfg.layer_window, range(cfg.n_layer))
            if layer_positions(n_ctx, w, n_batch, not swa_full) < n_ctx
        ]  # fmt: skip
        if rings:
            self.ring_slack = WINDOW_SLACK  # they keep EI_KV_SLACK positions behind the window
            self.ring_window = max([*rings, self.ring_window])
        # per sequence: its tokens, the keys of its full blocks, and whether it may key more
        self._tokens: list[list[int]] = [[] for _ in range(n_seq_max)]
        self._keys: list[list[int]] = [[] for _ in range(n_seq_max)]
        self._unkeyed: set[int] = set()

    @property
    def isa(self) -> str:
        return self._isa

    def threads(self, n_tokens: int = 1) -> int | None:
        """The threads a step of ``n_tokens`` tokens runs on now: all of them, or fewer while
        decoding steps run faster so (another program holds a core)."""
        return int(library().ei_engine_threads(self._handle, n_tokens)) if self._handle else 0

    @property
    def gpu_plan(self) -> OffloadPlan:
        """What layer offload put on the Vulkan device (n_gpu_layers), and why."""
        if not self._handle:
            raise errors.ModelClosedError("the engine is closed")
        p = GpuPlan()
        check(library().ei_engine_gpu_plan(self._handle, ctypes.byref(p)))
        return OffloadPlan(
            n_gpu_layers=p.n_gpu_layers, n_layer=self.cfg.n_layer,
            device=p.device if p.device >= 0 else None,
            device_name=p.device_name.decode(errors="replace"),
            budget_source=BUDGET_SOURCES[p.budget_source], free_bytes=p.free_bytes,
            margin_bytes=p.margin_bytes, weights_bytes=p.weights_bytes, cache_bytes=p.cache_bytes,
            buffer_bytes=p.buffer_bytes, held_bytes=p.held_bytes,
            reason=p.reason.decode(errors="replace"),
        )  # fmt: skip

    @property
    def memory_bytes(self) -> int:
        """Bytes the engine allocated (buffers and the KV cache reserved so far)."""
        return int(library().ei_engine_memory(self._handle)) if self._handle else 0

    @property
    def weight_copy_bytes(self) -> int:
        """Of memory_bytes, the interleaved copies of weights: reserved at load, written by the
        first step using each weight, whose file pages are then released (the copies replace
        rather than add to the mapping)."""
        return int(library().ei_engine_weight_copies(self._handle)) if self._handle else 0

    @property
    def committed_bytes(self) -> int:
        """memory_bytes, and the whole budget of the KV pool, whose slabs are allocated as
        sequences fill (at load none are: memory_bytes then holds only the pool's tables)."""
        if not self._handle:
            return 0
        groups = self.pool_stats()["groups"]
        return self.memory_bytes + sum(g["blocks"] * g["block_bytes"] for g in groups)

    def _check_open(self) -> None:
        if not self._handle:
            raise errors.ModelClosedError("the engine is closed")

    def set_length(self, n: int, seq: int = 0) -> None:
        super().set_length(n, seq)
        # a restored sequence's blocks get no keys: their rows came from a state file
        self._tokens[seq], self._keys[seq] = [], []
        self._unkeyed.add(seq)

    def truncate(self, n_keep: int, seq: int = 0) -> None:
        super().truncate(n_keep, seq)
        n = self._lengths[seq]
        self._tokens[seq] = self._tokens[seq][:n]
        if self._handle:
            self._forget_keys(seq, n // self.block_size, len(self._keys[seq]))
        self._keys[seq] = self._keys[seq][: n // self.block_size]
        if n == 0:
            self._unkeyed.discard(seq)

    def _run(self, batch: Batch) -> np.ndarray:
        tokens, pos, seq = (
            np.ascontiguousarray(a, dtype=np.int32)
            for a in (batch.tokens, batch.positions, batch.seqs)
        )  # (n,) each
        mask = np.ascontiguousarray(batch.want, dtype=np.int8)
        logits = np.empty((int(mask.sum()), self.cfg.n_vocab), dtype=np.float32)
        keys = self._new_keys(batch)
        lib = library()
        try:
            check(lib.ei_engine_decode(
                self._handle, len(tokens), _ptr(tokens), _ptr(pos), _ptr(seq), _ptr(mask),
                _ptr(logits),
            ))  # fmt: skip
        except BaseException:
            for s, k in keys.items():
                self._forget_keys(s, len(self._keys[s]), len(k))
            raise
        for s, tok in zip(batch.seqs.tolist(), batch.tokens.tolist(), strict=True):
            self._tokens[s].append(tok)
        for s, k in keys.items():
            self._keys[s] = k
            check(lib.ei_engine_seq_publish(self._handle, s, len(k)))
        return logits

    def _clear(self, seq: int) -> None:
        self._check_open()
        check(library().ei_engine_seq_clear(self._handle, seq))
        self._tokens[seq], self._keys[seq] = [], []
        self._unkeyed.discard(seq)

    can_track_attention = True

    def _evict(self, seq: int, runs: list[tuple[int, int]], n_past: int) -> None:
        flat = np.ascontiguousarray(np.asarray(runs, dtype=np.int32).reshape(-1))
        check(library().ei_engine_seq_evict(self._handle, seq, len(runs), _ptr(flat), n_past))
        # the moved blocks hold rotated keys, not what evaluating their tokens gives: no block
        # of this sequence gets a key again until it is cleared
        start = runs[0][0]
        self._forget_keys(seq, start // self.block_size, len(self._keys[seq]))
        self._keys[seq] = self._keys[seq][: start // self.block_size]
        self._unkeyed.add(seq)

    def _attention_scores(self, seq: int) -> np.ndarray:
        out = np.zeros(self.seq_length(seq), dtype=np.int64)
        check(library().ei_engine_attention_scores(self._handle, seq, len(out), _ptr(out)))
        return out

    # --- the block pool: prefixes shared between sequences ---------------------------------

    def fork(self, src: int, dst: int, n: int | None = None) -> None:
        """Sequence ``dst`` (forgotten first) shares the first ``n`` positions of ``src``
        (all by default): their blocks are held once and copied only where one writes."""
        self._check_open()
        n = self.seq_length(src) if n is None else n
        self._check_seq(dst)
        if dst == src or not 0 <= n <= self.seq_length(src):
            raise errors.InvalidOptionError(
                f"cannot fork {n} positions of sequence {src} (holding {self.seq_length(src)}) "
                f"into sequence {dst}"
            )
        check(library().ei_engine_seq_fork(self._handle, src, dst, n))
        self._lengths[dst] = self._highs[dst] = n
        self._tokens[dst] = self._tokens[src][:n]
        self._keys[dst] = self._keys[src][: n // self.block_size]
        # a source that dropped positions holds moved rows: neither sequence keys blocks again
        if src in self._unkeyed:
            self._unkeyed.add(dst)
        else:
            self._unkeyed.discard(dst)

    def reuse(self, seq: int, tokens: Sequence[int]) -> int:
        """Sequence ``seq`` (forgotten first) takes the cached blocks of the longest prefix of
        ``tokens`` the pool holds, leaving one token at least to evaluate; returns the positions
        it holds then (a multiple of the block size)."""
        self._check_open()
        self._check_seq(seq)
        ids = [int(t) for t in tokens]
        b = self.block_size
        keys = block_keys(ids[: (len(ids) - 1) // b * b], b)
        arr = np.ascontiguousarray(keys, dtype=np.uint64)
        got = ctypes.c_int32()
        check(library().ei_engine_seq_reuse(
            self._handle, seq, len(keys), _ptr(arr), ctypes.byref(got)
        ))  # fmt: skip
        n = got.value
        self._lengths[seq] = self._highs[seq] = n
        self._tokens[seq], self._keys[seq] = ids[:n], keys[: n // self.block_size]
        self._unkeyed.discard(seq)
        return n

    def pool_stats(self) -> dict[str, Any]:
        """The block pool: per layer group (a window, 0 for full attention) its blocks, those
        used by a sequence, cached (a prefix no sequence holds, kept for reuse) and free; and
        the prefix lookups and hits (in blocks) since the engine was made."""
        self._check_open()
        out = np.zeros(3 + 6 * 4, dtype=np.int64)
        library().ei_engine_pool_stats(self._handle, _ptr(out), len(out))
        groups = [
            dict(zip(("window", "blocks", "used", "cached", "free", "block_bytes"),
                     map(int, out[3 + 6 * g : 9 + 6 * g]), strict=True))
            for g in range(int(out[0]))
        ]  # fmt: skip
        lookups, hits = int(out[1]), int(out[2])
        return {
            "block_size": self.block_size, "groups": groups, "lookups": lookups, "hits": hits,
            "hit_rate": hits / lookups if lookups else 0.0,
            "used": sum(g["used"] for g in groups), "cached": sum(g["cached"] for g in groups),
            "free": sum(g["free"] for g in groups),
        }  # fmt: skip

    def _new_keys(self, batch: Batch) -> dict[int, list[int]]:
        """The keys of the blocks ``batch`` fills, per sequence that fills one (all its keys),
        given to the pool before the step (a sliding-window layer may let a block go during
        the step itself). Only the tokens after the last full block are looked at."""
        lib, out = library(), {}
        for seq in sorted(set(batch.seqs.tolist()) - self._unkeyed):
            keys = self._keys[seq]
            tail = self._tokens[seq][len(keys) * self.block_size :]
            tail += batch.tokens[batch.seqs == seq].tolist()
            if len(tail) < self.block_size:
                continue
            keys, b = list(keys), self.block_size
            for start in range(0, len(tail) - b + 1, b):
                keys.append(block_key(keys[-1] if keys else 0, tail[start : start + b]))
                check(lib.ei_engine_seq_set_key(self._handle, seq, len(keys) - 1, keys[-1]))
            out[seq] = keys
        return out

    def _forget_keys(self, seq: int, first: int, last: int) -> None:
        """Blocks [first, last) of ``seq`` lose the keys given for them (their rows change)."""
        lib = library()
        for index in range(first, last):
            check(lib.ei_engine_seq_set_key(self._handle, seq, index, 0))

    can_profile = True

    def set_profiling(self, on: bool) -> None:
        self._check_open()
        check(library().ei_engine_profile(self._handle, int(on)))

    def profile(self) -> EngineProfile:
        self._check_open()
        lib, n = library(), c_int32()
        check(lib.ei_engine_profile_read(self._handle, None, 0, ctypes.byref(n)))
        rows = (ProfileEntry * max(n.value, 1))()
        check(lib.ei_engine_profile_read(self._handle, rows, n.value, ctypes.byref(n)))
        ops, calls, ns = [], 0, 0
        for r in rows[: n.value]:
            if PROFILE_KINDS[r.kind] == "call":
                calls, ns = int(r.calls), int(r.ns)
                continue
            ops.append(OpTime(
                PROFILE_KINDS[r.kind], int(r.type) if r.type >= 0 else None, int(r.rows),
                int(r.cols), int(r.calls), int(r.ns), int(r.flops), int(r.bytes),
            ))  # fmt: skip
        return EngineProfile(tuple(ops), calls, ns)

    can_save_rows = True

    def cache_row_bytes(self) -> tuple[int, int]:
        self._check_open()
        k, v = c_size_t(), c_size_t()
        check(library().ei_engine_row_bytes(self._handle, ctypes.byref(k), ctypes.byref(v)))
        return int(k.value), int(v.value)

    def layer_rows(self, layer: int) -> int:
        self._check_open()
        rows = int(library().ei_engine_layer_rows(self._handle, layer))
        if rows < 0:
            raise errors.InvalidOptionError(f"no layer {layer} in {self.cfg.n_layer}")
        return rows

    def _read_rows(self, seq: int, layer: int, pos0: int, n: int) -> tuple[bytes, bytes]:
        sizes = self.cache_row_bytes()
        return self._copy_out(library().ei_engine_seq_rows, sizes, seq, layer, pos0, n)

    def _write_rows(self, seq: int, layer: int, pos0: int, n: int, k: bytes, v: bytes) -> None:
        self._copy_in(library().ei_engine_seq_rows, seq, layer, pos0, n, k, v)

    def _copy_out(
        self, copy: Any, sizes: tuple[int, int], seq: int, layer: int, first: int, n: int
    ) -> tuple[bytes, bytes]:
        """n rows (or groups) of ``layer`` from ``first`` on, through ``copy``, the C entry
        point that copies them (ei_engine_seq_rows or ei_engine_seq_groups)."""
        k = np.empty(n * sizes[0], dtype=np.uint8)  # (n, key bytes)
        v = np.empty(n * sizes[1], dtype=np.uint8)  # (n, value bytes)
        check(copy(self._handle, seq, layer, first, n, _ptr(k), _ptr(v), 0))
        return k.tobytes(), v.tobytes()

    def _copy_in(
        self, copy: Any, seq: int, layer: int, first: int, n: int, k: bytes, v: bytes
    ) -> None:
        ka = np.frombuffer(k, dtype=np.uint8).copy()  # (n, key bytes): C may read the pointer
        va = np.frombuffer(v, dtype=np.uint8).copy()  # (n, value bytes)
        check(copy(self._handle, seq, layer, first, n, _ptr(ka), _ptr(va), 1))

    def _group_bytes(self) -> tuple[int, int]:
        self._check_open()
        k, v = c_size_t(), c_size_t()
        check(library().ei_engine_group_bytes(self._handle, ctypes.byref(k), ctypes.byref(v)))
        return int(k.value), int(v.value)

    def _layer_groups(self, layer: int) -> int:
        return int(library().ei_engine_layer_groups(self._handle, layer))

    def _quantized_groups(self, seq: int) -> int:
        self._check_open()
        n = c_int32()
        check(library().ei_engine_seq_quantized(self._handle, seq, ctypes.byref(n), 0))
        return int(n.value)

    def _read_groups(self, seq: int, layer: int, g0: int, n: int) -> tuple[bytes, bytes]:
        sizes = self._group_bytes()
        return self._copy_out(library().ei_engine_seq_groups, sizes, seq, layer, g0, n)

    def _write_groups(self, seq: int, layer: int, g0: int, n: int, k: bytes, v: bytes) -> None:
        self._copy_in(library().ei_engine_seq_groups, seq, layer, g0, n, k, v)

    def _set_quantized_groups(self, seq: int, n: int) -> None:
        self._check_open()
        check(library().ei_engine_seq_quantized(self._handle, seq, ctypes.byref(c_int32(n)), 1))

    def _key_shifts(self, seq: int) -> np.ndarray:
        out = np.zeros(self.seq_length(seq), dtype=np.int32)  # (n_past)
        check(library().ei_engine_seq_key_shifts(self._handle, seq, len(out), _ptr(out), 0))
        return out

    def _set_key_shifts(self, seq: int, shifts: np.ndarray) -> None:
        arr = np.ascontiguousarray(shifts, dtype=np.int32)  # (n) C reads the pointer
        check(library().ei_engine_seq_key_shifts(self._handle, seq, len(arr), _ptr(arr), 1))

    def close(self) -> None:
        if self._handle:
            library().ei_engine_free(self._handle)
            self._handle = None
            self._map = None

    def __del__(self) -> None:
        try:  # noqa: SIM105 (not contextlib.suppress: at interpreter exit module globals may be gone)
            self.close()
        except Exception:
            pass


class Kernels:
    """Single kernels of one instruction set, for tests and benchmarks."""

    def __init__(self, isa: str) -> None:
        self.lib = library()
        self.isa = ISA_NAMES.index(isa)
        if not self.lib.ei_isa_supported(self.isa):
            raise errors.BackendError(
                f"{isa} is not available: {self.lib.ei_isa_reason(self.isa).decode()}"
            )

    def partner_type(self, weight_type: int) -> int:
        return self.lib.ei_partner_type_of(weight_type)

    def from_float(self, partner_type: int, x: np.ndarray, nbytes: int) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros(nbytes, dtype=np.uint8)
        check(self.lib.ei_kernel_from_float(self.isa, partner_type, _ptr(x), _ptr(out), x.size))
        return out

    def to_float(self, ggml_type: int, raw: np.ndarray, n: int) -> np.ndarray:
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        out = np.zeros(n, dtype=np.float32)
        check(self.lib.ei_kernel_to_float(self.isa, ggml_type, _ptr(raw), _ptr(out), n))
        return out

    def vec_dot(self, weight_type: int, n: int, x: np.ndarray, y: np.ndarray) -> float:
        x, y = np.ascontiguousarray(x, dtype=np.uint8), np.ascontiguousarray(y, dtype=np.uint8)
        out = np.zeros(1, dtype=np.float32)
        check(self.lib.ei_kernel_vec_dot(self.isa, weight_type, n, _ptr(x), _ptr(y), _ptr(out)))
        return float(out[0])

    def rms_norm(self, x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty_like(x)
        wp = _ptr(np.ascontiguousarray(w, dtype=np.float32)) if w is not None else None
        check(self.lib.ei_kernel_rms_norm(self.isa, x.size, _ptr(y), _ptr(x), wp, eps))
        return y

    def rope(self, x: np.ndarray, cs: np.ndarray, neox: bool) -> np.ndarray:
        y = np.array(x, dtype=np.float32, copy=True)
        cs = np.ascontiguousarray(cs, dtype=np.float32)
        check(self.lib.ei_kernel_rope(self.isa, 2 * (cs.size // 2), _ptr(y), _ptr(cs), int(neox)))
        return y

    def glu(self, gelu: bool, g: np.ndarray, u: np.ndarray) -> np.ndarray:
        g, u = np.ascontiguousarray(g, dtype=np.float32), np.ascontiguousarray(u, dtype=np.float32)
        y = np.empty_like(g)
        check(self.lib.ei_kernel_glu(self.isa, int(gelu), g.size, _ptr(y), _ptr(g), _ptr(u)))
        return y

    def softmax(self, scores: np.ndarray) -> tuple[np.ndarray, float]:
        """Attention's softmax weights exp(scores - max) in float64, unnormalised, and their
        sum in the kernels' order."""
        x = np.ascontiguousarray(scores, dtype=np.float32)
        w = np.empty(x.size, dtype=np.float64)
        total = ctypes.c_double()
        check(self.lib.ei_kernel_softmax(self.isa, x.size, _ptr(x), _ptr(w), ctypes.byref(total)))
        return w, total.value

    def attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        runs: list[tuple[int, int]],
        scale: float,
        softcap: float = 0.0,
        types: tuple[int, int] | None = None,
        dims: tuple[int, int] | None = None,
    ) -> np.ndarray:
        """q (head_dim,) against the rows [start, start + length) of each run of k and v.

        k and v are (T, head_dim) float16 or float32 arrays (rows of GGML F16 or F32; another
        dtype is passed as its type and refused natively), or with ``types`` (GGML types of K
        and V) and ``dims`` (head_dim, head_dim_v) (T, row bytes) uint8 rows of those types."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)
        kt, vt = types if types else (_cache_type_of(k), _cache_type_of(v))
        hd, hv = dims if dims else (k.shape[1], v.shape[1])
        flat = np.ascontiguousarray(np.asarray(runs, dtype=np.int32).reshape(-1))
        out = np.zeros(hv, dtype=np.float32)
        check(self.lib.ei_kernel_attn(
            self.isa, hd, hv, len(flat) // 2, _ptr(flat), kt, vt, k.strides[0], v.strides[0],
            scale, softcap, _ptr(q), _ptr(k), _ptr(v), _ptr(out),
        ))  # fmt: skip
        return out

    # --- KIVI cache kernels (simd/common/kivi.h; edgeinfer.kivi is their numpy oracle) ----

    def kivi_k_block_bytes(self, bits: int, group: int, hd: int) -> int:
        """Bytes of a K group block as the library counts them (0: no such format)."""
        return int(self.lib.ei_kivi_k_block_size(bits, group, hd))

    def kivi_v_row_bytes(self, bits: int, group: int, hdv: int) -> int:
        """Bytes of a V row as the library counts them (0: no such format)."""
        return int(self.lib.ei_kivi_v_row_size(bits, group, hdv))

    def kivi_quantize_k(self, bits: int, rows: np.ndarray, hd: int | None = None) -> np.ndarray:
        """The K group block of ``rows`` (G, >= hd) float16, rows as far apart as the array's
        row stride (a view of wider rows passes its stride); hd defaults to the row width."""
        if rows.dtype != np.float16 or rows.ndim != 2 or rows.strides[1] != 2:
            raise errors.InvalidOptionError("KIVI keys are (G, hd) float16 rows of unit stride")
        group, hd = rows.shape[0], rows.shape[1] if hd is None else hd
        if hd > rows.shape[1]:
            raise errors.InvalidOptionError(f"rows of {rows.shape[1]} keys hold no head of {hd}")
        out = np.zeros(max(self.kivi_k_block_bytes(bits, group, hd), 1), dtype=np.uint8)
        check(self.lib.ei_kernel_kivi_quantize_k(
            self.isa, bits, group, hd, _ptr(rows), rows.strides[0], _ptr(out)
        ))  # fmt: skip
        return out

    def kivi_k_dots(
        self, bits: int, group: int, hd: int, block: np.ndarray, q: np.ndarray, t0: int = 0,
        n: int | None = None,
    ) -> np.ndarray:  # fmt: skip
        """The raw dots of query q (hd,) with tokens [t0, t0 + n) of a K block (uint8)."""
        block = np.ascontiguousarray(block, dtype=np.uint8)
        q = np.ascontiguousarray(q, dtype=np.float32)
        if block.size < self.kivi_k_block_bytes(bits, group, hd) or q.size < hd:
            raise errors.InvalidOptionError(f"a KIVI key block or query shorter than {hd} keys")
        n = group - t0 if n is None else n
        dots = np.zeros(max(n, 1), dtype=np.float32)
        check(self.lib.ei_kernel_kivi_k_dots(
            self.isa, bits, group, hd, _ptr(block), t0, n, _ptr(q), _ptr(dots)
        ))  # fmt: skip
        return dots[:n]

    def kivi_quantize_v(self, bits: int, group: int, x: np.ndarray) -> np.ndarray:
        """The V row of one token's values x (hdv,) float16."""
        x = np.ascontiguousarray(x, dtype=np.float16)
        out = np.zeros(max(self.kivi_v_row_bytes(bits, group, x.size), 1), dtype=np.uint8)
        check(self.lib.ei_kernel_kivi_quantize_v(self.isa, bits, group, x.size, _ptr(x), _ptr(out)))
        return out

    def kivi_decode_v(self, bits: int, group: int, hdv: int, rows: np.ndarray) -> np.ndarray:
        """V rows (m, >= row bytes) uint8, the array's row stride apart -> (m, hdv) float32."""
        rows = np.atleast_2d(rows)
        if rows.dtype != np.uint8 or rows.strides[1] != 1:
            raise errors.InvalidOptionError("KIVI value rows are (m, bytes) uint8 of unit stride")
        if rows.shape[1] < self.kivi_v_row_bytes(bits, group, hdv):
            raise errors.InvalidOptionError(f"rows of {rows.shape[1]} bytes hold no V row of {hdv}")
        m = rows.shape[0]
        out = np.zeros((max(m, 1), hdv), dtype=np.float32)
        check(self.lib.ei_kernel_kivi_decode_v(
            self.isa, bits, group, hdv, _ptr(rows), rows.strides[0], m, _ptr(out)
        ))  # fmt: skip
        return out[:m]
