"""localinfer's native engine (installed as `localinfer_native`): Numba and C
dequant-matvec kernels and a llama-family forward pass. Filled in by the native-backend issue."""
