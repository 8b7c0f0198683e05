"""Several machines through llama.cpp's RPC backend (ggml-rpc): `localinfer worker` serves
this machine's memory and compute to another's llama.cpp, and `--rpc` splits a model's
layers across this machine and those workers. We write no distribution layer of our own:
the weights, the graph and the wire are llama.cpp's; this package makes them safe to reach
(addresses checked, workers probed before a load, a worker lost ends requests, not the
process)."""
