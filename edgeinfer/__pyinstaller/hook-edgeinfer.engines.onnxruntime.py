"""The ONNX engine is optional, and imported on first use. onnxruntime reaches torch and
transformers (through onnxruntime.transformers): followed from here, it grew a bundle from
91 MB to 861 MB. The converters (which read an exported folder's Hugging Face tokenizer)
stay out too. An app that runs ONNX folders imports both itself (see the README's "Frozen
apps"), and gets them from there."""

excludedimports = ["onnxruntime", "edgeinfer.converters"]
