"""The flags llama.cpp users type (-ngl, -c, -t, -m, --temp, ...), through the real command
line, and every numeric option of every command refusing what is not a finite number in
its range with one line."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import httpx
import pytest
import typer

from localinfer.cli.app import _register, app

from ..conftest import run_cli
from ..server.test_serve import Server
from .test_bad_input_property import invoke
from .test_errors import assert_one_line_error

SHORT = ["-ngl", "0", "-c", "512", "-t", "1", "--temp", "0", "-n", "4", "-s", "7", "-ctk", "f16", "-ctv", "f16"]
LONG = ["--gpu-layers", "0", "--ctx", "512", "--threads", "1", "--temperature", "0", "--max-tokens", "4", "--seed", "7", "--cache-type-k", "f16", "--cache-type-v", "f16"]


def commands() -> dict[str, typer.core.TyperCommand]:
    """Every command by its words ('run', 'bench model'), as click builds it from our Typer app."""
    _register()
    found, todo = {}, [((), typer.main.get_command(app))]
    while todo:
        words, command = todo.pop()
        if hasattr(command, "commands"):
            todo += [((*words, name), sub) for name, sub in command.commands.items()]
        else:
            found[" ".join(words)] = command
    return found


def answer(*args: str) -> dict:
    r = run_cli("run", *args, "--no-prompt-cache", "--json", "Hi")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_short_forms_give_the_long_forms_answer(model_path: Path) -> None:
    long, short = answer(*LONG), answer(*SHORT)  # -ngl parsed as -n gl would fail: 'gl' is not a number
    assert (short["text"], short["usage"], short["seed"]) == (long["text"], long["usage"], long["seed"]) and long["usage"]["completion_tokens"] <= 4
    by_option = answer("-m", str(model_path), *SHORT)  # -m names the model; the one argument is the prompt
    by_argument = run_cli("run", *SHORT, "--no-prompt-cache", "--json", str(model_path), "Hi")
    assert by_argument.returncode == 0, by_argument.stderr
    assert by_option["text"] == json.loads(by_argument.stdout)["text"]


def test_the_model_given_twice_is_one_line(model_path: Path) -> None:
    for command in (["run", "-m", str(model_path), str(model_path), "Hi"], ["chat", "-m", "smollm2:135m", "smollm2:135m"], ["serve", "-m", "smollm2:135m", "smollm2:135m"]):
        assert_one_line_error(run_cli(*command), "-m/--model", "not both", code=2)


def test_serve_starts_with_the_short_forms(model_path: Path) -> None:
    server = Server("-m", str(model_path), "-ngl", "0", "-c", "256", "-np", "1")  # waits, bounded, for /health
    try:
        reply = httpx.post(server.url + "/v1/completions", json={"model": str(model_path), "prompt": "Hi", "max_tokens": 2, "temperature": 0}, timeout=120)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] <= 2
    finally:
        assert server.stop()[0] == 0


def test_help_shows_the_short_forms_and_no_option_string_is_taken_twice() -> None:
    shared = {"-ngl": "--gpu-layers", "-c": "--ctx", "-t": "--threads", "-m": "--model", "-ctk": "--cache-type-k", "-ctv": "--cache-type-v"}
    sampling = {"--temp": "--temperature", "-n": "--max-tokens", "-s": "--seed"}
    for command, short in (("run", shared | sampling), ("chat", shared | sampling), ("serve", shared | {"-np": "--parallel"})):
        text = run_cli(command, "--help").stdout
        for flag, long in short.items():
            assert f"{flag}, {long}" in text or f"{long}, {flag}" in text, (command, flag)
    for words, command in commands().items():
        taken = [name for param in command.params for name in (*param.opts, *param.secondary_opts) if name.startswith("-")]
        assert len(taken) == len(set(taken)), (words, sorted(n for n in taken if taken.count(n) > 1))


# --- numbers that are not finite, or out of range --------------------------------------------

NOT_FINITE = ["inf", "-inf", "nan", "1e999"]
HUGE = ["99999999999999999999999", "-99999999999999999999999"]
# What makes each command fail on another option once the one under test is let through,
# so a check that is missing shows as a wrong error, never as a model loaded or a port held.
POISON = {"run": ["--engine", "vllm", "Hi"], "chat": ["--engine", "vllm"], "serve": ["--engine", "vllm"], "eval": ["--engine", "vllm", "nope"],
          "worker": ["--host", "not a host"], "quantize": ["nope", "Q8_0"], "bench model": ["nope"], "bench serve": ["--url", "ftp://nowhere"],
          "doctor": ["nope"], "embed": ["--engine", "vllm", "nope"]}  # fmt: skip
# Numbers written as text, read by their callbacks or the command: (commands, option, bad values).
TEXT_NUMBERS = [
    (("run", "chat", "serve", "eval"), "-ngl", ["-1", "99999999999", "1.5", "inf"]),
    (("run", "chat", "serve"), "--cache-ram", ["inf", "nan", "-1G", "1e30G"]),
    (("run", "chat", "serve"), "--cache-disk", ["inf", "nan", "-1", "1e300"]),
    (("worker",), "--mem", ["inf", "nan", "-1G", "1e30G"]),
    (("serve",), "--keep-alive", ["99999999999999h", "inf", "nan"]),
    (("bench model",), "-p", ["-1", "99999999999", "nan"]),
    (("bench model",), "-n", ["-1", "99999999999", "inf"]),
    (("bench model",), "-d", ["-1", "99999999999", "1.5"]),
    (("bench model",), "-t", ["0", "99999999999", "inf"]),
    (("bench model",), "-ngl", ["-1", "99999999999", "inf"]),
    (("bench serve",), "-c", ["0", "99999999999", "inf"]),
    (("bench serve",), "--rate", ["inf", "nan", "0", "-1", "1e999"]),
]


def numeric_options(command: typer.core.TyperCommand) -> list[tuple[tuple[str, ...], type]]:
    """Each option of `command` that click reads as an int or a float: (its names, the type)."""
    hints = typing.get_type_hints(command.callback.__wrapped__, include_extras=True)  # type: ignore[union-attr]
    found = []
    for param in command.params:
        kind = hints[param.name]
        kind = typing.get_args(kind)[0] if typing.get_origin(kind) is typing.Annotated else kind
        kind = next((k for k in typing.get_args(kind) if k is not type(None)), kind)  # Optional[int] -> int
        if kind in (int, float) and param.opts[0].startswith("-"):
            found.append((tuple(param.opts), kind))
    return found


def refuses(argv: list[str], names: tuple[str, ...]) -> str | None:
    """None if `argv` ends in one `error:` line, exit 2, that names the option; else what happened."""
    code, out, err = invoke(argv)
    lines = [line for line in err.splitlines() if line.strip()]
    if code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and any(name in lines[0] for name in names):
        return None
    return f"{argv}: exit {code}: {err.strip()[-300:]}"


def test_every_numeric_option_of_every_command_refuses_what_is_not_a_finite_number_in_range(isolated_home: Path) -> None:
    failures, swept = [], set()
    for words, command in commands().items():
        for names, kind in numeric_options(command):
            swept.add(words)
            for value in (NOT_FINITE + ["-1e300"]) if kind is float else (HUGE + ["inf", "nan"]):
                failures.append(refuses([*words.split(), names[0], value, *POISON[words]], names))
    for which, option, values in TEXT_NUMBERS:
        for words in which:
            for value in values:
                failures.append(refuses([*words.split(), option, value, *POISON[words]], (option,)))
    failures.append(refuses(["chat", "--export", HUGE[0], "out.md"], ("--export",)))
    assert swept == {"run", "chat", "serve", "worker", "quantize", "eval", "bench model", "bench serve", "doctor", "embed"}
    assert not [f for f in failures if f], "\n".join(f for f in failures if f)



# --- doctor ------------------------------------------------------------------------------------


def test_doctor_says_which_backends_this_llama_cpp_build_has() -> None:
    """Each ggml backend built as a library of its own (libggml-cpu.so, libggml-rpc.so,
    libggml-cuda.so, ...) beside llama.cpp is the reference: doctor names each, and a GPU
    only where one of them drives a GPU (the RPC backend alone once made it say 'GPU offload: yes')."""
    import llama_cpp

    libraries = Path(llama_cpp.__file__).parent / "lib"
    built = {path.name.split(".")[0].removeprefix("libggml-") for path in libraries.glob("libggml-*")} - {"base"}
    gpus = built - {"cpu", "rpc", "blas"}
    report = json.loads(run_cli("doctor", "--json").stdout)
    assert {name.lower().replace("rocm", "hip") for name in report["llama_cpp"]["backends"]} == built
    assert report["llama_cpp"]["gpu_offload"] is bool(gpus) and report["engines"]["llama.cpp"]["gpu_offload"] is bool(gpus)
    text = run_cli("doctor", env={"COLUMNS": "250"}).stdout.splitlines()
    line = next(line for line in text if line.startswith("llama.cpp "))
    assert "built with CPU" in line and ("RPC (worker, --rpc)" in line) is ("rpc" in built)
    assert ("no GPU backend" in line) is not gpus and ("GPU offload" in line) is bool(gpus)
    engine = next(line for line in text if line.startswith("llama.cpp engine"))
    assert engine.rstrip().endswith(f"GPU offload: {'yes' if gpus else 'no'}")


def test_doctor_lists_the_vulkan_devices_and_which_a_vulkan_build_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`vulkaninfo --summary` (faked, as install.sh's tests fake it) lists a discrete GPU and
    Mesa's software device: doctor names both, and says a Vulkan build takes the GPU by itself
    and the software device only where GGML_VK_VISIBLE_DEVICES names it (ggml's own rule)."""
    import os

    from localinfer.devices import parse_vulkan_summary

    summary = "Devices:\n========\n"
    for i, (kind, name, driver) in enumerate([("PHYSICAL_DEVICE_TYPE_DISCRETE_GPU", "AMD Radeon RX 7800 XT (RADV NAVI32)", "radv"),
                                              ("PHYSICAL_DEVICE_TYPE_CPU", "llvmpipe (LLVM 15.0.6, 256 bits)", "llvmpipe")]):  # fmt: skip
        summary += f"GPU{i}:\n\tapiVersion         = 1.3.230\n\tdeviceType         = {kind}\n\tdeviceName         = {name}\n\tdriverName         = {driver}\n"
    fake = tmp_path / "vulkaninfo"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{summary}EOF\n")
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "250", "GGML_VK_VISIBLE_DEVICES": ""}
    report = json.loads(run_cli("doctor", "--json", env=env).stdout)
    gpu, software = report["vulkan_devices"]
    assert (gpu["index"], gpu["name"], gpu["kind"], gpu["driver"], gpu["taken_by_default"]) == (0, "AMD Radeon RX 7800 XT (RADV NAVI32)", "discrete GPU", "radv", True)
    assert (software["index"], software["kind"], software["taken_by_default"]) == (1, "software, on the CPU", False)
    assert not gpu["used"] and not software["used"]  # GGML_VK_VISIBLE_DEVICES names none: ggml takes none
    lines = [line.strip() for line in run_cli("doctor", env=env).stdout.splitlines() if line.startswith("Vulkan device")]
    built = "Vulkan" in report["llama_cpp"]["backends"]
    assert len(lines) == 2 and "AMD Radeon RX 7800 XT" in lines[0] and "llvmpipe" in lines[1]
    assert "used for GPU offload" not in lines[0] and ("LOCALINFER_BACKEND=vulkan ./install.sh" in lines[0]) is not built
    assert ("GGML_VK_VISIBLE_DEVICES=1" in lines[1]) is built and "install.sh" not in lines[1]
    named = json.loads(run_cli("doctor", "--json", env=env | {"GGML_VK_VISIBLE_DEVICES": "1"}).stdout)["vulkan_devices"]
    assert [d["used"] for d in named] == [False, True]
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES", raising=False)
    assert [d.used for d in parse_vulkan_summary(summary)] == [True, False]  # nothing named: the discrete GPU alone, as ggml takes it
