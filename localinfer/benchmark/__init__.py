"""`localinfer bench`: model benchmarks in the manner of llama-bench (model.py), and their
tables (report.py)."""
