"""ONNX export: a Hugging Face folder to a folder that onnxruntime-genai runs as it is.

The graph uses onnxruntime's contrib operators (``MatMulNBits`` INT4/INT8 weights,
``GatherBlockQuantized`` embedding, ``GroupQueryAttention`` with a float or quantized KV
cache, ``RMSNormalization``); :mod:`.export` assembles the folder,
:mod:`.decoder` builds the graph from an architecture converter's tensors, :mod:`.blockwise`
quantizes in onnxruntime's layouts. Needs the ``onnx`` package (``pip install
'edgeinfer[convert]'``); calibrating a quantized KV cache also needs onnxruntime.
"""
