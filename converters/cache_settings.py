"""The KV cache a conversion is made for: ``--cache-type-k`` / ``--cache-type-v`` (``-ctk`` /
``-ctv``), ``--kv-type`` setting both, else a device profile's ``cache_type_k`` /
``cache_type_v``, else the output format's default.

Each output format names its own types. A GGUF file runs on edgeinfer's engines, whose cache
types are :data:`edgeinfer.kv_cache.CACHE_TYPES` (llama.cpp's ``-ctk`` names: f16, f32, q8_0,
q4_0). An ONNX folder's cache is part of its graph: f32, f16, int8 or int4 with per-channel
scales calibrated at export, one type for keys and values alike. A name of the other format
is refused with the names this one takes, never translated: q8_0 (blocks of 32 with their
own scales) and int8 (calibrated channel scales) are different caches.

A GGUF file records the types its memory fit counted as its recommendation (edgeinfer's own
metadata keys, :data:`edgeinfer.api.RECOMMENDED_CACHE_KEYS`), which ``load()`` uses unless
told otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeinfer.converters import errors
from edgeinfer.converters.architectures.base import MetadataItem, kv
from edgeinfer.converters.onnx.export import KV_TYPES as ONNX_CACHE_TYPES
from edgeinfer.gguf.constants import ValueType
from edgeinfer.kv_cache import CACHE_TYPES, DEFAULT_CACHE_TYPE

if TYPE_CHECKING:
    from edgeinfer.converters.convert import ConvertOptions
    from edgeinfer.converters.profiles import Profile

# format -> the cache types it takes, and the one it uses when none is named
FORMAT_CACHE_TYPES: dict[str, tuple[str, ...]] = {
    "gguf": tuple(CACHE_TYPES),
    "onnx": ONNX_CACHE_TYPES,
}
DEFAULT_CACHE_TYPES = {"gguf": DEFAULT_CACHE_TYPE, "onnx": "f32"}
# the context a GGUF file's cache was sized for (--ctx, or the profile's); written beside the
# cache types, for the reader's information (load() chooses its context as before)
CONTEXT_KEY = "edgeinfer.context_length"


@dataclass(frozen=True)
class CacheSettings:
    """The types of the cached keys and values; ``named`` when an option or the profile
    chose them rather than the format's default."""

    k: str
    v: str
    named: bool = False

    def label(self) -> str:
        """``q8_0`` when keys and values agree, else ``K q8_0, V q4_0``."""
        return self.k if self.k == self.v else f"K {self.k}, V {self.v}"


def cache_settings(
    options: ConvertOptions, fmt: str, profile: Profile | None = None
) -> CacheSettings:
    """The cache types for output format ``fmt`` ("gguf" or "onnx"), option by option: an
    option's name, else the profile's, else the default. ``--kv-type`` that disagrees with
    ``--cache-type-k`` or ``-v`` is refused, as is a name the format does not take."""
    both = _checked(options.kv_type, "--kv-type", fmt)
    chosen = []
    for flag, given, proposed in (
        ("--cache-type-k", options.cache_type_k, profile.cache_type_k if profile else None),
        ("--cache-type-v", options.cache_type_v, profile.cache_type_v if profile else None),
    ):
        one = _checked(given, flag, fmt)
        if both is not None and one is not None and one != both:
            raise errors.ConflictingOptionsError(
                f"--kv-type {both} sets both cache types; {flag} {one} disagrees"
            )
        chosen.append(one or both or proposed)
    default = DEFAULT_CACHE_TYPES[fmt]
    settings = CacheSettings(chosen[0] or default, chosen[1] or default, any(chosen))
    if fmt == "onnx" and settings.k != settings.v:
        raise errors.NotAvailableError(
            f"ONNX output keeps keys and values in one type: --cache-type-k {settings.k} and "
            f"--cache-type-v {settings.v} differ (GGUF output can store them apart)"
        )
    return settings


def _checked(name: str | None, flag: str, fmt: str) -> str | None:
    if name is None:
        return None
    takes = FORMAT_CACHE_TYPES[fmt]
    if name in takes:
        return name
    others = [f for f, names in FORMAT_CACHE_TYPES.items() if f != fmt and name in names]
    whose = f"; {name} is one of {others[0].upper()} output" if others else ""
    raise errors.UnknownTypeError(
        f"{flag} {name!r} is not a cache type of {fmt.upper()} output ({', '.join(takes)}){whose}"
    )


def recommended_metadata(
    settings: CacheSettings, n_ctx: int | None, fitted: bool
) -> list[MetadataItem]:
    """The GGUF keys recording the cache a file was made for, with the context when one was
    given: when an option or the profile named the types, or a fit counted them. A default
    cache nothing counted writes none, so the runtime's default stays the file's."""
    from edgeinfer.api import RECOMMENDED_CACHE_KEYS  # the runtime reads what is written here

    if not (settings.named or fitted):
        return []
    k_key, v_key = RECOMMENDED_CACHE_KEYS
    items = [kv(k_key, ValueType.STRING, settings.k), kv(v_key, ValueType.STRING, settings.v)]
    if n_ctx is not None:
        items.append(kv(CONTEXT_KEY, ValueType.UINT32, n_ctx))
    return items
