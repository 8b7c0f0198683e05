"""`localinfer quantize` as a user runs it: llama.cpp's quantizer on real models, an
atomic output that runs at once, and one-line errors that leave nothing behind."""

from __future__ import annotations

import json
import signal
from collections import Counter
import subprocess
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType, GGUFReader

from localinfer.modelfile import inspect

from ..conftest import run_cli, start_cli


def model_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(".gguf") or ".partial" in p.name)


def test_f32_to_q4_k_m_runs_at_once(f32_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "small.gguf"
    result = run_cli("quantize", str(f32_path), "Q4_K_M", "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["output_bytes"] == out.stat().st_size < summary["source_bytes"] / 4
    assert summary["source_tensor_types"] == dict(Counter(t.tensor_type.name for t in GGUFReader(f32_path).tensors))
    assert {"Q4_K", "Q6_K"} <= set(inspect(out).tensor_types)
    assert model_files(tmp_path) == [out]
    answer = run_cli("run", str(out), "--max-tokens", "8", "--temperature", "0", "Hi")
    assert answer.returncode == 0 and answer.stdout.strip(), answer.stderr


def test_table_and_tensor_type_override(f32_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "q4_0-v8.gguf"
    result = run_cli("quantize", str(f32_path), "Q4_0", "-o", str(out), "--tensor-type", "attn_v=Q8_0")
    assert result.returncode == 0, result.stderr
    assert "before" in result.stdout and "after" in result.stdout and f"wrote {out}" in result.stdout

    types = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
    assert types["blk.0.attn_v.weight"] == "Q8_0" and types["blk.0.attn_q.weight"] == "Q4_0"


def test_requantizing_needs_a_flag_and_warns(model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "requant.gguf"
    refused = run_cli("quantize", str(model_path), "Q8_0", "-o", str(out))
    assert refused.returncode == 1
    source = inspect(model_path).tensors
    quantized = ", ".join(sorted({GGMLQuantizationType(t.type).name for t in source} - {"F32", "F16", "BF16"}))
    assert refused.stderr.strip().splitlines() == [
        f"error: {model_path.name} is already quantized ({quantized}); quantize from an F16/BF16/F32 source, or pass --allow-requantize"
    ]
    assert model_files(tmp_path) == []
    allowed = run_cli("quantize", str(model_path), "Q8_0", "-o", str(out), "--allow-requantize", "--json")
    assert allowed.returncode == 0, allowed.stderr
    assert "warning:" in allowed.stderr and "already quantized" in allowed.stderr
    # llama.cpp quantizes every matrix and keeps the vectors (norms) in F32
    assert inspect(out).tensor_types == dict(Counter("Q8_0" if len(t.shape) > 1 else "F32" for t in source).most_common())


@pytest.mark.parametrize(
    "args, message",
    [
        (["{f32}", "Q9_X"], "error: unknown quantization type 'Q9_X'; choose one of: "),
        (["{readme}", "Q4_0"], "is not a GGUF model file"),
        (["{tmp}", "Q4_0"], "is a folder without config.json: not a Hugging Face model"),
        (["{f32}", "Q4_0", "-o", "{tmp}/no/such/dir/out.gguf"], "cannot write"),
        (["no-such-model:1b", "Q4_0"], "error: no such file, folder or downloaded model: no-such-model:1b"),
        (["{f32}", "Q4_0", "--tensor-type", "attn_v"], "'attn_v' is not PATTERN=TYPE"),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(args: list[str], message: str, f32_path: Path, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# not a model\n")
    filled = [a.format(f32=f32_path, readme=readme, tmp=tmp_path) for a in args]
    result = run_cli("quantize", *filled, "-o", str(tmp_path / "out.gguf")) if "-o" not in args else run_cli("quantize", *filled)
    assert result.returncode in (1, 2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert model_files(tmp_path) == []


def test_ctrl_c_leaves_no_model(f32_path: Path, tmp_path: Path) -> None:
    """Ctrl-C while llama.cpp writes: exit 130, no traceback, no file. The job takes about a
    second here, so on a busy machine the signal can land after it finished (the model is then
    complete and valid); that attempt does not count and the test tries again."""
    for _ in range(3):
        proc = start_cli("quantize", str(f32_path), "Q6_K", "-o", str(tmp_path / "out.gguf"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not any(".partial" in p.name for p in tmp_path.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.02)  # wait until llama.cpp is writing
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        if (tmp_path / "out.gguf").exists():
            (tmp_path / "out.gguf").unlink()  # too late: it had finished
            continue
        # 130 from main()'s handler, or death by SIGINT itself if it landed before main()
        # installed it (cli/__init__.py): a shell shows 130 for both
        assert proc.returncode in (130, -signal.SIGINT), stderr
        assert b"Traceback" not in stderr
        assert model_files(tmp_path) == []
        return
    pytest.fail("the quantizer finished before every Ctrl-C")


def write_imatrix(model: Path, out: Path) -> Path:
    """An importance matrix in llama-imatrix's GGUF layout (NAME.in_sum2, NAME.counts),
    with made-up statistics: enough to see the quantizer take it."""
    import numpy as np
    from gguf import GGUFWriter

    rng = np.random.default_rng(0)
    w = GGUFWriter(str(out), "llama")
    w.add_type("imatrix")
    for t in GGUFReader(model).tensors:
        if len(t.shape) == 2 and t.name != "token_embd.weight":
            cols = int(t.shape[0])
            w.add_tensor(t.name + ".in_sum2", (rng.random(cols) * 10).astype(np.float32).reshape(1, cols))
            w.add_tensor(t.name + ".counts", np.array([[5.0]], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_imatrix_changes_the_quantization(f32_path: Path, tmp_path: Path) -> None:
    imatrix = write_imatrix(f32_path, tmp_path / "imatrix.gguf")
    plain, weighted = tmp_path / "plain.gguf", tmp_path / "weighted.gguf"
    assert run_cli("quantize", str(f32_path), "Q4_K_M", "-o", str(plain), "--json").returncode == 0
    result = run_cli("quantize", str(f32_path), "Q4_K_M", "-o", str(weighted), "--imatrix", str(imatrix), "--json")
    assert result.returncode == 0, result.stderr
    a = {t.name: bytes(t.data) for t in GGUFReader(plain).tensors}
    b = {t.name: bytes(t.data) for t in GGUFReader(weighted).tensors}
    assert sum(a[name] != b[name] for name in a) > len(a) // 2


def test_types_that_need_an_imatrix_say_so(f32_path: Path, tmp_path: Path) -> None:
    result = run_cli("quantize", str(f32_path), "IQ2_XS", "-o", str(tmp_path / "iq.gguf"))
    assert result.returncode == 1
    # what llama.cpp itself says when asked directly, without an imatrix
    import ctypes

    import llama_cpp

    from localinfer.backends.llamacpp import log_listener

    said: list[str] = []
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_IQ2_XS
    with log_listener(said.append):
        rc = llama_cpp.llama_model_quantize(str(f32_path).encode(), str(tmp_path / "direct.gguf").encode(), ctypes.byref(params))
    (tmp_path / "direct.gguf").unlink(missing_ok=True)
    llama_error = [line.strip() for line in said if "imatrix" in line][-1]
    assert rc != 0
    assert result.stderr.strip().splitlines() == [f"error: llama.cpp could not quantize {f32_path.name}: {llama_error}"]
    assert model_files(tmp_path) == []
    bad = run_cli("quantize", str(f32_path), "Q4_K_M", "-o", str(tmp_path / "q.gguf"), "--imatrix", str(f32_path.parent / "missing.dat"))
    assert bad.returncode == 1 and bad.stderr.startswith("error: cannot read the importance matrix")


def test_hugging_face_folder_is_converted_then_quantized(hf_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "from-hf.gguf"
    result = run_cli("quantize", str(hf_folder), "Q8_0", "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    assert set(inspect(out).tensor_types) == {"Q8_0", "F32"}
    answer = run_cli("run", str(out), "--max-tokens", "8", "--temperature", "0", "Hi")
    assert answer.returncode == 0 and answer.stdout.strip(), answer.stderr


def test_unsupported_architecture_in_a_folder_is_one_line(hf_folder: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "neox"
    shutil.copytree(hf_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config))
    result = run_cli("quantize", str(folder), "Q8_0", "-o", str(tmp_path / "out.gguf"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and ("gpt_neox" in lines[0] or "GPTNeoX" in lines[0]), result.stderr
    assert model_files(tmp_path) == []


def test_leave_output_tensor(model_path: Path, tmp_path: Path) -> None:
    """On an untied model (a tiny random qwen2 with the embedded vocabulary), output.weight
    keeps its F32 with --leave-output-tensor and is quantized without it."""
    import numpy as np

    from ..native.test_architectures import tiny_model, vocabulary_of

    src = tiny_model(tmp_path / "tiny-qwen2.gguf", "qwen2", vocabulary_of(model_path), 4, 2, np.random.default_rng(0))
    types = {}
    for flag in ([], ["--leave-output-tensor"]):
        out = tmp_path / f"q8{len(flag)}.gguf"
        result = run_cli("quantize", str(src), "Q8_0", "-o", str(out), "--json", *flag)
        assert result.returncode == 0, result.stderr
        types[bool(flag)] = next(GGMLQuantizationType(t.type).name for t in inspect(out).tensors if t.name == "output.weight")
    assert types == {False: "Q8_0", True: "F32"}


def test_mxfp4_moe_on_a_mixture_of_experts(model_path: Path, tmp_path: Path) -> None:
    """llama.cpp's MXFP4_MOE, one of the types the command takes from llama.cpp: on a tiny
    qwen3moe the expert tensors become MXFP4, the routers stay F32, the rest is Q8_0; and
    the file answers (the llama.cpp engine: the native one has no MXFP4 kernels yet)."""
    import numpy as np

    from ..native.test_architectures import N_LAYER, first_tokens, tiny_model, vocabulary_of

    src = tiny_model(tmp_path / "tiny-qwen3moe.gguf", "qwen3moe", first_tokens(vocabulary_of(model_path), 1024), 4, 2, np.random.default_rng(0))
    out = tmp_path / "mxfp4.gguf"
    result = run_cli("quantize", str(src), "MXFP4_MOE", "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    types = {t.name: GGMLQuantizationType(t.type).name for t in inspect(out).tensors if len(t.shape) > 1}
    assert {name for name, qtype in types.items() if qtype == "MXFP4"} == {f"blk.{i}.ffn_{kind}_exps.weight" for i in range(N_LAYER) for kind in ("gate", "up", "down")}
    assert {name for name, qtype in types.items() if qtype == "F32"} == {f"blk.{i}.ffn_gate_inp.weight" for i in range(N_LAYER)}
    assert set(types.values()) == {"MXFP4", "F32", "Q8_0"}
    answer = run_cli("run", str(out), "--engine", "llama.cpp", "--raw", "--max-tokens", "4", "--temperature", "0", "Hello")
    assert answer.returncode == 0, answer.stderr


def test_bf16_source(f32_path: Path, tmp_path: Path) -> None:
    import llama_cpp

    from ..conftest import llama_quantize

    bf16 = llama_quantize(f32_path, tmp_path / "bf16.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_BF16)
    assert "BF16" in inspect(bf16).tensor_types
    result = run_cli("quantize", str(bf16), "Q8_0", "-o", str(tmp_path / "q8.gguf"), "--json")
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr  # a float source: no warning


def test_output_folder_gets_the_default_name(f32_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    result = run_cli("quantize", str(f32_path), "Q8_0", "-o", str(folder), "--json")
    assert result.returncode == 0, result.stderr
    expected = folder / "smollm2-135m-Q8_0.gguf"  # the source's name without its -f32, then the type
    assert json.loads(result.stdout)["output"] == str(expected)
    assert model_files(folder) == [expected] and inspect(expected).tensor_types


@pytest.mark.parametrize(
    "output, message",
    [
        ("{tmp}/not-yet/", "no such folder"),
        ("{tmp}/missing/out.gguf", "cannot write"),
        ("{src}", "is the source itself"),
    ],
)
def test_outputs_are_refused_before_any_work(output: str, message: str, hf_folder: Path, f32_path: Path, tmp_path: Path) -> None:
    """Each refusal comes first, even from a Hugging Face folder whose conversion alone takes seconds."""
    src = f32_path if output == "{src}" else hf_folder
    result = run_cli("quantize", str(src), "Q8_0", "-o", output.format(tmp=tmp_path, src=f32_path))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert model_files(tmp_path) == [] and not (tmp_path / "not-yet").exists()


def test_bad_imatrix_is_refused_before_converting(hf_folder: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.dat"
    junk.write_bytes(b"\x01\x02")
    result = run_cli("quantize", str(hf_folder), "Q4_K_M", "-o", str(tmp_path / "q.gguf"), "--imatrix", str(junk))
    assert result.returncode == 1 and "is not an importance matrix" in result.stderr
    assert model_files(tmp_path) == []
