"""GGUF parsing and validation."""

from edgeinfer.gguf.constants import BLOCK_LAYOUTS, COMPUTE_TYPES, GGMLType, ValueType
from edgeinfer.gguf.reader import GGUFFile, TensorInfo

__all__ = ["BLOCK_LAYOUTS", "COMPUTE_TYPES", "GGMLType", "GGUFFile", "TensorInfo", "ValueType"]
