"""Our fast GGUF header scan agrees with gguf-py's GGUFReader, and rejects bad files precisely."""

from collections import Counter

import pytest
from gguf import GGUFReader

from localinfer.errors import InvalidModelFile
from localinfer.modelfile import inspect


def test_inspect_matches_gguf_reader(model_path) -> None:
    info = inspect(model_path)
    ref = GGUFReader(model_path)
    assert info.n_params == sum(int(t.n_elements) for t in ref.tensors)
    assert info.tensor_bytes == sum(int(t.n_bytes) for t in ref.tensors)
    assert info.tensor_types == dict(Counter(t.tensor_type.name for t in ref.tensors))
    assert info.n_vocab == len(ref.fields["tokenizer.ggml.tokens"].data)
    assert info.chat_template == ref.fields["tokenizer.chat_template"].contents()
    assert info.architecture == ref.fields["general.architecture"].contents()
    assert info.context_length == ref.fields[f"{info.architecture}.context_length"].contents()
    assert info.n_layer == ref.fields[f"{info.architecture}.block_count"].contents()
    assert info.license == ref.fields["general.license"].contents()
    assert [(t.name, t.shape, t.type, t.offset, t.nbytes) for t in info.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset), int(t.n_bytes)) for t in ref.tensors
    ]


def test_truncated_file_is_rejected(model_path, tmp_path) -> None:
    for cut in (100, 2_000_000, model_path.stat().st_size - 10):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(model_path.read_bytes()[:cut])
        with pytest.raises(InvalidModelFile, match="truncated"):
            inspect(bad)


def test_non_gguf_is_rejected(tmp_path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("just some text")
    with pytest.raises(InvalidModelFile, match="not a GGUF"):
        inspect(bad)


def test_corrupt_header_is_rejected(model_path, tmp_path) -> None:
    data = bytearray(model_path.read_bytes()[:4096])
    data[16:24] = (2**62).to_bytes(8, "little")  # an absurd key/value count
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(InvalidModelFile, match="corrupt"):
        inspect(bad)
