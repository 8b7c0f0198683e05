"""Structure-aware mutations of a GGUF, for the model-file fuzzer.

Each mutation knows what the field it changes means (a count, a length, a type, a tensor's
dimension or offset, a float, tensor bytes), so most mutants get past the magic and the
version and reach the code that trusts the header: the cases the GGUF CVEs were made of."""

from __future__ import annotations

import struct

import numpy as np

from tests.reliability.tiny_gguf import Field, Layout

WIDTH_FORMAT = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 255, 256, 1023, 1024, 4096, 65535, 65536,
               2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**62, 2**63 - 1, 2**63, 2**64 - 1]  # fmt: skip
FLOATS = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, -1.0, 1e-45, 3.4e38, 1e300]
HEADER_KINDS = ("version", "count", "length", "vtype", "int", "float", "bytes", "ndims", "dim", "ttype", "offset")


def _put_int(data: bytearray, f: Field, value: int) -> None:
    fmt = WIDTH_FORMAT.get(f.size)
    if fmt is None:
        return
    data[f.start : f.start + f.size] = struct.pack(fmt, value % (1 << (8 * f.size)))


def _get_int(data: bytearray, f: Field) -> int:
    return struct.unpack_from(WIDTH_FORMAT[f.size], data, f.start)[0] if f.size in WIDTH_FORMAT else 0


def _pick(rng: np.random.Generator, fields: list[Field], *kinds: str) -> Field | None:
    pool = [f for f in fields if f.kind in kinds]
    named = [f for f in pool if "[" not in f.label]  # not only the vocabulary's many elements
    if named and rng.random() < 0.75:
        pool = named
    return pool[int(rng.integers(len(pool)))] if pool else None


def interesting_int(rng: np.random.Generator, original: int) -> int:
    r = rng.random()
    if r < 0.6:
        return INTERESTING[int(rng.integers(len(INTERESTING)))]
    if r < 0.8:
        return original + int(rng.integers(-4, 5))
    return original * int(rng.choice([2, 3, 1000, 1 << 20])) + int(rng.integers(0, 2))


def mutate(seed: bytes, lay: Layout, rng: np.random.Generator) -> tuple[bytes, str]:
    """One mutant and a short description of what was done to it (1 to 3 stacked edits)."""
    data = bytearray(seed)
    done = []
    for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
        kind = rng.choice(["truncate", "int", "int", "int", "float", "vtype", "offset", "dims", "tensor_floats", "bytes", "splice", "duplicate"])
        if kind == "truncate":
            f = lay.fields[int(rng.integers(len(lay.fields)))]
            cut = f.start if rng.random() < 0.5 else f.start + int(rng.integers(0, max(1, f.size)))
            del data[cut:]
            done.append(f"truncate at {cut} ({f.label})")
        elif kind == "int":
            f = _pick(rng, lay.fields, "version", "count", "length", "int", "ndims", "dim", "ttype", "offset")
            if f and f.start + f.size <= len(data):
                value = interesting_int(rng, _get_int(data, f))
                _put_int(data, f, value)
                done.append(f"{f.label} = {value}")
        elif kind == "float":
            f = _pick(rng, lay.fields, "float")
            if f and f.start + f.size <= len(data):
                value = FLOATS[int(rng.integers(len(FLOATS)))]
                with np.errstate(over="ignore"):  # 1e300 as a float32 is inf, as meant
                    data[f.start : f.start + f.size] = (np.float32 if f.size == 4 else np.float64)(value).tobytes()
                done.append(f"{f.label} = {value}")
        elif kind == "vtype":
            f = _pick(rng, lay.fields, "vtype", "ttype")
            if f and f.start + f.size <= len(data):
                value = int(rng.integers(0, 48))
                _put_int(data, f, value)
                done.append(f"{f.label} = {value}")
        elif kind == "offset":  # overlapping tensors, a tensor at or past the end, an unaligned one
            a, b = _pick(rng, lay.fields, "offset"), _pick(rng, lay.fields, "offset")
            if a and b and a.start + a.size <= len(data) and b.start + b.size <= len(data):
                how = rng.choice(["overlap", "end", "past", "unaligned"])
                value = {"overlap": _get_int(data, b), "end": len(seed) - lay.data_start, "past": len(seed), "unaligned": _get_int(data, a) + 1}[how]
                _put_int(data, a, value)
                done.append(f"{a.label} {how} = {value}")
        elif kind == "dims":  # swap a dimension with another tensor's
            a, b = _pick(rng, lay.fields, "dim"), _pick(rng, lay.fields, "dim")
            if a and b and max(a.start, b.start) + 8 <= len(data):
                va, vb = _get_int(data, a), _get_int(data, b)
                _put_int(data, a, vb)
                _put_int(data, b, va)
                done.append(f"swap {a.label} and {b.label}")
        elif kind == "tensor_floats":  # NaN/inf in weights, norms and quantized blocks' scales
            f = _pick(rng, lay.fields, "tensor_data")
            if f and f.start + f.size <= len(data):
                value = FLOATS[int(rng.integers(3))]
                n = int(rng.integers(1, 9))
                for _ in range(n):
                    at = f.start + 2 * int(rng.integers(0, max(1, f.size // 2 - 1)))
                    with np.errstate(over="ignore"):
                        data[at : at + 2] = np.float16(value).tobytes()
                done.append(f"{n} f16 {value} in {f.label}")
        elif kind == "bytes":  # havoc in the header
            end = min(len(data), lay.data_start)
            n = int(rng.integers(1, 9))
            for _ in range(n):
                if end:
                    data[int(rng.integers(end))] = int(rng.integers(256))
            done.append(f"{n} random header bytes")
        elif kind == "splice":  # insert or delete bytes at a field boundary: everything after shifts
            f = _pick(rng, lay.fields, *HEADER_KINDS)
            if f and f.start <= len(data):
                n = int(rng.integers(1, 17))
                if rng.random() < 0.5:
                    data[f.start : f.start] = bytes(rng.integers(0, 256, n, dtype=np.uint8))
                    done.append(f"insert {n} bytes before {f.label}")
                else:
                    del data[f.start : f.start + n]
                    done.append(f"delete {n} bytes at {f.label}")
        elif kind == "duplicate":  # a key/value pair twice, with n_kv raised to match
            keys = [i for i, f in enumerate(lay.fields) if f.label == "key.length"]
            i = keys[int(rng.integers(len(keys)))]
            j = next((k for k in keys if k > i), None)
            end = lay.fields[j].start if j is not None else next(f.start for f in lay.fields if f.label == "tensor_name.length")
            start = lay.fields[i].start
            if end <= len(data):
                data[end:end] = data[start:end]
                n_kv = lay.fields[3]
                _put_int(data, n_kv, _get_int(data, n_kv) + 1)
                done.append(f"duplicate key/value at {start}")
    return bytes(data), "; ".join(done) or "unchanged"
