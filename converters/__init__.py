"""Hugging Face checkpoint conversion (GGUF, ONNX)."""
