"""A Hugging Face model folder, opened without loading the model.

Reads ``config.json``, ``generation_config.json``, the tokenizer files and the safetensors
headers (one file, or shards listed by ``model.safetensors.index.json``); tensor data stays
on disk until a converter asks for rows of one tensor.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from edgeinfer.converters import errors
from edgeinfer.converters.safetensors_file import SafetensorsFile, TensorEntry

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_JSON_BYTES = 64 * 1024 * 1024  # tokenizer.json of a 256k vocabulary is ~35 MB


def read_text(
    path: Path, required: bool = True, error: type[errors.SourceError] = errors.BadConfigError
) -> str | None:
    """The UTF-8 text of a file of at most :data:`MAX_JSON_BYTES`, or None when it is absent
    and not required; ``error`` is raised for a file that is not such a text."""
    try:
        info = path.stat()
    except FileNotFoundError:
        if required:
            raise errors.MissingSourceFileError(f"{path}: required file is missing") from None
        return None
    except OSError as e:
        raise errors.SourceError(f"{path}: cannot read ({e.strerror})") from None
    # a FIFO or a device would block or read without end: refused before it is opened
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{path}: is not a regular file")
    if info.st_size > MAX_JSON_BYTES:
        raise error(f"{path}: {info.st_size} bytes is too large for a text file")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise errors.SourceError(f"{path}: cannot read ({e.strerror})") from None


def read_json(path: Path, required: bool = True) -> Any:
    """The parsed JSON file, or None when it is absent and not required."""
    text = read_text(path, required)
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        # ValueError: bad JSON, or an integer of more digits than Python converts;
        # RecursionError: arrays or objects nested deeper than the decoder goes
        raise errors.BadConfigError(f"{path}: not valid JSON ({str(e)[:200]})") from None


class HFCheckpoint:
    """The files of one Hugging Face causal-LM folder."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        if not self.folder.exists():
            raise errors.MissingSourceFileError(f"{self.folder}: no such folder")
        if not self.folder.is_dir():
            raise errors.MissingSourceFileError(f"{self.folder}: is not a folder")
        self.config: dict[str, Any] = read_json(self.folder / "config.json")
        if not isinstance(self.config, dict):
            raise errors.BadConfigError(f"{self.folder / 'config.json'}: not a JSON object")
        self.generation_config: dict[str, Any] = self._optional_object("generation_config.json")
        self.tokenizer_config: dict[str, Any] = self._optional_object("tokenizer_config.json")
        self.tensors: dict[str, TensorEntry] = self._load_tensors()

    def _optional_object(self, name: str) -> dict[str, Any]:
        value = read_json(self.folder / name, required=False)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise errors.BadConfigError(f"{self.folder / name}: not a JSON object")
        return value

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures")
        if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
            raise errors.BadConfigError(
                f"{self.folder / 'config.json'}: 'architectures' must name the model class "
                '(for example ["LlamaForCausalLM"])'
            )
        return archs[0]

    def file(self, name: str) -> Path | None:
        path = self.folder / name
        return path if path.is_file() else None

    # --- safetensors -----------------------------------------------------------------------

    def _load_tensors(self) -> dict[str, TensorEntry]:
        # exists(), not is_file(): a FIFO or a folder under these names is refused by name
        index_path = self.folder / INDEX_FILE
        if index_path.exists():
            return self._load_sharded(index_path)
        single = self.folder / SINGLE_FILE
        if single.exists():
            return dict(SafetensorsFile(single).tensors)
        shards = sorted(self.folder.glob("model*.safetensors"))
        if shards:
            raise errors.MissingSourceFileError(
                f"{self.folder}: {len(shards)} safetensors shards but no {INDEX_FILE} to list them"
            )
        if any(self.folder.glob("*.bin")) or any(self.folder.glob("*.pth")):
            raise errors.MissingSourceFileError(
                f"{self.folder}: only PyTorch pickle weights found; convert needs "
                "model*.safetensors (pickles can run code when loaded, so they are not read)"
            )
        raise errors.MissingSourceFileError(f"{self.folder}: no model*.safetensors file")

    def _load_sharded(self, index_path: Path) -> dict[str, TensorEntry]:
        index = read_json(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise errors.BadConfigError(
                f"{index_path}: 'weight_map' must map tensor names to files"
            )
        for file_name in weight_map.values():
            if (
                not isinstance(file_name, str) or "\0" in file_name
                or Path(file_name).name != file_name or file_name in ("", "..")
            ):  # fmt: skip
                raise errors.BadConfigError(f"{index_path}: bad shard name {file_name!r}")
        shards: dict[str, SafetensorsFile] = {}
        for file_name in sorted(set(weight_map.values())):
            shards[file_name] = SafetensorsFile(self.folder / file_name)
        tensors: dict[str, TensorEntry] = {}
        for file_name, shard in shards.items():
            for name, entry in shard.tensors.items():
                if weight_map.get(name) != file_name:
                    raise errors.CorruptSafetensorsError(
                        f"{shard.path}: tensor {name!r} is not listed for this shard "
                        f"in {INDEX_FILE}"
                    )
                tensors[name] = entry
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise errors.CorruptSafetensorsError(
                f"{index_path}: tensor {missing[0]!r} is listed but absent from "
                f"{weight_map[missing[0]]}"
            )
        return tensors
