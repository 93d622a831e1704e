"""The engine registry names the optional ONNX engine's package; it stays out of a bundle
unless the app imports it (why: hook-edgeinfer.engines.onnxruntime.py)."""

excludedimports = ["onnxruntime"]
