"""Regression tests for each input that once reached a traceback or lost work (issue 9).
Every case runs the real CLI in a fresh process, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf

from localinfer.modelfile import inspect
import pytest
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

from ..conftest import cli_env, read_gguf, run_cli
from .test_errors import assert_one_line_error


def rewrite_metadata(src: Path, dst: Path, change: dict[str, MetadataDetails] | None = None, remove: tuple[str, ...] = ()) -> Path:
    """A copy of `src` with metadata keys changed or removed, written by gguf-py's own tool."""
    reader = read_gguf(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(str(dst), arch=arch, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, dict(change or {}), list(remove))
    return dst


# --- sampling ---------------------------------------------------------------------------


def test_seed_minus_one_picks_a_seed_and_reports_it() -> None:
    args = ("run", "--max-tokens", "12", "--temperature", "1", "--json")
    r = run_cli(*args, "--seed", "-1", "Tell me a story.")
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    assert isinstance(first["seed"], int) and first["seed"] >= 0
    # the reported seed reproduces the sampled answer
    again = json.loads(run_cli(*args, "--seed", str(first["seed"]), "Tell me a story.").stdout)
    assert again["text"] == first["text"] and again["seed"] == first["seed"]
    verbose = run_cli("run", "--max-tokens", "4", "--seed", "-1", "--verbose", "Hi")
    assert verbose.returncode == 0 and "seed " in verbose.stderr


def test_seed_below_minus_one_is_a_usage_error() -> None:
    assert_one_line_error(run_cli("run", "--seed", "-2", "hi"), "--seed", code=2)


# --- files that are not what they claim ----------------------------------------------------


def test_a_model_file_with_a_hostile_chat_template_fails_in_one_line(model_path: Path, tmp_path: Path) -> None:
    hostile = "{{ cycler.__init__.__globals__.os.popen('touch " + str(tmp_path / "pwned") + "').read() }}{{ 'x' * 10**10 }}"
    bad = rewrite_metadata(model_path, tmp_path / "hostile.gguf", {"tokenizer.chat_template": MetadataDetails(gguf.GGUFValueType.STRING, hostile)})
    assert_one_line_error(run_cli("run", str(bad), "Hello"), "chat template failed to render")
    assert not (tmp_path / "pwned").exists()


def test_unreadable_gguf(tmp_path: Path) -> None:
    """A file whose read fails (root can read any file, so an I/O error stands in for a permission one)."""
    link = tmp_path / "unreadable.gguf"
    link.symlink_to("/proc/self/mem")
    assert_one_line_error(run_cli("run", str(link), "hi"), "cannot read")
    assert_one_line_error(run_cli("show", str(link)), "cannot read")


def test_alignment_zero_is_corrupt_not_a_division_by_zero(model_path: Path, tmp_path: Path) -> None:
    bad = rewrite_metadata(model_path, tmp_path / "align0.gguf", {"general.alignment": MetadataDetails(gguf.GGUFValueType.UINT32, 0)})
    with pytest.raises(ValueError, match="alignment"):  # gguf-py's reader refuses it too
        gguf.GGUFReader(bad)
    for engine in ("llama.cpp", "native"):
        assert_one_line_error(run_cli("run", "--engine", engine, str(bad), "hi"), "general.alignment")
    assert_one_line_error(run_cli("show", str(bad)), "general.alignment")


def test_native_engine_names_a_missing_hyperparameter(model_path: Path, tmp_path: Path) -> None:
    bad = rewrite_metadata(model_path, tmp_path / "no-ffn.gguf", remove=("llama.feed_forward_length",))
    assert "llama.feed_forward_length" not in inspect(bad).metadata
    assert_one_line_error(run_cli("run", "--engine", "native", str(bad), "hi"), "llama.feed_forward_length")


@pytest.mark.parametrize(
    "config, needle",
    [
        ('{"model_type": "llama", "hidden_size": 64,', "not valid JSON"),
        ('["llama"]', "not a model configuration"),
        ('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}', "lacks 'hidden_size'"),
        ('{"model_type": "llama", "hidden_size": "big", "num_attention_heads": 4, "num_hidden_layers": 2, '
         '"intermediate_size": 128, "max_position_embeddings": 512}', "'hidden_size' is 'big'"),
        ('{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, '
         '"intermediate_size": 128, "max_position_embeddings": 512, "rope_scaling": 3}', "'rope_scaling' is 3"),
    ],
)  # fmt: skip
def test_bad_config_json(tmp_path: Path, config: str, needle: str) -> None:
    folder = tmp_path / "hf-model"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    r = run_cli("quantize", str(folder), "Q8_0", "-o", str(tmp_path / "out.gguf"))
    assert_one_line_error(r, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf-model"], "nothing may be left behind"


# --- the data folder ---------------------------------------------------------------------


def test_damaged_manifest_is_skipped_and_removable(isolated_home: Path) -> None:
    manifests = isolated_home / "manifests"
    manifests.mkdir(parents=True)
    (manifests / "acme_broken-GGUF.json").write_text('{"name": "acme/broken-GGUF", "path": ')
    (manifests / "wrong-shape.json").write_text('{"name": 3}')
    r = run_cli("list", "--json")
    assert r.returncode == 0, r.stderr
    assert [m["name"] for m in json.loads(r.stdout)] == ["smollm2:135m"]
    r = run_cli("run", "--max-tokens", "2", "acme/broken-GGUF", "hi")  # not pulled: a pull is tried, offline
    assert_one_line_error(r, "cannot reach the Hugging Face hub")
    r = run_cli("rm", "acme/broken-GGUF")
    assert r.returncode == 0 and "damaged" in r.stderr
    assert not (manifests / "acme_broken-GGUF.json").exists()


def test_unwritable_home(tmp_path: Path) -> None:
    """LOCALINFER_HOME under a file can never be created, even by root. Reading commands
    still work; the first write says what to do."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"LOCALINFER_HOME": str(blocker / "home")}
    assert run_cli("list", "--json", env=env).returncode == 0
    assert run_cli("run", "--max-tokens", "2", "hi", env=env).returncode == 0
    doctor = run_cli("doctor", "--json", env=env)
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)["storage"]["data_dir"] == str(blocker / "home")
    assert_one_line_error(run_cli("pull", "acme/tiny-GGUF", env=env), "cannot create the folder", "LOCALINFER_HOME")


# --- llama.cpp that does not load ------------------------------------------------------------


@pytest.fixture()
def broken_llama_cpp(tmp_path: Path) -> dict[str, str]:
    """A llama_cpp package that fails to import the way a CUDA build does on a machine without the driver."""
    pkg = tmp_path / "fake" / "llama_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "raise RuntimeError(\"Failed to load shared library '/x/libllama.so': libcuda.so.1: cannot open shared object file: No such file or directory\")\n"
    )
    return {"PYTHONPATH": str(tmp_path / "fake")}


def test_doctor_diagnoses_a_llama_cpp_that_does_not_load(broken_llama_cpp: dict[str, str]) -> None:
    r = run_cli("doctor", env=broken_llama_cpp)
    assert r.returncode == 0, r.stderr
    assert "libcuda.so.1" in r.stdout and "install.sh" in r.stdout and "Traceback" not in r.stdout + r.stderr
    report = json.loads(run_cli("doctor", "--json", env=broken_llama_cpp).stdout)
    assert "libcuda.so.1" in report["llama_cpp"]["error"]
    assert report["native_kernels"]["auto"]


@pytest.mark.parametrize("args", [["run", "hi"], ["run", "--engine", "native", "hi"], ["quantize", "x.gguf", "Q8_0"], ["eval", "smollm2:135m"]])
def test_commands_say_llama_cpp_does_not_load(broken_llama_cpp: dict[str, str], args: list[str]) -> None:
    assert_one_line_error(run_cli(*args, env=broken_llama_cpp), "libcuda.so.1", "localinfer doctor")


# --- output -------------------------------------------------------------------------------


def test_closed_stdout_ends_quietly() -> None:
    """`localinfer run ... | head -c 20`: generation stops at the first failed write, nothing on stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "localinfer", "run", "--temperature", "0", "--max-tokens", "3000", "--ctx", "4096", "Write a very long story."],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(),
    )  # fmt: skip
    assert proc.stdout.read(20)
    proc.stdout.close()  # what `head` does once it has its bytes
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 0
    assert stderr == b"", stderr.decode()


# --- memory ------------------------------------------------------------------------------------


def test_explicit_gpu_layers_on_a_cpu_build_still_checks_ram() -> None:
    assert_one_line_error(run_cli("run", "--gpu-layers", "99", "--ctx", "50000000", "hi"), "GiB of RAM")
    r = run_cli("run", "--gpu-layers", "99", "--max-tokens", "2", "hi")
    assert r.returncode == 0 and "no GPU to offload to" in r.stderr


def test_home_is_not_created_by_reading(isolated_home: Path, model_path: Path) -> None:
    assert run_cli("list").returncode == 0 and run_cli("show", str(model_path)).returncode == 0
    assert not isolated_home.exists()


# --- text that is not UTF-8 -------------------------------------------------------------------


def test_bytes_that_are_not_utf8(model_path: Path, tmp_path: Path) -> None:
    """A Latin-1 terminal or a stray byte: in the prompt, the system prompt, stdin and the
    model's file name. Each becomes U+FFFD (or stays bytes, for a path), never a traceback."""
    def cli(*args: bytes, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable.encode(), b"-m", b"localinfer", b"run", b"--max-tokens", b"2", b"--json", *args],
                              input=stdin, capture_output=True, env=cli_env(), timeout=300)  # fmt: skip

    odd_name = tmp_path / os.fsdecode(b"mod\xe8le.gguf")
    odd_name.symlink_to(model_path)
    for r in (cli(b"caf\xe9 au lait"), cli(b"--system", b"\xff", b"hi"), cli(stdin=b"caf\xe9\n"), cli(os.fsencode(odd_name), b"hi")):
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        assert json.loads(r.stdout)["text"]


# The two ways the command line starts: `python -m localinfer` (__main__.py) and the `localinfer`
# script pip writes beside the interpreter, which imports localinfer.cli.app itself.
ENTRY_POINTS = {"-m": [sys.executable, "-m", "localinfer"], "script": [str(Path(sys.executable).with_name("localinfer"))]}

# Where Ctrl-C lands: as Python starts to import each of these. app.py's own imports (threading,
# typer), main() registering the verbs, and the command's (llama.cpp's bindings); with -m also
# __main__.py's first import, the CLI itself. Python's own startup (`site`), the import of the
# `localinfer` package and (the script's first line) of localinfer.cli.app come before any line
# of ours: not tested here.
CTRL_C_AT = ["threading", "typer", "localinfer.cli.bench", "localinfer.cli.run", "llama_cpp"]
CTRL_C_CASES = [("-m", "localinfer.cli.app")] + [(entry, at) for entry in ENTRY_POINTS for at in CTRL_C_AT]

# A sitecustomize for the CLI's process that presses Ctrl-C at an exact moment of its loading,
# the same moment on every machine: a delay after starting it lands in a different phase on each
# (20 ms was inside the imports on one machine, still inside Python's own startup on another).
CTRL_C_ON_IMPORT = """
import os, sys
import _signal  # loaded with the interpreter; importing `signal` here would load it early for the CLI

AT = os.environ["LOCALINFER_TEST_CTRL_C_AT"]


def ctrl_c(event, args):
    if event == "import" and args[0] == AT:
        os.kill(os.getpid(), _signal.SIGINT)


sys.addaudithook(ctrl_c)
"""

# Ctrl-C while llama.cpp loads the model. The only Python code that runs inside that C call is
# the log callback llama.cpp calls with each line, so that is where Python runs the signal's
# handler when Ctrl-C lands during a load: this presses it at the first line logged from inside
# llama_model_load_from_file (the whole model, or the native engine's vocabulary).
CTRL_C_IN_MODEL_LOAD = """
import linecache, os, sys
import _signal


def in_the_load(frame, event, arg):
    caller = frame.f_back
    if event == "call" and frame.f_code.co_name == "_on_log" and caller is not None:
        if "llama_model_load_from_file" in linecache.getline(caller.f_code.co_filename, caller.f_lineno):
            sys.setprofile(None)
            os.kill(os.getpid(), _signal.SIGINT)


def watch_from_the_bindings(event, args):
    if event == "import" and args[0] == "llama_cpp":
        sys.setprofile(in_the_load)  # this thread only: the one that loads


sys.addaudithook(watch_from_the_bindings)
"""


def run_with_sitecustomize(entry: str, sitecustomize: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI started as `entry`, with `sitecustomize` loaded into it first."""
    (tmp_path / "sitecustomize.py").write_text(sitecustomize)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    command = [*ENTRY_POINTS[entry], *args]
    return subprocess.run(command, input="", capture_output=True, text=True, env=cli_env({"PYTHONPATH": path, **(env or {})}), timeout=300)


@pytest.mark.parametrize(("entry", "at"), CTRL_C_CASES)
def test_ctrl_c_while_the_command_line_loads_prints_no_traceback(entry: str, at: str, tmp_path: Path) -> None:
    """Before main() can catch KeyboardInterrupt (Python is still importing the CLI), Ctrl-C
    ends the process as the signal does (the shell shows 130), without a traceback."""
    import signal

    r = run_with_sitecustomize(entry, CTRL_C_ON_IMPORT, tmp_path, "run", "--max-tokens", "1", "Hi", env={"LOCALINFER_TEST_CTRL_C_AT": at})
    assert r.returncode in (130, -signal.SIGINT), f"exit {r.returncode} (was {at} imported?): {r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("engine", ["llama.cpp", "native"])
def test_ctrl_c_while_the_model_loads_stops_the_command(engine: str, tmp_path: Path) -> None:
    """Ctrl-C during llama.cpp's load used to land in its log callback, where ctypes printed
    the KeyboardInterrupt as 'Exception ignored' and the command went on to answer (exit 0)."""
    r = run_with_sitecustomize("script", CTRL_C_IN_MODEL_LOAD, tmp_path, "run", "--engine", engine, "--max-tokens", "1", "Hi")
    assert r.returncode == 130, f"exit {r.returncode} (was the model loaded by llama_model_load_from_file?): {r.stderr}"
    assert r.stdout == "", r.stdout
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
