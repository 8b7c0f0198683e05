"""Measuring what a model (or a quantization of it) costs: perplexity over a text, and
the divergence of its next-token distributions from a reference model's."""
