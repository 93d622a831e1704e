"""The converters' quantizers extend the runtime's codecs: one quantizer per codec, each
decoding through the runtime class of its type (byte parity with ggml is in tests/formats)."""

from __future__ import annotations

from edgeinfer import quants
from edgeinfer.converters import quantizers


def test_every_codec_has_a_quantizer_that_decodes_through_it():
    assert set(quantizers.QUANTIZERS) == set(quants.QUANT_TYPES)
    for t, cls in quantizers.QUANTIZERS.items():
        codec = quants.QUANT_TYPES[t]
        assert issubclass(cls, codec), cls.__name__
        assert cls._dequantize.__func__ is codec._dequantize.__func__, cls.__name__


def test_the_runtime_codecs_do_not_quantize():
    for cls in quants.QUANT_TYPES.values():
        assert not hasattr(cls, "quantize_blocks"), cls.__name__
    assert not hasattr(quants, "quantize")
