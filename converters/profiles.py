"""Device profiles: small declarative TOML files in ``profiles/`` naming a device's
instruction set, its memory and the share of it a model may take, a default context, and
the weight types that run well on it. An optional ``block_sizes`` list only narrows those
types: a type whose block size (32, 256; 1 for f16 and bf16) is not listed is dropped.
Optional ``cache_type_k`` / ``cache_type_v`` name the KV cache's types (edgeinfer's cache
types; the default f16) that the memory fit counts and the file recommends.

A profile only proposes; ``--max-memory``, ``--ctx`` and the cache type options override
its numbers.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer import options
from edgeinfer._native import ISA_NAMES
from edgeinfer.converters import errors
from edgeinfer.converters.recipes import type_by_name
from edgeinfer.gguf.constants import BLOCK_LAYOUTS, GGMLType
from edgeinfer.kv_cache import CACHE_TYPES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PROFILE_DIR = Path(__file__).parent / "profiles"
# a memory size ("8GiB", "1.5 GB"); a size that cannot be read is an InvalidSizeError
parse_size = functools.partial(options.parse_size, error=errors.InvalidSizeError)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    isa: str
    memory: int
    model_share: float
    ctx: int
    types: tuple[GGMLType, ...]
    cache_type_k: str | None = None  # None: the format's default
    cache_type_v: str | None = None

    @property
    def budget(self) -> int:
        return int(self.memory * self.model_share)


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (``rpi5``) or by the path of a TOML file."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise errors.ProfileError(
            f"unknown target {name_or_path!r}; profiles: {', '.join(available_profiles())}"
        )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise errors.ProfileError(f"{path}: not valid TOML ({e})") from None
    return _profile(data, path)


def _profile(data: dict[str, Any], path: Path) -> Profile:
    def need(key: str, kind: type | tuple[type, ...]) -> Any:
        value = data.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise errors.ProfileError(f"{path}: {key!r} is missing or has the wrong type")
        return value

    isa = need("isa", str)
    if isa not in ISA_NAMES:
        raise errors.ProfileError(f"{path}: isa {isa!r} is not one of {', '.join(ISA_NAMES)}")
    share = float(need("model_share", (int, float)))
    if not 0 < share <= 1:
        raise errors.ProfileError(f"{path}: model_share must lie in (0, 1]")
    types = need("types", list)
    if not types:
        raise errors.ProfileError(f"{path}: 'types' must name at least one type")
    try:
        parsed = tuple(type_by_name(str(t)) for t in types)
    except errors.UnknownTypeError as e:
        raise errors.ProfileError(f"{path}: {e}") from None
    blocks = tuple(
        int(b) for b in data.get("block_sizes", [BLOCK_LAYOUTS[t].block_size for t in parsed])
    )
    kept = tuple(t for t in parsed if BLOCK_LAYOUTS[t].block_size in blocks)
    if not kept:
        raise errors.ProfileError(
            f"{path}: no type in 'types' has one of the block sizes {list(blocks)}"
        )
    try:
        memory = parse_size(need("memory", (str, int)))
    except errors.InvalidSizeError as e:
        raise errors.ProfileError(f"{path}: {e}") from None
    ctx = need("ctx", int)
    if ctx < 1:
        raise errors.ProfileError(f"{path}: ctx must be positive")
    k_type, v_type = (_cache_type(data, key, path) for key in ("cache_type_k", "cache_type_v"))
    return Profile(
        name=str(data.get("name", path.stem)), description=str(data.get("description", "")),
        isa=isa, memory=memory, model_share=share, ctx=ctx, types=kept,
        cache_type_k=k_type, cache_type_v=v_type,
    )  # fmt: skip


def _cache_type(data: dict[str, Any], key: str, path: Path) -> str | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, str) or value not in CACHE_TYPES):
        raise errors.ProfileError(f"{path}: {key} {value!r} is not one of {', '.join(CACHE_TYPES)}")
    return value
