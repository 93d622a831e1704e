"""Tokenizers that give the same token ids as llama.cpp.

>>> from edgeinfer.gguf.reader import GGUFFile
>>> from edgeinfer.tokenizer import Tokenizer
>>> tok = Tokenizer.from_metadata(GGUFFile("model.gguf").metadata)
>>> ids = tok.tokenize("Hello, world!")
>>> tok.detokenize(ids, remove_special=True)
'Hello, world!'
"""

from __future__ import annotations

from edgeinfer.tokenizer.tokenizer import StreamDecoder, Tokenizer

__all__ = ["StreamDecoder", "Tokenizer"]
