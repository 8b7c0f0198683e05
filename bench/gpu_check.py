"""Issue 33's checks on a machine with an NVIDIA GPU and the CUDA build installed, in one run
that fits a short lease: every step writes its log and result under OUT, and a step that
fails is recorded and the next one runs. A step already done (its result file exists) is
skipped, so a second run after a cut-off finishes the rest.

    ./install.sh                       # detects the GPU: LOCALINFER_BACKEND=cuda, its architecture
    .venv/bin/python bench/gpu_check.py OUT [--deadline SECONDS] [--steps a,b,...] [--model GGUF]

Steps: imports (the import orders that crashed the CUDA build, each in a process of its own,
with the GPU and with it hidden, with and without localinfer imported first; a backtrace of
the first crash where cuda-gdb is there; the libraries llama.cpp's loads), system (nvidia-smi, nvcc, doctor), offload (`run --gpu-layers auto --verbose` on the
embedded model and its F32 widening), agreement (bench/gpu_agreement.py: the same CUDA build
with the GPU hidden, CUDA_VISIBLE_DEVICES='', is the CPU reference), bench (`bench model
-ngl 0,all`), serve (`bench serve` at concurrency 1-16, every layer on the GPU, KV f16 and
q8_0, prompt lookup on and off), memory (`--gpu-layers auto` with most of the card taken by
another process, so that a quarter and three quarters of the model fit: predicted against
nvidia-smi), reliability
(bench/reliability.py load and disconnects on the GPU build). The models are the embedded
Q4_1 and its F32 widening, or --model's alone (a synthetic model of a real shape, say: a
machine with no package index has no embedded model).

A machine with no package index (the lent GPU machines) takes the packages as carried wheels
and llama-cpp-python's sdist through PIP_NO_INDEX=1 and PIP_FIND_LINKS; docs/benchmarks.md
says how the second H200 run was set up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PY = sys.executable
CLI = [PY, "-m", "localinfer.cli.app"]
PROMPT = "Why is the sky blue?"


def sh(cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> int:
    """Run `cmd`, its output appended to `log`; the exit status (124 on a timeout)."""
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        try:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            f.write(f"(timed out after {timeout:.0f} s)\n")
            return 124
        except OSError as e:  # the tool is not there
            f.write(f"({e})\n")
            return 127


def default_models() -> dict[str, Path]:
    from bench.draft_model import self_pair

    f32, q4_1 = self_pair()
    return {"q4_1": q4_1, "f32": f32}


def largest(models: dict[str, Path]) -> Path:
    return max(models.values(), key=lambda p: p.stat().st_size)


LOAD = "m = llama_cpp.Llama({model!r}, n_gpu_layers=-1, verbose=False); print(m.tokenize(b'Hello world'), flush=True)"
JIT = "import numba; print(numba.njit(lambda x: x + 1)(1), flush=True)"
RAW_ORDERS = {  # llama-cpp-python's CUDA build crashed in the first and third (docs/benchmarks.md)
    "numpy, then llama_cpp": "import numpy; import llama_cpp; " + LOAD,
    "llama_cpp, then a numba compile": "import llama_cpp; " + LOAD + "; " + JIT,
    "a numba compile, then llama_cpp": JIT + "; import llama_cpp; " + LOAD,
    "llama_cpp alone": "import llama_cpp; " + LOAD,
}
IMPORT_ORDERS = {**RAW_ORDERS, **{f"localinfer, {label}": "import localinfer; " + code for label, code in RAW_ORDERS.items()}}


def step_imports(out: Path, models: dict[str, Path]) -> dict[str, object]:
    """Each import order in a fresh process, with the GPU and hidden: exit status and last line."""
    model, log, results = str(min(models.values(), key=lambda p: p.stat().st_size)), out / "imports.log", {}
    for label, code in IMPORT_ORDERS.items():
        for where, env in (("gpu", {}), ("gpu hidden", {"CUDA_VISIBLE_DEVICES": ""})):
            r = subprocess.run([PY, "-X", "faulthandler", "-c", code.format(model=model)], capture_output=True, text=True, timeout=120,
                               env={**os.environ, **env}, cwd=ROOT)  # fmt: skip
            with log.open("a") as f:
                f.write(f"$ [{where}] {label}\n{r.stdout}{r.stderr}\n")
            results[f"{label} [{where}]"] = {"exit": r.returncode, "last": (r.stdout + r.stderr).strip().splitlines()[-1:]}
    rc = sh([*CLI, "run", model, "--engine", "llama.cpp", "--gpu-layers", "all", "-n", "8", "--temperature", "0", PROMPT], log, 120)
    results["localinfer run"] = {"exit": rc}
    crashed = [label for label, code in IMPORT_ORDERS.items() if results[f"{label} [gpu]"]["exit"] < 0]
    if crashed and subprocess.run(["which", "cuda-gdb"], capture_output=True).returncode == 0:
        sh(["cuda-gdb", "-q", "-batch", "-ex", "run", "-ex", "bt 30", "-ex", "info sharedlibrary", "--args",
            PY, "-c", IMPORT_ORDERS[crashed[0]].format(model=model)], out / "imports-backtrace.log", 180)  # fmt: skip
    libdir = subprocess.run([PY, "-c", "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / 'lib')"], capture_output=True, text=True).stdout.strip()
    for lib in sorted(Path(libdir).glob("*.so")) if libdir else []:
        sh(["ldd", str(lib)], out / "imports-ldd.log", 30)
    return results


def step_system(out: Path, models: dict[str, Path]) -> dict[str, object]:
    log = out / "system.log"
    sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used,compute_cap", "--format=csv"], log, 30)
    sh(["nvcc", "--version"], log, 30)
    sh([*CLI, "doctor"], log, 120)
    with (out / "doctor.json").open("w") as f:
        subprocess.run([*CLI, "doctor", "--json"], stdout=f, timeout=120, cwd=ROOT)
    return {"doctor": json.loads((out / "doctor.json").read_text()).get("llama_cpp", {})}


def step_offload(out: Path, models: dict[str, Path]) -> dict[str, object]:
    log = out / "offload.log"
    codes = {name: sh([*CLI, "run", str(path), "--gpu-layers", "auto", "--verbose", "--temperature", "0", "-n", "48", PROMPT], log, 180) for name, path in models.items()}
    return {"exit_codes": codes}


def step_agreement(out: Path, models: dict[str, Path]) -> dict[str, object]:
    """The embedded model and its widening (gpu_agreement.py makes them), whatever --model is."""
    log, ref = out / "agreement.log", Path("/tmp/localinfer-gpu-ref.npz")
    sh([PY, "bench/gpu_agreement.py", "dump", "--out", str(ref)], log, 300, env={"CUDA_VISIBLE_DEVICES": ""})
    sh([PY, "bench/gpu_agreement.py", "check", "--ref", str(ref), "--gpu-layers", "all", "--json", str(out / "agreement.json")], log, 300)
    return json.loads((out / "agreement.json").read_text())


def step_bench(out: Path, models: dict[str, Path]) -> dict[str, object]:
    codes = {}
    for name, path in models.items():
        codes[name] = sh([*CLI, "bench", "model", str(path), "-p", "512", "-n", "128", "-ngl", "0,all", "--engine", "llama.cpp", "-r", "3",
                          "-o", str(out / f"bench-{name}.json")], out / "bench.log", 400)  # fmt: skip
    return {"exit_codes": codes}


def step_serve(out: Path, models: dict[str, Path]) -> dict[str, object]:
    from tests.server.test_serve import Server

    runs = {}
    for cache in ("f16", "q8_0"):
        for draft in ("none", "prompt-lookup"):
            label = f"cuda-all-layers-kv-{cache}-draft-{draft}"
            server = Server(str(min(models.values(), key=lambda p: p.stat().st_size)), "--engine", "llama.cpp", "--parallel", "16", "--gpu-layers", "all", "--cache-type", cache, "--draft", draft)
            try:
                code = sh([*CLI, "bench", "serve", "--url", server.url, "-c", "1,2,4,8,16", "-n", "32", "--workload", "chat", "--output-len", "64",
                           "--label", label, "-o", str(out / f"serve-{cache}-{draft}.json")], out / "serve.log", 300)  # fmt: skip
            finally:
                rc, text = server.stop()
            runs[label] = {"bench_exit": code, "server_exit": rc, "traceback_in_log": "Traceback" in text}
    return runs


def gpu_memory_of(pid: int) -> int:
    """MiB that nvidia-smi says process `pid` holds on the GPU (0 if none)."""
    q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    for line in q.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return int(parts[1])
    return 0


HOG = """
import sys, time, torch
free, total = torch.cuda.mem_get_info()
leave = int(float(sys.argv[1]) * 2**30)
x = torch.empty(max(0, free - leave), dtype=torch.uint8, device="cuda")
print(f"holding {x.numel() / 2**30:.2f} GiB, leaving {torch.cuda.mem_get_info()[0] / 2**30:.2f} GiB free", flush=True)
time.sleep(float(sys.argv[2]))
"""

PLANNED = """
import json, sys, time
from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.engine.types import SamplingParams
e = open_engine(sys.argv[1], LoadOptions(engine="llama.cpp", ctx=int(sys.argv[2]), gpu_layers="auto", draft=None))
m = e.memory
print(json.dumps({"n_gpu_layers": m.n_gpu_layers, "vram_free_gib": m.vram_free / 2**30, "predicted_gpu_gib": m.gpu_bytes / 2**30,
                  "placement": m.placement}), flush=True)  # before decoding: a crash there keeps the plan
out = e.complete(e.tokenize_prompt(e.render_chat([{"role": "user", "content": "Hi"}])), SamplingParams(temperature=0, max_tokens=16))
print(json.dumps({"tokens": len(out.tokens)}), flush=True)
time.sleep(3)
"""


CONTEXT_GIB = 0.5  # what the process's own CUDA context took on an H200 before the plan reads free memory


def step_memory(out: Path, models: dict[str, Path], ctx: int = 16384) -> dict[str, object]:
    """Most of the card taken by another process, leaving the plan's headroom and a quarter,
    then three quarters, of the largest model free; `--gpu-layers auto` must choose a split
    that loads and runs each time."""
    from localinfer.memory import GPU_HEADROOM

    model = largest(models)
    return {"model": model.name, "ctx": ctx, "runs": [memory_under_pressure(model, ctx, CONTEXT_GIB + (GPU_HEADROOM + share * model.stat().st_size) / 2**30)
                                                   for share in (0.25, 0.75)]}  # fmt: skip


def memory_under_pressure(model: Path, ctx: int, leave_gib: float) -> dict[str, object]:
    hog = subprocess.Popen([PY, "-c", HOG, str(leave_gib), "120"], stdout=subprocess.PIPE, text=True)
    held = hog.stdout.readline().strip() if hog.stdout else ""
    try:
        proc = subprocess.Popen([PY, "-c", PLANNED, str(model), str(ctx)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        peak, deadline = 0, time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            peak = max(peak, gpu_memory_of(proc.pid))
            time.sleep(0.2)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        hog.kill()
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    planned = {k: v for line in lines for k, v in line.items()}
    if proc.returncode != 0:
        planned["error"] = stderr[-2000:]
    return {"hog": held, "planned": planned, "nvidia_smi_peak_mib": peak, "exit": proc.returncode}


def step_reliability(out: Path, models: dict[str, Path]) -> dict[str, object]:
    model = ["--model", str(largest(models))]
    codes = {s: sh([PY, "bench/reliability.py", s, *model, "-o", str(out / f"reliability-{s}.json")], out / "reliability.log", 280) for s in ("disconnects", "load")}
    return {"exit_codes": codes}


STEPS = {"imports": step_imports, "system": step_system, "offload": step_offload, "agreement": step_agreement, "bench": step_bench,
         "serve": step_serve, "memory": step_memory, "reliability": step_reliability}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--deadline", type=float, default=540, help="seconds; no step starts after this")
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--model", type=Path, help="run the checks on this GGUF instead of the embedded model and its F32 widening")
    args = ap.parse_args()
    models = {args.model.stem: args.model} if args.model else default_models()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    for name in args.steps.split(","):
        result_file = args.out / f"{name}.result.json"
        if result_file.exists():
            continue
        if time.monotonic() - start > args.deadline:
            print(f"{name}: not started (deadline)", flush=True)
            continue
        t0 = time.monotonic()
        try:
            result = {"ok": True, **STEPS[name](args.out, models)}
        except Exception as e:  # noqa: BLE001 - a failed step is recorded; the next one runs
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        result["seconds"] = round(time.monotonic() - t0, 1)
        result_file.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"{name}: {json.dumps(result, default=str)[:600]}", flush=True)


if __name__ == "__main__":
    main()
