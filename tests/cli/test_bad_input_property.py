"""Every command, driven with generated bad input: option values, paths that are missing,
folders, unreadable, not GGUF or truncated, and model references of every shape.

Whatever the input, the CLI must end with exit 0 (it worked), 1 (one `error:` line, a
user error) or 2 (one `error:` line, a usage error), and never print a traceback. An
exception escaping `main` fails the test with its traceback, which is the finding.

The commands run in this process (an interpreter start per case would cost a second),
on the real model and real llama.cpp. Hypothesis is derandomized, so every run tries the
same cases; values are drawn from pools that keep each case short (a few tokens, one
chunk), since a bad input fails fast and a good one must not run for minutes. CI tries a
third of the combinations the issue's sweep did; `pytest tests/cli/test_bad_input_property.py
--hypothesis-profile=long` tries them all (150 run, 45 quantize, 60 eval, 120 store cases).
"""

from __future__ import annotations

import io
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localinfer.cli.app import main

from ..quant.test_quantize_cli import write_imatrix

SETTINGS = settings(
    derandomize=True,  # seeded: the same cases on every run and in CI
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

TEXTS = ["hi", "", " ", "Why is the sky blue?", "'unbalanced", '"', "émoji 🎉", "\udcff bytes that are not UTF-8", "-", "--", "{{ raise }}", "<|im_end|>", "x" * 300]
REFS = ["smollm3:135m", "nope", "a/b", "a/b:Q4_K_M", "a/b:", "::", "/", ".", "~", "../x.gguf", "~/none.gguf", "qwen2.5:0.5b", "模型", "a" * 300]
FLAG: tuple[list[str], list[str]] = ([], [])  # an option that takes no value

@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> dict[str, str]:
    """Paths of each bad kind, plus the real model."""
    root = tmp_path_factory.mktemp("bad-input")
    (root / "folder.gguf").mkdir()
    (root / "hf-folder").mkdir()
    (root / "hf-folder" / "config.json").write_text('{"model_type": "llama"')
    (root / "empty.gguf").write_bytes(b"")
    (root / "zip.gguf").write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    (root / "magic-only.gguf").write_bytes(b"GGUF")
    (root / "header-only.gguf").write_bytes(model_path.read_bytes()[:2_000_000])
    (root / "truncated.gguf").write_bytes(model_path.read_bytes()[:60_000_000])
    (root / "text.txt").write_text("Alice was beginning to get very tired of sitting by her sister on the bank. " * 8)
    (root / "binary.txt").write_bytes(bytes(range(256)) * 4)
    (root / "unreadable.gguf").symlink_to("/proc/self/mem")
    (root / "out").mkdir()
    write_imatrix(model_path, root / "imatrix.gguf")
    paths = {p.name: str(p) for p in root.iterdir()}
    paths["missing.gguf"] = str(root / "missing.gguf")
    paths["missing-folder/"] = str(root / "missing-folder") + "/"
    paths["model"] = str(model_path)
    return paths


def invoke(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), mock.patch("sys.stdin", io.StringIO("")):
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> None:
    code, out, err = invoke(argv)
    assert "Traceback" not in out + err, (argv, err)
    assert code in (0, 1, 2), (argv, code, err)
    if code:
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], (argv, err)


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.delenv("LOCALINFER_DEBUG", raising=False)


def case(draw: st.DrawFn, parts: dict[str, tuple[list[str], list[str]]], always: tuple[str, ...] = ()) -> list[str]:
    """Arguments from `parts`: each is (good values, bad values); a name starting with '-'
    is an option, any other a positional argument (an empty string value leaves it out).
    At most one part gets a bad value, so a bad input meets an otherwise valid command
    and is checked as deep as it reaches, not only by the option parser."""
    options = [name for name in parts if name.startswith("-") and name not in always]
    chosen = [*always, *draw(st.lists(st.sampled_from(options), max_size=4, unique=True))]
    chosen += [name for name in parts if not name.startswith("-")]
    breakable = [name for name in chosen if parts[name][1]]
    broken = draw(st.one_of(st.none(), st.sampled_from(breakable))) if breakable else None  # about half the cases break nothing
    args: list[str] = []
    for name in chosen:
        good, bad = parts[name]
        if (good, bad) == FLAG:
            args.append(name)
            continue
        value = draw(st.sampled_from(bad if name == broken else good))
        if name.startswith("-"):
            args += [name, value]
        elif value != "":
            args.append(value)
    return args


def numbers(good: list[str], bad: list[str]) -> tuple[list[str], list[str]]:
    return good, bad + ["x", "", "nan", "1e309"]


Parts = dict[str, tuple[list[str], list[str]]]


def run_parts(files: dict[str, str]) -> Parts:
    return {
        # every case is short: a few tokens at most, in a small context unless the case breaks it
        "--max-tokens": numbers(["1", "2"], ["0", "-3"]), "--ctx": numbers(["64", "256", "2048"], ["0", "50000000", "99999999999999999999999"]),
        "--temperature": numbers(["0", "0.7"], ["-1", "-inf", "inf"]), "--top-k": numbers(["0", "1", "40"], ["-1", "2.5"]),
        "--top-p": numbers(["0", "0.9", "1"], ["1.5", "-0.1"]), "--min-p": numbers(["0", "0.05", "1"], ["2"]),
        "--repeat-penalty": numbers(["1", "1.3"], ["0", "-1"]), "--seed": numbers(["-1", "0", "42", "18446744073709551615"], ["-2", "1.5", "18446744073709551616"]),
        "--threads": numbers(["1", "2"], ["0", "100000", "-1"]), "--gpu-layers": (["auto", "0", "99"], ["-1", "many", ""]),
        "--engine": (["llama.cpp", "native"], ["vllm", ""]), "--kernels": (["auto", "c", "numba"], ["avx9"]),
        "--system": (TEXTS, []), "--raw": FLAG, "--json": FLAG, "--verbose": FLAG,
        "--draft": (["auto", "none", "prompt-lookup", files["model"]], REFS + ["", " "] + sorted(v for k, v in files.items() if k != "model")),
        "--draft-engine": (["native", "llama.cpp", "auto"], ["vllm", ""]),
        "model": (["", "smollm2:135m", files["model"]], REFS + sorted(v for k, v in files.items() if k != "model")),
        "prompt": ([text for text in TEXTS if text], [""]),  # no prompt at all is an error
    }  # fmt: skip


def quantize_parts(files: dict[str, str]) -> Parts:
    out_dir = Path(files["out"])
    return {
        "-o": ([str(out_dir), str(out_dir / "q.gguf")], [files["missing-folder/"], files["missing.gguf"] + "/x/y.gguf", files["model"], files["folder.gguf"] + "/"]),
        "--allow-requantize": FLAG,
        "--tensor-type": (["attn_v=Q8_0", "ffn_down=q4_0"], ["attn_v", "=Q8_0", "x=NOPE", "=", "attn_v=q8_0=x"]),
        "--imatrix": ([files["imatrix.gguf"]], [files["missing.gguf"], files["binary.txt"], files["model"], files["folder.gguf"], files["unreadable.gguf"]]),
        "--threads": numbers(["2"], ["0", "-1", "100000"]), "--leave-output-tensor": FLAG, "--json": FLAG,
        "src": ([files["model"]], REFS + sorted(v for k, v in files.items() if k != "model")),
        "type": (["Q8_0", "q4_0", "Q4_K_M"], ["IQ2_XS", "BOGUS", "", "Q4_0_4_4"]),
    }  # fmt: skip


def eval_parts(files: dict[str, str]) -> Parts:
    return {
        "--ctx": numbers(["16", "32"], ["7", "0", "1000000000"]), "--chunks": numbers(["1"], ["0", "-1"]),
        "--text": ([files["text.txt"]], [files["binary.txt"], files["missing.gguf"], files["folder.gguf"], files["empty.gguf"], files["unreadable.gguf"], files["model"]]),
        "--ref": ([files["model"], "smollm2:135m"], REFS + [files["truncated.gguf"], files["text.txt"]]),
        "--engine": (["llama.cpp", "native"], ["x"]), "--threads": numbers(["2"], ["0"]), "--json": FLAG,
        "model": (["smollm2:135m", files["model"]], REFS + sorted(v for k, v in files.items() if k != "model")),
    }  # fmt: skip


COMMANDS = {  # the parts, those in every case, and how many hypothesis combinations to try in CI
    "run": (run_parts, ("--max-tokens", "--ctx"), 50),
    "quantize": (quantize_parts, ("-o", "--allow-requantize"), 15),  # a good case quantizes: seconds each
    "eval": (eval_parts, ("--ctx", "--chunks", "--text"), 20),
}


def examples(count: int) -> int:
    """`count` at hypothesis's default profile, scaled with the one loaded (--hypothesis-profile=long: 3x)."""
    return max(1, count * settings().max_examples // 100)


def clear_outputs(files: dict[str, str]) -> None:
    for made in Path(files["out"]).iterdir():  # each case starts from an empty output folder
        shutil.rmtree(made) if made.is_dir() else made.unlink()


def each_value_once(parts: Parts, always: tuple[str, ...]) -> list[list[str]]:
    """Every value of every part at least once (hypothesis explores combinations; this makes
    sure no single value is never tried). Good values go together: case i gives every part
    its i-th good value (the first once a part has run out; flags from case 1 on), so a
    part with 13 good values costs 13 cases, not 13 more runs per part. Each bad value then
    meets the first good values of the rest, alone, so the error is its own."""
    required = [*always, *(name for name in parts if not name.startswith("-"))]
    good_rounds = max(len(good) for good, bad in parts.values() if (good, bad) != FLAG)
    choices: list[dict[str, str | None]] = []
    for i in range(good_rounds):
        chosen = {name: good[i] for name, (good, bad) in parts.items() if (good, bad) != FLAG and i < len(good)}
        chosen |= {name: None for name, part in parts.items() if part == FLAG and (i > 0 or name in required)}
        chosen |= {name: parts[name][0][0] for name in required if name not in chosen}
        choices.append(chosen)
    for name, (good, bad) in parts.items():
        for value in bad:
            chosen = {n: None if parts[n] == FLAG else parts[n][0][0] for n in required}
            chosen[name] = value
            choices.append(chosen)
    return [arguments(chosen) for chosen in choices]


def arguments(chosen: dict[str, str | None]) -> list[str]:
    """Options first (a None value: a flag), then the positional arguments ('' leaves one out)."""
    args: list[str] = []
    for name, value in chosen.items():
        if name.startswith("-"):
            args += [name] if value is None else [name, value]
    return args + [value for name, value in chosen.items() if not name.startswith("-") and value]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_value_once(files: dict[str, str], command: str) -> None:
    make, always, _ = COMMANDS[command]
    failures = []
    for args in each_value_once(make(files), always):
        try:
            check([command, *args])
        except AssertionError as e:
            failures.append(str(e)[:500])
        except Exception as e:  # noqa: BLE001 - an escaped exception is the finding; collect them all
            failures.append(f"{[command, *args]}: {type(e).__name__}: {e}"[:500])
        clear_outputs(files)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_combinations(files: dict[str, str], command: str) -> None:
    make, always, count = COMMANDS[command]
    parts = make(files)

    @settings(SETTINGS, max_examples=examples(count))
    @given(data=st.data())
    def combination(data: st.DataObject) -> None:
        check([command, *case(data.draw, parts, always)])
        clear_outputs(files)

    combination()


@settings(SETTINGS, max_examples=examples(40))
@given(data=st.data())
def test_store_commands(files: dict[str, str], data: st.DataObject) -> None:
    command = data.draw(st.sampled_from(["pull", "show", "rm", "list", "doctor", "nonsense", "--help"]))
    args = [command]
    if command in ("pull", "show", "rm"):
        args += data.draw(st.lists(st.sampled_from(["smollm2:135m", files["model"], *REFS, *files.values()]), min_size=0, max_size=2))
    for flag in data.draw(st.lists(st.sampled_from(["--json", "--all", "-a", "--frobnicate"]), max_size=2, unique=True)):
        args.append(flag)
    check(args)
