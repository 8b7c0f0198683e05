"""Option parsers and checks shared by the commands that load a model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer


def gpu_layers(value: str) -> int | str:
    if value in ("auto", "all"):
        return value
    try:
        n = int(value)
    except ValueError:
        raise typer.BadParameter(f"'{value}' is not a number of layers, 'all' or 'auto'") from None
    if not 0 <= n <= MAX_CTX:
        raise typer.BadParameter(f"must be between 0 and {MAX_CTX} (or 'all', or 'auto'), not {n}")
    return n


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"  # as engine/types.py number(), without loading the engine


def _finite(value: float) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, not {value}")


def at_least(minimum: float):
    """A check that a number is finite and at least `minimum`."""

    def check(value: float | None) -> float | None:
        if value is not None:
            _finite(value)
            if not value >= minimum:
                raise typer.BadParameter(f"must be at least {_number(minimum)}, not {_number(value)}")
        return value

    return check


def between(low: float, high: float):
    def check(value: float | None) -> float | None:
        if value is not None:
            _finite(value)
            if not low <= value <= high:
                raise typer.BadParameter(f"must be between {_number(low)} and {_number(high)}, not {_number(value)}")
        return value

    return check


def sampling(name: str):
    """The check of a sampling option: the engine's table (engine/types.py SAMPLING), whose
    refusal becomes a usage error naming the option."""

    def check(value: float | None) -> float | None:
        from localinfer.engine.types import SAMPLING, BadSamplingValue  # here: the engine (numpy) loads when a command runs

        if value is None:
            return None
        try:
            return SAMPLING[name].check(value)
        except BadSamplingValue as e:
            raise typer.BadParameter(str(e)) from None

    return check


# The sampling options of the commands that answer prompts (run, chat); one definition each,
# so their --help agrees. Each is checked against the engine's table, as `/set` and the API are.
Temperature = Annotated[Optional[float], typer.Option("--temperature", "--temp", help="Sampling temperature; 0 is greedy. [default: the model's, else 0.8]", callback=sampling("temperature"), show_default=False)]
TopK = Annotated[Optional[int], typer.Option("--top-k", help="Keep the K most likely tokens; 0 disables.", callback=sampling("top_k"), show_default=False)]
TopP = Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling mass; 1 disables.", callback=sampling("top_p"), show_default=False)]
MinP = Annotated[Optional[float], typer.Option("--min-p", help="Drop tokens below this fraction of the top probability.", callback=sampling("min_p"), show_default=False)]
RepeatPenalty = Annotated[Optional[float], typer.Option("--repeat-penalty", help="Penalty for recently seen tokens; 1 disables.", callback=sampling("repeat_penalty"), show_default=False)]
Seed = Annotated[Optional[int], typer.Option("--seed", "-s", help="Random seed, for reproducible sampling; -1 picks one (reported by --verbose and --json).", callback=sampling("seed"), show_default=False)]
MaxTokens = Annotated[Optional[int], typer.Option("--max-tokens", "-n", help="Stop after this many tokens. [default: until the model stops or the context is full]", callback=sampling("max_tokens"), show_default=False)]


# The model as llama.cpp's tools take it (-m), beside the MODEL argument of run, chat and serve.
ModelOption = Annotated[Optional[str], typer.Option("--model", "-m", help="The model, as the MODEL argument takes it (llama.cpp's -m): give one or the other.", show_default=False)]


def one_model(argument: str | None, option: str | None) -> str | None:
    """The model named by the MODEL argument or by -m/--model; BadParameter if both name one."""
    if argument is not None and option is not None:
        raise typer.BadParameter(f"give the model once: -m '{option}' or the argument '{argument}', not both", param_hint="-m/--model")
    return option if option is not None else argument


# More threads than this is a typo, and would make OpenMP or ggml try to start them all.
MAX_THREADS = 1024
threads = between(1, MAX_THREADS)
# The most tokens a context holds: llama.cpp's int32 (engine/types.py MAX_COUNT, not imported
# here so that --help does not load the engine).
MAX_CTX = 2**31 - 1


def backend_name(value: str) -> str:
    from localinfer.backends import BACKENDS

    if value not in BACKENDS:
        raise typer.BadParameter(f"'{value}' is not one of: {', '.join(BACKENDS)}")
    return value


def engine_name(value: str) -> str:
    return value if value == "auto" else backend_name(value)


def kernel_set(value: str | None) -> str | None:
    from localinfer_native import KERNEL_SETS

    if value is not None and value not in KERNEL_SETS:
        raise typer.BadParameter(f"'{value}' is not one of: {', '.join(KERNEL_SETS)}")
    return value


POOLINGS = ("mean", "cls", "last", "rank")  # what --pooling may ask for instead of a file's own


def pooling_choice(value: str | None) -> str | None:
    if value is not None and value not in POOLINGS:
        raise typer.BadParameter(f"'{value}' is not one of {', '.join(POOLINGS)}")
    return value


# The options of every command that loads a model (run, chat, serve, eval): one definition
# each, so their --help agrees, and one place (load_options) that turns them into LoadOptions.
Engine = Annotated[str, typer.Option("--engine", help="Inference engine: auto (native where it runs the model's architecture and tensor types, no layer goes to a GPU and llama.cpp was not measured faster; else llama.cpp; --verbose says which and why), native (localinfer's own, CPU) or llama.cpp.", callback=engine_name)]
Mmproj = Annotated[Optional[str], typer.Option("--mmproj", metavar="FILE|none", help="A vision model's projector (llama.cpp's mmproj GGUF), to read images; none: text alone. [default: an mmproj-*.gguf beside the model file, where one pairs with it]", show_default=False)]
Kernels = Annotated[Optional[str], typer.Option("--kernels", envvar="LOCALINFER_KERNELS", help="Native engine kernels: auto (C where it compiled, else Numba), c, or numba. [default: auto]", callback=kernel_set, show_default=False)]
Threads = Annotated[Optional[int], typer.Option("--threads", "-t", envvar="LOCALINFER_THREADS", help="CPU threads. [default: physical cores]", callback=threads)]
Ctx = Annotated[Optional[int], typer.Option("--ctx", "-c", help="Context of each sequence in tokens, prompt and answer together. [default: the model's, at most 4096]", callback=between(16, MAX_CTX))]
GpuLayers = Annotated[str, typer.Option("--gpu-layers", "-ngl", help="Layers to offload to the GPU, 'all', or 'auto' to fit free VRAM (engines that offload: llama.cpp).", callback=gpu_layers)]
ENGINE_DEFAULT = "auto"
# A mixture of experts beside a GPU: its experts kept in RAM, as llama.cpp's flags of these names do.
CpuMoe = Annotated[bool, typer.Option("--cpu-moe", help="A mixture of experts beside a GPU: keep every layer's experts in RAM and the rest of the model on the GPU (llama.cpp's --cpu-moe). [default: planned with --gpu-layers auto]")]
NCpuMoe = Annotated[Optional[int], typer.Option("--n-cpu-moe", "-ncmoe", metavar="N", callback=between(0, MAX_CTX), show_default=False,
    help="A mixture of experts beside a GPU: keep the experts of the first N layers in RAM (llama.cpp's --n-cpu-moe). [default: as few as fit beside the GPU's layers]")]  # fmt: skip


def cpu_moe_choice(every: bool, first: int | None) -> int | str:
    """LoadOptions.cpu_moe from --cpu-moe and --n-cpu-moe: "all", N, or "auto" (planned)."""
    if every and first is not None:
        raise typer.BadParameter("give --cpu-moe (every layer's experts) or --n-cpu-moe N (the first N layers'), not both", param_hint="--n-cpu-moe")
    return "all" if every else first if first is not None else "auto"


def rpc_endpoints(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, tuple):
        return value
    from localinfer.backends.rpc.endpoints import parse_endpoints
    from localinfer.errors import UserError

    try:
        return parse_endpoints(value)
    except UserError as e:
        raise typer.BadParameter(str(e)) from None


Rpc = Annotated[Optional[str], typer.Option("--rpc", metavar="HOST:PORT[,HOST:PORT...]", envvar="LOCALINFER_RPC", callback=rpc_endpoints, show_default=False,
    help="Split the model's layers across this machine and these workers ('localinfer worker' on each, reachable only inside a trusted network): each holds the last layers that fit what it offers, this machine the rest, on its CPU. llama.cpp engine only.")]  # fmt: skip


def draft_mode(value: str) -> str:
    if not value.strip():
        raise typer.BadParameter("give a draft model, or one of: auto, prompt-lookup, none")
    return value


def on_off(value: str) -> str:
    if value not in ("on", "off"):
        raise typer.BadParameter(f"'{value}' is not on or off")
    return value


def think_level(value: str) -> str:
    if value not in ("on", "off", "low", "medium", "high"):
        raise typer.BadParameter(f"'{value}' is not on, off, low, medium or high")
    return value


# Reasoning models, on the commands that chat (run, chat).
Think = Annotated[str, typer.Option("--think", metavar="on|off|low|medium|high", help="Let a reasoning model (Qwen3, DeepSeek-R1 distills, gpt-oss) think before it answers: on or off (its template's enable_thinking, or the think block closed at once; gpt-oss always reasons, off is its low), or how hard: low, medium or high (the template's reasoning_effort, gpt-oss's; on for the others).", callback=think_level)]
ThinkBudget = Annotated[Optional[int], typer.Option("--think-budget", help="Most tokens a reasoning model may think; then localinfer closes the think block and the model answers. 0: do not think. [default: no limit]", callback=between(0, MAX_CTX), show_default=False)]


# Speculation, on every command that decodes (run, chat, serve); one definition, so their --help agrees.
Draft = Annotated[str, typer.Option("--draft", metavar="MODEL|auto|prompt-lookup|none", callback=draft_mode,
    help="Speculative decoding, lossless at any temperature, each source switched off where it would not pay: a draft MODEL (a small model of the same vocabulary: catalog alias, file or hub repo) proposes tokens the model verifies in one forward, beside prompt-lookup (drafts copied from the prompt and answer so far); auto: the catalog's draft for the model where it is downloaded, else prompt lookup; prompt-lookup alone; or none.")]  # fmt: skip
DraftEngine = Annotated[Optional[str], typer.Option("--draft-engine", help="Engine of the draft model: native or llama.cpp (native drafts a small model fastest, also for a llama.cpp model). [default: the model's]", callback=lambda v: None if v in (None, "auto") else backend_name(v), show_default=False)]
DraftMax = Annotated[int, typer.Option("--draft-max", help="Most tokens drafted per step.", callback=between(1, 32))]
DraftNgramMin = Annotated[int, typer.Option("--draft-ngram-min", help="Shortest n-gram looked up to draft from.", callback=between(1, 16))]
DraftNgramMax = Annotated[int, typer.Option("--draft-ngram-max", help="Longest n-gram looked up to draft from.", callback=between(1, 16))]


def draft_config(mode: str, max_draft: int, ngram_min: int, ngram_max: int):  # -> DraftConfig | None
    """The engine's speculation settings from the options (a draft model's name aside);
    BadParameter if they contradict."""
    if mode == "none":
        return None
    if ngram_min > ngram_max:
        raise typer.BadParameter(f"--draft-ngram-min ({ngram_min}) is more than --draft-ngram-max ({ngram_max})")
    from localinfer.engine.speculative import DraftConfig

    return DraftConfig(ngram_min=ngram_min, ngram_max=ngram_max, max_draft=max_draft)


def cache_type(value: str | None) -> str | None:
    from localinfer.kvtypes import KV_TYPES

    if value is not None and value not in (*KV_TYPES, "auto"):
        raise typer.BadParameter(f"'{value}' is not a KV-cache type: f16, q8_0, q4_0 (llama.cpp also q4_1, q5_0, q5_1, iq4_nl), or auto")
    return value


# The KV cache's element types, on every command that loads a model to decode or score.
CacheType = Annotated[Optional[str], typer.Option("--cache-type", help="KV-cache type of K and V: f16 (default), q8_0, q4_0 (llama.cpp also q4_1, q5_0, q5_1, iq4_nl), or auto: f16 if it fits in memory, else q8_0, else q4_0.", callback=cache_type, show_default=False)]
CacheTypeK = Annotated[Optional[str], typer.Option("--cache-type-k", "-ctk", help="KV-cache type of K alone (overrides --cache-type).", callback=cache_type, show_default=False)]
CacheTypeV = Annotated[Optional[str], typer.Option("--cache-type-v", "-ctv", help="KV-cache type of V alone (overrides --cache-type; a quantized V turns on flash attention on llama.cpp).", callback=cache_type, show_default=False)]


MAX_BYTES = 2**63 - 1  # what a signed 64-bit size holds (ctypes, os, the memory plan)


def byte_size(value: str | None) -> int | None:
    """'512M', '4G', '1.5GB', '0' (none) or plain bytes, as a number of bytes."""
    if value is None:
        return None
    text = value.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:], 1)
    try:
        size = float(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        size = math.nan
    if not math.isfinite(size):
        raise typer.BadParameter(f"'{value}' is not a size (like 512M or 4G; 0 for none)")
    if not 0 <= size <= MAX_BYTES:
        raise typer.BadParameter(f"'{value}' is {'negative' if size < 0 else 'more than 8 EiB'}")
    return int(size)


# The prompt cache (engine/prompt_cache.py), on every command that loads a model.
CacheRam = Annotated[Optional[str], typer.Option("--cache-ram", metavar="SIZE", help="Prompt cache in RAM: the most its KV blocks take (512M, 2G; 0: none). [default: 5 % of free RAM, at most 2G]", callback=byte_size, show_default=False)]
CacheDisk = Annotated[Optional[str], typer.Option("--cache-disk", metavar="SIZE", help="Prompt cache on disk, which lasts across restarts: the most its folder holds (0: none). [default: 4G]", callback=byte_size, show_default=False)]
CacheDir = Annotated[Optional[Path], typer.Option("--cache-dir", help="The prompt cache's folder. [default: the data folder's prompt-cache]", show_default=False)]
NoPromptCache = Annotated[bool, typer.Option("--no-prompt-cache", help="Keep no KV blocks across requests and restarts: only what a slot still holds is reused.")]


def prompt_cache(off: bool, ram: int | None, disk: int | None, folder: Path | None):  # -> CacheOptions
    """CacheOptions from the options (the sizes already in bytes: byte_size is their callback)."""
    from localinfer.engine.prompt_cache import CacheOptions

    return CacheOptions(enabled=not off, ram_bytes=ram, disk_bytes=disk, folder=folder)


def cache_choice(both: str | None, k: str | None, v: str | None) -> tuple[str | None, str | None] | str:
    """(K type, V type), None where not given (the catalog's default, else f16), or "auto";
    BadParameter if auto is mixed with explicit types."""
    if "auto" in (k, v) or (both == "auto" and (k or v)):
        raise typer.BadParameter("'auto' picks K and V together: give it to --cache-type alone")
    if both == "auto":
        return "auto"
    return (k or both, v or both)


JsonSchema = Annotated[Optional[str], typer.Option("--json-schema", help="Answer in JSON that matches this JSON schema: a file, or the schema itself ('{\"type\": \"object\"}' for any JSON object).", show_default=False)]
Grammar = Annotated[Optional[str], typer.Option("--grammar", help="Answer in this grammar: a GBNF file as llama.cpp writes them (a Lark grammar works too).", show_default=False)]
Regex = Annotated[Optional[str], typer.Option("--regex", help="Answer with text the whole of which matches this regular expression.", show_default=False)]


def constraint_choice(json_schema: str | None, grammar: str | None, regex: str | None):  # -> Constraint | None
    """The structured-output option given (one at most), read and checked before a model loads."""
    from pathlib import Path

    from localinfer.engine.constraints import Constraint

    given = [name for name, value in (("--json-schema", json_schema), ("--grammar", grammar), ("--regex", regex)) if value is not None]
    if len(given) > 1:
        raise typer.BadParameter(f"give one of {', '.join(given)}, not both", param_hint=given[1])
    if json_schema is not None:
        text = json_schema
        if not text.lstrip().startswith(("{", "[")):
            try:
                text = Path(json_schema).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise typer.BadParameter(f"not a JSON schema, nor a file to read one from: {e}", param_hint="--json-schema") from None
        return Constraint.json_schema(text).check()
    if grammar is not None:
        try:
            text = Path(grammar).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise typer.BadParameter(f"cannot read the grammar file: {e}", param_hint="--grammar") from None
        return Constraint("grammar", text).check()
    if regex is not None:
        return Constraint("regex", regex).check()
    return None


def load_options(engine: str, ctx: int | None, threads: int | None, kernels: str | None, cache: tuple[str | None, str | None, str | None],
                 draft: tuple[str, int, int, int] = ("none", 10, 2, 4), gpu_layers: int | str = "auto", **more: object):  # fmt: skip  # -> LoadOptions
    """LoadOptions from the shared options: `cache` is (--cache-type, -k, -v), `draft` is
    (--draft, --draft-max, --draft-ngram-min, --draft-ngram-max); `more` sets the rest
    (n_seq_max, verbose, prefill_chunk, decode_slowdown, draft_engine, cpu_moe)."""
    from localinfer.engine.loader import LoadOptions

    model = None if draft[0] in ("prompt-lookup", "none") else draft[0]
    return LoadOptions(engine=engine, ctx=ctx, threads=threads, gpu_layers=gpu_layers, kernels=kernels, draft=draft_config(*draft), draft_model=model,
                       cache=cache_choice(*cache), **more)  # type: ignore[arg-type]  # fmt: skip
