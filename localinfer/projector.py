"""A vision model's projector: the second GGUF (llama.cpp's `mmproj-*.gguf`, architecture
`clip`) that turns an image into embeddings the text model reads. Found beside its model, as
llama.cpp and LM Studio lay them out, or named with --mmproj, and checked against the model
before anything loads: a wrong pairing is a one-line error here, not an abort inside mtmd.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localinfer.errors import InvalidModelFile, UserError
from localinfer.modelfile import GGUFInfo, inspect

PROJECTOR_GLOB = "mmproj*.gguf"  # llama.cpp's converter names them mmproj-<model>-<type>.gguf


@dataclass(frozen=True)
class Projector:
    """What `show` and `doctor` say about a projector, and what pairing it is checked by."""

    path: Path
    kind: str  # clip's projector type: gemma3, qwen2vl_merger, mlp, idefics3, ...
    image_size: int  # pixels a side the encoder sees (one tile, where it tiles)
    patch_size: int
    projection_dim: int | None  # the width of the embeddings it makes; None where the file does not say

    def describe(self) -> str:
        return f"projector {self.path.name} ({self.kind}, {self.image_size} px images, {self.patch_size} px patches)"

    def as_dict(self) -> dict[str, object]:
        return {"path": str(self.path), "projector_type": self.kind, "image_size": self.image_size, "patch_size": self.patch_size}


def beside(model: Path) -> list[Path]:
    """The projectors lying in a model file's folder, as llama.cpp names them."""
    return sorted(p for p in Path(model).parent.glob(PROJECTOR_GLOB) if p.is_file() and p != Path(model))


def for_model(asked: str | None, model: Path, info: GGUFInfo, warnings: list[str]) -> Projector | None:
    """The projector to load with a model: --mmproj's (checked: a wrong one is the user's
    error), "none" for text alone, else the one lying beside the model file if exactly one
    pairs with it. One beside it that does not pair is a warning, not a failure: the text
    model still runs."""
    if asked == "none":
        return None
    if asked:
        return read(Path(asked), info)
    found = beside(model)
    if len(found) > 1:
        warnings.append(f"{len(found)} projectors lie beside {model.name} ({', '.join(p.name for p in found)}): name one with --mmproj to read images")
        return None
    try:
        return read(found[0], info) if found else None
    except UserError as e:  # InvalidModelFile included
        warnings.append(f"{found[0].name} beside the model is not its projector, so images are off: {e}")
        return None


def read(path: Path, model: GGUFInfo | None = None) -> Projector:
    """The projector at `path`, checked: a clip GGUF with a vision encoder, and, given the text
    model, one whose embeddings are as wide as that model's."""
    info = inspect(Path(path))
    if info.architecture != "clip":
        raise InvalidModelFile(f"{Path(path).name} is not a projector: its architecture is '{info.architecture}', not clip")
    meta = info.metadata
    if not meta.get("clip.has_vision_encoder"):
        raise UserError(f"{Path(path).name} has no vision encoder (a projector for audio only): images need a vision projector")
    kind = meta.get("clip.vision.projector_type") or meta.get("clip.projector_type") or "mlp"
    dim = meta.get("clip.vision.projection_dim")
    projector = Projector(Path(path), str(kind), int(meta.get("clip.vision.image_size", 0)), int(meta.get("clip.vision.patch_size", 0)), int(dim) if dim else None)
    if model is not None and projector.projection_dim and projector.projection_dim != model.n_embd:
        raise UserError(
            f"{projector.path.name} makes {projector.projection_dim}-wide image embeddings but {model.path.name} is {model.n_embd} wide: "
            "it is another model's projector"
        )
    return projector
