"""`localinfer run [MODEL] [PROMPT]`: a one-shot streamed answer, or an interactive chat."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from localinfer.cli import options as opt
from localinfer.errors import ContextOverflow, ModelNotFound, OutputClosed, UserError

# The engine (numpy, llguidance, jinja2) is imported where a command runs, not here: every
# command's start imports this module, and `--help` or a bad option should not wait for it.
if TYPE_CHECKING:
    from localinfer.engine.engine import Engine
    from localinfer.engine.templates import Message
    from localinfer.engine.types import CompletionOutput, SamplingParams, Think, Timings

err = Console(stderr=True, highlight=False)
DEBUG = os.environ.get("LOCALINFER_DEBUG") == "1"  # also shows the backend's own log

HELP_INTERACTIVE = """Commands:
  /set system TEXT        set the system prompt
  /set NAME VALUE         set a sampling option (temperature, top_k, top_p, min_p,
                          repeat_penalty, repeat_last_n, presence_penalty,
                          frequency_penalty, seed, max_tokens);
                          '/set parameter NAME VALUE' works too
  /clear                  forget the conversation
  /bye                    leave (or Ctrl-D)
Ctrl-C stops an answer."""


def as_text(value: str) -> str:
    """Text as the model should see it. Python hands bytes that are not UTF-8 (a Latin-1
    terminal, a stray byte in a file name) over as lone surrogates; they become U+FFFD."""
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # surrogates that no byte made
        raw = value.encode("utf-8", "replace")
    return raw.decode("utf-8", "replace")


def read_stdin() -> str:
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8", "surrogateescape")
    return data.decode("utf-8", "replace").rstrip()  # `echo "..." |` ends with a newline the prompt never meant


def split_model_and_prompt(model: str | None, prompt: str | None) -> tuple[str | None, str | None]:
    """`run "Why is the sky blue?"` means the default model: one argument is a model only if it names one."""
    if model is None or prompt is not None:
        return model, prompt
    if any(c.isspace() for c in model):
        return None, model
    from localinfer.store.refs import resolve

    try:
        resolve(model)
        return model, None
    except ModelNotFound as e:
        if ":" in model or "did you mean" in str(e):
            raise  # looks like a mistyped model name: say so rather than answer it as a prompt
        return None, model


def model_and_prompt(first: str | None, second: str | None, model_option: str | None) -> tuple[str | None, str | None]:
    """`run MODEL PROMPT`, `run PROMPT` (the default model), or `run -m MODEL PROMPT`, where
    the one argument is the prompt (two arguments beside -m name the model twice)."""
    if model_option is None:
        return split_model_and_prompt(first, second)
    if second is not None:
        opt.one_model(first, model_option)  # raises: the model given twice
    return model_option, first


def write(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise OutputClosed from None


DIM, PLAIN = "\x1b[2m", "\x1b[0m"


class Thinking:
    """A reasoning model's thinking on a terminal, as Ollama shows it: dimmed, between
    'Thinking...' and '...done thinking.', then the answer. Hidden with --hide-thinking,
    and when stdout is not a terminal (there the answer alone is the output)."""

    def __init__(self, show: bool) -> None:
        self.show = show and sys.stdout.isatty()
        self.open = False

    def write(self, reasoning: str, text: str) -> None:
        if reasoning and self.show:
            write((f"{DIM}Thinking...\n" if not self.open else DIM) + reasoning + PLAIN)
            self.open = True
        if text:
            self.end()
            write(text)

    def end(self) -> None:
        if self.open:
            write(f"{DIM}\n...done thinking.{PLAIN}\n\n")
            self.open = False


def stream_answer(engine: Engine, tokens: list[int], params: SamplingParams, show_thinking: bool = True, media: dict | None = None) -> CompletionOutput | None:
    """Print an answer as it is generated; returns None if Ctrl-C stopped it."""
    from localinfer.engine.types import CompletionOutput

    events, thinking = engine.generate(tokens, params, media), Thinking(show_thinking)
    try:
        for event in events:
            if isinstance(event, CompletionOutput):
                thinking.end()
                write("\n")
                event.raise_error()
                return event
            thinking.write(event.reasoning, event.text)
    except KeyboardInterrupt:
        write(PLAIN + "\n" if thinking.open else "\n")
        return None
    finally:
        events.close()  # on Ctrl-C or a closed pipe: abort the request and free its KV cache now
    return None


def tell_about(engine: Engine, verbose: bool, raw: bool) -> None:
    """Before the answer, on stderr: with --verbose, the engine chosen and why and the memory
    plan; always, the plan's warnings and a base model's lack of a chat template."""
    if verbose and engine.choice is not None:
        err.print(f"[dim]engine: {engine.choice.name} ({engine.choice.reason})[/dim]", soft_wrap=True)
    if verbose and engine.projector is not None:
        err.print(f"[dim]vision: {engine.projector.describe()}[/dim]", soft_wrap=True)
    if verbose and engine.drafter is not None:
        err.print(f"[dim]draft model: {engine.drafter.name} on the {engine.drafter.backend.name} engine[/dim]", soft_wrap=True)
    if verbose and engine.memory is not None:
        err.print(f"[dim]{engine.name}: {engine.memory.describe()}; {engine.memory.placement}[/dim]", soft_wrap=True)
        if engine.memory.split:
            err.print(f"[dim]split: {engine.memory.split}[/dim]", soft_wrap=True)
    for warning in engine.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}", soft_wrap=True)
    if not raw and engine.backend.facts.chat_template is None:
        err.print("[yellow]note:[/yellow] this model has no chat template (a base model?); prompts are wrapped in ChatML. Use --raw to send them as they are.", soft_wrap=True)


def print_timings(engine: Engine, result: CompletionOutput) -> None:
    t = result.timings
    err.print(
        f"[dim]load {t.load_ms:.0f} ms | prompt {result.prompt_tokens} tokens, {t.prompt_ms:.0f} ms "
        f"({t.prompt_tokens_per_s:.1f} tok/s) | TTFT {t.ttft_ms:.0f} ms | "
        f"{result.completion_tokens} tokens, TPOT {t.tpot_ms:.2f} ms ({t.tokens_per_s:.1f} tok/s) | "
        f"seed {result.seed} | finish: {result.finish_reason}[/dim]",
        soft_wrap=True,
    )
    if result.cached_tokens:
        err.print(f"[dim]prompt cache: {cached_summary(result)}[/dim]", soft_wrap=True)
    used = engine.kv_bytes_used()
    if used is not None:
        err.print(f"[dim]KV cache {'/'.join(engine.cache_types)}: {engine.kv_cells_used} tokens, {used / 1e6:.2f} MB in use[/dim]", soft_wrap=True)
    if engine.draft is not None:
        err.print(f"[dim]speculation: {speculation_summary(t, engine.drafter.name if engine.drafter else None)}[/dim]", soft_wrap=True)
    report = engine.backend.runtime_report()
    if "kernels" in report:
        mb = lambda key: report[key] / 1e6  # noqa: E731
        kept = engine.prompt_cache.ram_bytes if engine.prompt_cache is not None else 0  # copies of KV blocks, by design
        err.print(
            f"[dim]native kernels: {report['kernels']} | weights {mb('weights_mapped'):.1f} MB mapped | "
            f"resident beyond the mapping {mb('resident_beyond_mmap'):.1f} MB "
            f"(KV cache {mb('kv_cache_used'):.1f} MB, activations {mb('activations'):.1f} MB, prompt cache in RAM {kept / 1e6:.1f} MB), "
            f"plus {mb('resident_at_load'):.1f} MB at load (vocabulary, kernels, packed weights)[/dim]",
            soft_wrap=True,
        )


def cached_summary(result: CompletionOutput) -> str:
    """'600 of 650 prompt tokens not computed: 512 from disk, 88 from the slot'."""
    where = {"slot": "the slot", "ram": "RAM", "disk": "disk"}
    parts = ", ".join(f"{n} from {where.get(tier, tier)}" for tier, n in result.cached_from.items() if n)
    return f"{result.cached_tokens} of {result.prompt_tokens} prompt tokens not computed: {parts}"


def speculation_summary(t: Timings, draft_model: str | None) -> str:
    """Drafted and accepted tokens per source, and tokens per target forward, in one line."""
    names = {"model": f"draft model {draft_model}", "lookup": "prompt lookup"}
    sources = [(names[source], drafted, accepted) for source, drafted, accepted in t.by_source() if draft_model or source != "model"]
    said = [f"{name} {accepted}/{drafted} accepted ({accepted / drafted:.0%})" if drafted else f"{name} drafted nothing" for name, drafted, accepted in sources]
    return f"{'; '.join(said)}; {t.tokens_per_forward:.2f} tokens per target forward"


JSON_TIMINGS = ("load_ms", "ttft_ms", "tpot_ms", "tokens_per_s", "prompt_ms", "prompt_tokens_per_s", "drafted", "accepted",
                "lookup_drafted", "lookup_accepted", "model_drafted", "model_accepted", "tokens_per_forward")  # fmt: skip


def as_json(engine: Engine, result: CompletionOutput) -> str:
    return json.dumps(
        {
            "model": as_text(engine.name),  # a file name may hold bytes that are not UTF-8
            "engine": engine.backend.name,
            "text": result.text,
            "reasoning": result.reasoning,
            "finish_reason": result.finish_reason,
            "seed": result.seed,
            "usage": result.usage(),
            "cached_from": result.cached_from,
            "timings": {k: round(v, 3) for k, v in result.timings.as_dict().items() if k in JSON_TIMINGS},
        },
        ensure_ascii=False,
    )


def interactive(engine: Engine, system: str | None, params: SamplingParams, verbose: bool, think: Think = True, show_thinking: bool = True) -> None:
    import readline

    from localinfer.engine.conversation import answer_room, fit_conversation
    from localinfer.paths import ensure_dir, history_file

    try:
        readline.read_history_file(history_file())
    except OSError:
        pass
    history: list[Message] = []
    err.print(f"[dim]{engine.name} — /? for help, /bye to leave[/dim]")
    while True:
        try:
            line = as_text(input(">>> "))
        except UnicodeDecodeError:
            err.print("That line is not UTF-8 text; type it again.")
            continue
        except EOFError:
            print()
            break
        except KeyboardInterrupt:
            print("\nUse Ctrl-D or /bye to exit.")
            continue
        if not line.strip():
            continue
        try:
            readline.write_history_file(ensure_dir(history_file().parent) / history_file().name)
        except (OSError, UserError):
            pass  # history is a convenience; an unwritable folder must not end the chat
        if line.startswith("/"):
            cmd, _, rest = line.strip().partition(" ")
            if cmd in ("/bye", "/exit", "/quit"):
                break
            if cmd == "/clear":
                history.clear()
                err.print("[dim]Cleared the conversation.[/dim]")
            elif cmd in ("/?", "/help"):
                print(HELP_INTERACTIVE)
            elif cmd == "/set":
                system, params = _set(rest.strip(), system, params)
            else:
                err.print(f"Unknown command '{cmd}'. Type /? for help.")
            continue
        history.append({"role": "user", "content": line})
        messages = ([{"role": "system", "content": system}] if system else []) + history
        try:
            fitted = fit_conversation(engine, messages, answer_room(engine.n_ctx, params.max_tokens), think)
        except ContextOverflow as e:
            history.pop()
            err.print(f"[red]error:[/red] {e}", soft_wrap=True)
            continue
        if fitted.dropped:
            del history[: fitted.dropped]
            err.print(f"[dim]The conversation outgrew the {engine.n_ctx}-token context: dropped the {fitted.dropped} oldest messages (the system prompt stays).[/dim]", soft_wrap=True)
        result = stream_answer(engine, fitted.tokens, params, show_thinking)
        if result is None:
            history.pop()  # an interrupted answer is not part of the conversation
            continue
        history.append({"role": "assistant", "content": result.text})
        if verbose:
            print_timings(engine, result)


def _set(args: str, system: str | None, params: SamplingParams) -> tuple[str | None, SamplingParams]:
    """`/set system TEXT` takes the rest of the line as it is (apostrophes and all);
    `/set NAME VALUE` is checked exactly as the matching command-line option is."""
    name, _, value = args.partition(" ")
    if name == "parameter":
        name, _, value = value.strip().partition(" ")
    value = value.strip()
    if not name or not value:
        err.print("Usage: /set system TEXT | /set NAME VALUE")
        return system, params
    if name == "system":
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]  # /set system "Be terse." as Ollama takes it
        err.print("[dim]Set the system prompt.[/dim]")
        return value, params
    from localinfer.engine.types import SAMPLING, BadSamplingValue, sampling_value

    if name not in SAMPLING:
        err.print(f"Unknown option '{name}'. Options: system, {', '.join(SAMPLING)}")
        return system, params
    try:
        parsed = sampling_value(name, value)
    except BadSamplingValue as e:
        err.print(f"{name} {e}")
        return system, params
    err.print(f"[dim]Set {name} to {parsed}.[/dim]")
    return system, params.with_overrides(**{name: parsed})


def run(
    model: Annotated[Optional[str], typer.Argument(help="Catalog alias, path to a .gguf, or Hugging Face owner/repo[:QUANT] (or give it with -m, and the first argument is the prompt). Default: the embedded SmolLM2-135M.", show_default=False)] = None,
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt. Without one (and nothing on stdin), starts an interactive chat.", show_default=False)] = None,
    model_option: opt.ModelOption = None,
    system: Annotated[Optional[str], typer.Option(help="System prompt.")] = None,
    temperature: opt.Temperature = None,
    top_k: opt.TopK = None,
    top_p: opt.TopP = None,
    min_p: opt.MinP = None,
    repeat_penalty: opt.RepeatPenalty = None,
    seed: opt.Seed = None,
    max_tokens: opt.MaxTokens = None,
    ctx: opt.Ctx = None,
    threads: opt.Threads = None,
    gpu_layers: opt.GpuLayers = "auto",
    cpu_moe: opt.CpuMoe = False,
    n_cpu_moe: opt.NCpuMoe = None,
    rpc: opt.Rpc = None,
    engine_name: opt.Engine = opt.ENGINE_DEFAULT,
    kernels: opt.Kernels = None,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print the engine chosen and why, memory, and timings: load, prefill, TTFT, TPOT, tokens/s.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object: model, engine, text, reasoning, finish_reason, seed, usage, timings.")] = False,
    think: opt.Think = "on",
    think_budget: opt.ThinkBudget = None,
    hide_thinking: Annotated[bool, typer.Option("--hide-thinking", help="Print a reasoning model's answer without its thinking (thinking is shown dimmed on a terminal, never in a pipe).")] = False,
    cache_type: opt.CacheType = None,
    cache_type_k: opt.CacheTypeK = None,
    cache_type_v: opt.CacheTypeV = None,
    cache_ram: opt.CacheRam = None,
    cache_disk: opt.CacheDisk = None,
    cache_dir: opt.CacheDir = None,
    no_prompt_cache: opt.NoPromptCache = False,
    draft: opt.Draft = "auto",
    draft_engine: opt.DraftEngine = None,
    draft_max: opt.DraftMax = 10,
    draft_ngram_min: opt.DraftNgramMin = 2,
    draft_ngram_max: opt.DraftNgramMax = 4,
    json_schema: opt.JsonSchema = None,
    grammar: opt.Grammar = None,
    regex: opt.Regex = None,
    image: Annotated[Optional[list[Path]], typer.Option("--image", metavar="PATH", help="An image for a vision model to read with the prompt (PNG, JPEG, WebP, GIF's first frame, BMP); repeat it for several.", show_default=False)] = None,
    mmproj: opt.Mmproj = None,
) -> None:
    """Answer a prompt with a model, streaming the text as it is generated."""
    model, prompt = model_and_prompt(model, prompt, model_option)
    prompt, system = (as_text(prompt) if prompt is not None else None), (as_text(system) if system is not None else None)
    if not sys.stdin.isatty():
        piped = read_stdin()
        if piped.strip():
            prompt = f"{prompt}\n\n{piped}" if prompt else piped
    if prompt is None and (json_out or not sys.stdin.isatty() or image):
        raise typer.BadParameter("no prompt given (pass one as an argument or on stdin)", param_hint="PROMPT")
    from localinfer.images import read_image

    images = [read_image(path) for path in image or ()]  # before the model loads: a bad one costs nothing

    from localinfer.cli.pull import progress_bar
    from localinfer.engine.loader import open_engine
    from localinfer.engine.reasoning import think_of

    load = opt.load_options(engine_name, ctx, threads, kernels, (cache_type, cache_type_k, cache_type_v), (draft, draft_max, draft_ngram_min, draft_ngram_max), gpu_layers, verbose=DEBUG, cpu_moe=opt.cpu_moe_choice(cpu_moe, n_cpu_moe), draft_engine=draft_engine, prompt_cache=opt.prompt_cache(no_prompt_cache, cache_ram, cache_disk, cache_dir), rpc=rpc, mmproj=mmproj)
    constraint = opt.constraint_choice(json_schema, grammar, regex)

    with progress_bar(enabled=not json_out) as progress:
        engine = open_engine(model, load, progress)
    if (why := engine.text_refusal()) is not None:  # before the notes a chat model gets
        engine.close()
        raise UserError(why)
    tell_about(engine, verbose, raw)
    params = engine.defaults.with_overrides(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        repeat_penalty=repeat_penalty, seed=seed, max_tokens=max_tokens, constraint=constraint, think_budget=think_budget,
    )
    thinks = think_of(think, think_budget)
    try:
        if prompt is None:
            interactive(engine, system, params, verbose, thinks, not hide_thinking)
            return
        tokens, media = prompt_tokens(engine, prompt, system, raw, thinks, images)
        if json_out:
            result = engine.complete(tokens, params, media)
            write(as_json(engine, result) + "\n")
        else:
            result = stream_answer(engine, tokens, params, not hide_thinking, media)
            if result is None:
                raise typer.Exit(130)
            if verbose:
                print_timings(engine, result)
        if constraint is not None and result.finish_reason == "length":
            err.print(f"[yellow]warning:[/yellow] the answer reached its token limit before it matched the {constraint.label}: it is incomplete (raise --max-tokens)", soft_wrap=True)
    finally:
        engine.close()


def prompt_tokens(engine: Engine, prompt: str, system: str | None, raw: bool, thinks: Think, images: list[bytes]) -> tuple[list[int], dict]:
    """The prompt's tokens (in the chat template unless raw) and its images, each standing
    before the text as llama-mtmd-cli places them."""
    from localinfer.engine.conversation import conversation_prompt
    from localinfer.engine.media import marked

    if raw:
        return engine.tokenize_media(marked(prompt, len(images)), images)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt, "images": images}]
    return conversation_prompt(engine, messages, thinks)


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=False)(run)
