#!/usr/bin/env bash
# The serving table of docs/benchmarks.md, from `localinfer bench serve`: the same closed-loop
# load (concurrency 1, 2, 4, 8) on `localinfer serve` with each engine and on llama-cpp-python's
# own server (the anchor, one request at a time), one after the other in one run, on loopback.
# Writes docs/bench/serve-<name>.json and .png, and prints each table and the comparisons.
#
#   bash bench/serving.sh [REQUESTS_PER_LEVEL] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-16}" threads="${2:-2}" py=.venv/bin/python li=.venv/bin/localinfer
model="$($py -c 'from localinfer.store.pull import local_path; from localinfer.store.refs import resolve; print(local_path(resolve(None)))')"
port=18180
declare -A servers=(
  [localinfer-llamacpp]="$li serve --port $port --threads $threads --parallel 8 --draft none"
  [localinfer-native]="$li serve --port $port --threads $threads --parallel 8 --draft none --engine native"
  [llama-cpp-python]="$py -m llama_cpp.server --port $port --model $model --model_alias smollm2:135m --n_threads $threads --n_ctx 4096 --interrupt_requests False"
)
for name in localinfer-llamacpp localinfer-native llama-cpp-python; do
  HF_HUB_OFFLINE=1 ${servers[$name]} >"/tmp/serving-$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break; sleep 0.5; done
  echo "## $name"
  $li bench serve --url "http://127.0.0.1:$port" --label "$name" --model smollm2:135m -c 1,2,4,8 -n "$n" --input-len 48 --output-len 48 \
    --slo-ttft-ms 2000 --slo-tpot-ms 50 --timeout 300 -o "docs/bench/serve-$name.json" --plot "docs/bench/serve-$name.png" || true
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo
done
$li bench compare docs/bench/serve-llama-cpp-python.json docs/bench/serve-localinfer-llamacpp.json
$li bench compare docs/bench/serve-llama-cpp-python.json docs/bench/serve-localinfer-native.json
