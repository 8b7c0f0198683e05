"""localinfer's quantization toolkit (installed as `localinfer_quant`): GGUF codecs,
`localinfer quantize` and `localinfer eval`. Filled in by the quantization issue."""
