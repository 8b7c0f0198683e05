"""`localinfer doctor`: what this machine and this build can do."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from localinfer.cli import options as opt
from localinfer.paths import data_dir, models_dir

if TYPE_CHECKING:
    from localinfer.modelfile import GGUFInfo


def _system_gpus() -> list[str]:
    """GPUs the OS can see, whether or not this llama.cpp build can use them."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
            return [line.strip() for line in out.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            return []
    if platform.system() == "Darwin":
        return ["Apple GPU (Metal)"]
    return []


def native_kernels() -> dict[str, str]:
    """Each kernel set of the native engine: what it runs on here, or why it cannot run."""
    from localinfer_native import KERNEL_SETS, KernelsUnavailable, load_kernels

    sets = {}
    for name in KERNEL_SETS:
        try:
            sets[name] = load_kernels(name).describe()
        except (KernelsUnavailable, ImportError, OSError) as e:
            sets[name] = f"unavailable: {e}"
    return sets


def llama_cpp_report() -> dict[str, object]:
    """llama.cpp's build: version, the backends compiled in (CPU, RPC, each GPU's), devices,
    CPU features; or why it does not load at all (a CUDA build without the driver, a library
    built for another CPU)."""
    try:
        from localinfer.backends.llamacpp import system_info
        from localinfer.devices import backends, gpu_backends, list_devices

        import llama_cpp

        devices = list_devices()
        info = system_info()
        compiled = backends()
    except (ImportError, OSError, RuntimeError) as e:
        from localinfer.backends import import_failure

        return {"error": import_failure(e)}
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "backends": compiled,
        "gpu_backends": gpu_backends(compiled),
        "gpu_offload": bool(gpu_backends(compiled)),
        "devices": [{"name": d.name, "description": d.description, "type": d.kind, "free_bytes": d.free_bytes, "total_bytes": d.total_bytes} for d in devices],
        "system_info": info.strip(),
    }


def _free_disk(path: Path) -> int:
    """Free bytes where `path` is or will be (it need not exist yet)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def engines_report() -> dict[str, object]:
    """What each engine runs here (its capabilities), or why it cannot start."""
    from localinfer.backends import BACKENDS, get_backend
    from localinfer.errors import UserError

    out: dict[str, object] = {}
    for name in BACKENDS:
        try:
            caps = get_backend(name).capabilities()
        except UserError as e:
            out[name] = {"error": str(e)}
            continue
        out[name] = {
            "architectures": sorted(caps.architectures) if caps.architectures is not None else "any",
            "weight_types": sorted(caps.weight_types) if caps.weight_types is not None else "any",
            "kv_types": list(caps.kv_types),
            "gpu_offload": caps.gpu_offload,
            "kv_layout": caps.kv_layout,
            "rpc": caps.rpc,
            "ranks": sorted(caps.ranks) if caps.ranks is not None else "any",  # the architectures whose rerankers it runs
            "auto_passes_over": sorted(caps.slower),  # what it runs, but --engine auto leaves to another engine
        }
    return out


def model_report(ref: str, ctx: int | None = None, cache: tuple[str | None, str | None] | str = (None, None)) -> dict[str, object]:
    """Which engine `--engine auto` takes for a model on this machine, and why (a vision
    model's projector counts: it needs an engine that reads images); and where `run` would
    put it with this context and KV-cache type (its defaults where None): the memory plan's
    split, bytes per device, and the cache's bytes at that context."""
    from localinfer.backends import get_backend
    from localinfer.cli.show import vision_json, vision_of
    from localinfer.engine.loader import LoadOptions, cache_types, choose_engine, context_of, plan_memory
    from localinfer.errors import ModelNotFound, OutOfMemory
    from localinfer.modelfile import inspect
    from localinfer.store.pull import local_path
    from localinfer.store.refs import resolve

    src = resolve(ref)
    path = local_path(src)
    if path is None:
        raise ModelNotFound(f"model '{ref}' is not downloaded; run 'localinfer pull {ref}' first")
    info = inspect(path)
    options = LoadOptions(ctx=ctx, cache=cache)
    types = cache_types(options.cache, src.defaults)
    projector, notes = vision_of(src, path)
    choice = choose_engine("auto", info, "auto", types, images=projector)
    report: dict[str, object] = {"path": str(path), "architecture": info.architecture, "tensor_types": sorted(info.tensor_types), **model_kind(info),
                                 **vision_json(projector, notes), "engine": choice.name, "reason": choice.reason}  # fmt: skip
    n_ctx = context_of(options, src, info)
    try:
        plan, _ = plan_memory(info, n_ctx, options, get_backend(choice.name), types)
    except OutOfMemory as e:
        return report | {"memory": {"fits": False, "error": str(e)}}
    memory = {"fits": True, "gpu_layers": plan.n_gpu_layers, "n_cpu_moe": plan.n_cpu_moe, "gpu_bytes": plan.gpu_bytes, "ram_bytes": plan.ram_bytes,
              "weights_bytes": plan.weights, "active_weights_bytes": plan.active_weights, "ctx": n_ctx, "kv_cache_bytes": plan.kv_cache,
              "cache_types": list(plan.cache_types), "compute_bytes": plan.compute, "total": plan.describe(),
              "placement": plan.placement, "split": plan.split, "warnings": plan.warnings}  # fmt: skip
    return report | {"memory": memory}


def model_kind(info: GGUFInfo) -> dict[str, object]:
    """What the model answers, in /v1/models' words (chat, embedding, rerank); for an
    embedding model its pooling and the length of its vectors, for a reranker its pooling."""
    if not info.embeds:
        return {"kind": "chat"}
    if info.pooling == "rank":
        return {"kind": "rerank", "pooling": "rank"}
    return {"kind": "embedding", "pooling": info.pooling, "dimensions": info.n_embd}


def kind_text(model: dict[str, object]) -> str | None:
    """'embedding model, pooling: mean, dimensions: 768', 'reranking model, pooling: rank',
    or None for a chat model."""
    if model["kind"] == "embedding":
        return f"embedding model, pooling: {model['pooling']}, dimensions: {model['dimensions']}"
    if model["kind"] == "rerank":
        return f"reranking model, pooling: {model['pooling']}"
    return None


def vision_line(model: dict[str, object]) -> str | None:
    """'vision: yes (projector …, gemma3, image tokens per image 256)' from the report's JSON,
    'vision: no (why)' where a projector was meant to be, None for a text model."""
    v, notes = model.get("vision"), model.get("vision_notes")
    if isinstance(v, dict):
        return f"vision: yes ({v['summary']})"
    return f"vision: no ({'; '.join(notes)})" if notes else None  # type: ignore[arg-type]


def workers_report(endpoints: tuple[str, ...]) -> list[dict[str, object]]:
    """Each RPC worker: does it answer, in a protocol this build speaks, and what it offers."""
    from localinfer.backends.rpc.probe import PROTOCOL, probe
    from localinfer.errors import UserError

    rows: list[dict[str, object]] = []
    for endpoint in endpoints:
        try:
            w = probe(endpoint)
        except UserError as e:
            rows.append({"endpoint": endpoint, "ok": False, "error": str(e)})
            continue
        rows.append({"endpoint": endpoint, "ok": True, "protocol": w.version_text, "compatible_with": ".".join(map(str, PROTOCOL)),
                     "backend": w.backend, "devices": w.devices, "offered_bytes": w.free_bytes, "total_bytes": w.total_bytes})  # fmt: skip
    return rows


def print_workers(rows: list[dict[str, object]]) -> None:
    from localinfer.memory import size_text

    t = Table(title="RPC workers")
    for column in ("worker", "answers", "protocol", "backend", "offers", "devices"):
        t.add_column(column)
    for w in rows:
        if not w["ok"]:
            t.add_row(str(w["endpoint"]), f"[red]no[/red]: {w['error']}", "", "", "", "")
            continue
        offer = f"{size_text(w['offered_bytes'])} of {size_text(w['total_bytes'])}"  # type: ignore[arg-type]
        t.add_row(str(w["endpoint"]), "yes", f"{w['protocol']} (compatible)", str(w["backend"]), offer, str(w["devices"]))
    Console().print(t)


def collect() -> dict[str, object]:
    import psutil

    from localinfer.devices import cpu_name, vulkan_devices

    vm = psutil.virtual_memory()
    lc = llama_cpp_report()
    features = [part.strip() for part in str(lc.get("system_info", "")).split("|") if "= 1" in part]
    return {
        "cpu": {"name": cpu_name(), "cores": psutil.cpu_count(logical=False), "threads": psutil.cpu_count(), "features": [f.split("=")[0].strip().split(":")[-1].strip() for f in features]},
        "ram": {"total_bytes": vm.total, "available_bytes": vm.available},
        "llama_cpp": lc,
        "native_kernels": native_kernels(),
        "engines": engines_report(),
        "gpus_seen_by_os": _system_gpus(),
        "vulkan_devices": [asdict(d) | {"taken_by_default": d.taken_by_default, "used": d.used} for d in vulkan_devices()],
        "storage": {"data_dir": str(data_dir()), "models_dir": str(models_dir()), "disk_free_bytes": _free_disk(models_dir())},
    }


def doctor(
    model: Annotated[Optional[str], typer.Argument(help="Also say which engine runs this model here (with --engine auto), and why, and the memory it takes (the KV cache at --ctx, in --cache-type).", show_default=False)] = None,
    ctx: opt.Ctx = None,
    cache_type: opt.CacheType = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    rpc: Annotated[Optional[str], typer.Option("--rpc", metavar="HOST:PORT[,HOST:PORT...]", envvar="LOCALINFER_RPC", callback=opt.rpc_endpoints, show_default=False,
                                               help="Also check these RPC workers: does each answer, in a protocol this build speaks, what computes there and what it offers (exit 1 if one does not answer).")] = None,  # fmt: skip
) -> None:
    """Report CPU features, memory, llama.cpp backends, native kernels, what each engine runs, GPUs, and where models are stored."""
    report = collect()
    if model is not None:
        report["model"] = model_report(model, ctx, opt.cache_choice(cache_type, None, None))
    if rpc:
        report["rpc_workers"] = workers_report(rpc)  # type: ignore[arg-type]
    failed = any(not w["ok"] for w in report.get("rpc_workers", []))  # type: ignore[attr-defined]
    if json_out:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
        if rpc:
            print_workers(report["rpc_workers"])  # type: ignore[arg-type]
    raise typer.Exit(1 if failed else 0)


def print_report(report: dict[str, object]) -> None:
    cpu, ram, lc, st = report["cpu"], report["ram"], report["llama_cpp"], report["storage"]  # type: ignore[misc]
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("CPU", f"{cpu['name']} ({cpu['cores']} cores, {cpu['threads']} threads)")
    t.add_row("CPU features", " ".join(cpu["features"]) or "-")
    t.add_row("RAM", f"{ram['available_bytes'] / 2**30:.1f} GiB free of {ram['total_bytes'] / 2**30:.1f} GiB")
    if "error" in lc:
        t.add_row("llama.cpp", f"[red]cannot load:[/red] {lc['error']}")
        t.add_row("", "[yellow]reinstall it for this machine with ./install.sh (LOCALINFER_BACKEND=cpu for a CPU-only build); both engines need it, the native one for its tokenizer[/yellow]")
    else:
        t.add_row("llama.cpp", f"llama-cpp-python {lc['llama_cpp_python']}, built with {built_with(lc)}")
    for d in lc.get("devices", []):
        mem = f", {d['free_bytes'] / 2**30:.1f} GiB free" if d["type"] != "CPU" and d["total_bytes"] else ""
        t.add_row("  device", f"{d['name']} ({d['type']}: {d['description']}{mem})")
    kernels = report["native_kernels"]
    t.add_row("native kernels", f"auto → {kernels['auto']}")  # type: ignore[index]
    for name in ("c", "numba"):
        t.add_row("", f"{name}: {kernels[name]}")  # type: ignore[index]
    for name, caps in report["engines"].items():  # type: ignore[attr-defined]
        if "error" in caps:
            t.add_row(f"{name} engine", f"[red]cannot start:[/red] {caps['error']}")
            continue
        archs = caps["architectures"] if caps["architectures"] == "any" else ", ".join(caps["architectures"])
        t.add_row(f"{name} engine", f"architectures: {archs}; KV cache: {', '.join(caps['kv_types'])} ({caps['kv_layout']}); GPU offload: {'yes' if caps['gpu_offload'] else 'no'}")
    if "model" in report:
        m = report["model"]
        t.add_row("model", f"{m['path']} ({m['architecture']}): engine {m['engine']}, because {m['reason']}")  # type: ignore[index]
        if kind := kind_text(m):  # type: ignore[arg-type]
            t.add_row("", kind)
        if vision := vision_line(m):  # type: ignore[arg-type]
            t.add_row("", vision)
        mem = m["memory"]  # type: ignore[index]
        if mem["fits"]:
            t.add_row("", f"memory at {mem['ctx']} tokens of context: {mem['total']}")
        t.add_row("", f"memory: {mem['split']}; {mem['placement']}" if mem["fits"] else f"[red]memory:[/red] {mem['error']}")
    gpus = report["gpus_seen_by_os"]
    t.add_row("GPUs", ", ".join(gpus) if gpus else "none found")  # type: ignore[arg-type]
    if gpus and lc.get("gpu_offload") is False:
        t.add_row("", "[yellow]this llama.cpp build cannot use them; reinstall with LOCALINFER_BACKEND=cuda ./install.sh (or metal, vulkan)[/yellow]")
    for d in report["vulkan_devices"]:  # type: ignore[attr-defined]
        t.add_row("Vulkan device", vulkan_text(d, "Vulkan" in lc.get("backends", [])))  # type: ignore[operator]
    t.add_row("models", f"{st['models_dir']} ({st['disk_free_bytes'] / 2**30:.0f} GiB free)")
    Console().print(t)


def vulkan_text(d: dict[str, object], built: bool) -> str:
    """A Vulkan device in words, and whether a Vulkan build uses it by itself."""
    text = f"{d['index']}: {d['name']} ({d['kind']}{', ' + str(d['driver']) if d['driver'] else ''})"
    if not built:
        return text + (" [yellow](this llama.cpp build has no Vulkan backend: LOCALINFER_BACKEND=vulkan ./install.sh)[/yellow]" if d["taken_by_default"] else "")
    slower = "; the CPU engines are faster" if "software" in str(d["kind"]) else ""
    if d["used"]:
        return text + ": used for GPU offload" + ("" if d["taken_by_default"] else f" (GGML_VK_VISIBLE_DEVICES names it){slower}")
    return text + f": not used unless named (GGML_VK_VISIBLE_DEVICES={d['index']}){slower}"


def built_with(lc: dict[str, object]) -> str:
    """'CPU, RPC (worker, --rpc); no GPU backend', or 'CPU, RPC (worker, --rpc), CUDA (GPU offload)'."""
    gpus = set(lc["gpu_backends"])  # type: ignore[call-overload]
    notes = {"RPC": " (worker, --rpc)"} | {name: " (GPU offload)" for name in gpus}
    names = sorted(lc["backends"], key=lambda name: (name in gpus, name != "CPU"))  # type: ignore[call-overload]  # CPU first, GPUs last
    return ", ".join(name + notes.get(name, "") for name in names) + ("" if gpus else "; no GPU backend")


def register(app: typer.Typer) -> None:
    app.command()(doctor)
