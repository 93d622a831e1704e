"""The architecture registries: the runtime's (edgeinfer.models), the GGUF converter's and the
ONNX exporter's (converters/) must know the same architectures, by the same names."""

from __future__ import annotations

import importlib

import pytest

from edgeinfer.chat import BUILTIN_TEMPLATES, builtin_template
from edgeinfer.converters import architectures as converter_registry
from edgeinfer.converters.onnx.spec import onnx_architectures
from edgeinfer.models import ARCHITECTURES, ONNX_MODEL_TYPES, gemma3


def test_runtime_converter_and_onnx_export_know_the_same_architectures():
    runtime = set(ARCHITECTURES)
    assert set(converter_registry.ARCHITECTURES) == runtime
    assert onnx_architectures() == runtime


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_one_module_per_architecture_on_each_side(name):
    """edgeinfer/models/<arch>.py and converters/architectures/<arch>.py own the architecture."""
    runtime = importlib.import_module(f"edgeinfer.models.{name}")
    converters = importlib.import_module(f"edgeinfer.converters.architectures.{name}")
    assert runtime.ARCHITECTURE is ARCHITECTURES[name]
    assert converter_registry.ARCHITECTURES[name] == converters.CONVERTERS
    for cls in converters.CONVERTERS:
        assert cls.gguf_arch == name, cls.__name__


def test_each_hugging_face_class_is_mapped_once():
    names = [
        hf
        for classes in converter_registry.ARCHITECTURES.values()
        for cls in classes
        for hf in cls.hf_architectures
    ]
    assert len(names) == len(set(names)) == len(converter_registry.CONVERTERS)
    assert converter_registry.CONVERTERS["MistralForCausalLM"].gguf_arch == "llama"


def test_exported_onnx_folders_load_as_the_architecture_they_were_written_from():
    for arch, classes in converter_registry.ARCHITECTURES.items():
        for cls in classes:
            assert ONNX_MODEL_TYPES.get(cls.genai_type) == arch, cls.__name__


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_each_architecture_names_a_built_in_template(name):
    chosen, source = builtin_template(name, {})
    assert chosen == ARCHITECTURES[name].chat_template
    assert source == BUILTIN_TEMPLATES[chosen][0]


def test_vocabulary_markers_choose_before_the_architecture():
    assert builtin_template("qwen2", {"<|start_header_id|>": 1, "<|eot_id|>": 2})[0] == "llama3"
    assert builtin_template("no-such-arch", {})[0] == "llama2"


# (layers, hidden size, heads, head size) -> query_pre_attn_scalar of Google's published
# Gemma 3 config.json files: 270M, 1B, 4B, 12B and 27B
PUBLISHED_GEMMA3 = {
    (18, 640, 4, 256): 256,
    (26, 1152, 4, 256): 256,
    (34, 2560, 8, 256): 256,
    (48, 3840, 16, 256): 256,
    (62, 5376, 32, 128): 168,
}


@pytest.mark.parametrize("shape", PUBLISHED_GEMMA3)
def test_gemma3_query_scale_rule_matches_the_published_configs(shape):
    assert gemma3.query_pre_attn_scalar(*shape) == PUBLISHED_GEMMA3[shape]
    assert gemma3.query_scale(*shape) == PUBLISHED_GEMMA3[shape] ** -0.5
