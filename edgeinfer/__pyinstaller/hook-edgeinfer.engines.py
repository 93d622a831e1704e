"""onnxruntime is an optional backend, imported on first use. Its package reaches torch and
transformers (through onnxruntime.transformers): followed from here, it grew a bundle from 91 MB
to 861 MB. An app that runs ONNX folders imports onnxruntime itself and gets it from there."""

excludedimports = ["onnxruntime"]
