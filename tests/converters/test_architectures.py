"""One rule for Gemma 3's query scale: the GGUF the converter writes, the runtime config read
from it and the ONNX export all scale queries as transformers does for the same config.json."""

from __future__ import annotations

import pytest

from edgeinfer import errors as ei_errors
from edgeinfer.converters import errors
from edgeinfer.converters.convert import Conversion, ConvertOptions, convert
from edgeinfer.converters.onnx.spec import DecoderSpec
from edgeinfer.gguf import GGUFFile
from edgeinfer.models import config_from_gguf
from tests.converters.checkpoints import SPECS

# small heads whose size (16) differs from hidden / heads (32): the 27B rule shows
SHAPE = {"hidden": 64, "ff": 64, "n_head": 2, "n_head_kv": 1, "head_dim": 16}


def transformers_scaling(folder) -> float:
    """What transformers multiplies Gemma 3's queries by, for this config.json."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention

    config = transformers.AutoConfig.from_pretrained(folder)
    return float(Gemma3Attention(config, layer_idx=0).scaling)


@pytest.mark.parametrize(("n_layer", "scalar"), [(2, 16), (62, 32)], ids=["head-size", "27b-rule"])
def test_gemma3_query_scale_is_one_rule(make_checkpoint, tmp_path, n_layer, scalar):
    config = {**SPECS["gemma3"].config, "query_pre_attn_scalar": scalar}
    src = make_checkpoint("gemma3", n_layer=n_layer, config=config, **SHAPE)
    want = transformers_scaling(src)
    out = tmp_path / "model.gguf"
    convert(src, out, ConvertOptions(type="f16"))
    with GGUFFile(out) as gguf:
        assert config_from_gguf(gguf).kq_scale == pytest.approx(want, rel=1e-7)
    conversion = Conversion(src)
    spec = DecoderSpec.from_converter(conversion.arch, n_vocab=len(conversion.vocab.tokens))
    assert spec.attn_scale == pytest.approx(want, rel=1e-7)


def test_gemma3_scalar_the_runtime_cannot_derive_is_refused(make_checkpoint):
    config = {**SPECS["gemma3"].config, "query_pre_attn_scalar": 16}
    src = make_checkpoint("gemma3", n_layer=62, config=config, **SHAPE)
    with pytest.raises(errors.UnsupportedFeatureError, match="query_pre_attn_scalar") as e:
        Conversion(src)
    assert isinstance(e.value, ei_errors.UnsupportedModelError)
