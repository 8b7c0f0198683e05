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

# Image tokens per image, as llama.cpp's clip_n_output_tokens counts them, where the type fixes
# them: the encoder's patches of its image_size x image_size input, pooled n x n into one token
# (gemma3: 4, unless clip.vision.projector.scale_factor says otherwise; ldp: 2). The types below
# them tile an image or keep its aspect (Qwen2-VL's grid), so their count follows the image.
POOLING = {"mlp": 1, "mlp_norm": 1, "ldp": 2, "ldpv2": 2, "gemma3": 4}
VARIES = frozenset({"qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "glm4v", "idefics3", "internvl", "llama4",
                    "lfm2", "kimivl", "pixtral", "resampler", "phi4", "lightonocr", "paddleocr"})  # fmt: skip


@dataclass(frozen=True)
class Projector:
    """What `show` and `doctor` say about a projector, and what pairing it is checked by."""

    path: Path
    kind: str  # clip's projector type: gemma3, qwen2vl_merger, mlp, idefics3, ...
    image_size: int  # pixels a side the encoder sees (one tile, where it tiles)
    patch_size: int
    projection_dim: int | None  # the width of the embeddings it makes; None where the file does not say
    scale_factor: int | None = None  # clip.vision.projector.scale_factor: patches pooled per side (gemma3's 4 when absent)
    tiles: bool = False  # clip.vision.image_grid_pinpoints: LLaVA-1.6's tiling, so an "mlp" image is several tiles

    def describe(self) -> str:
        return f"projector {self.path.name} ({self.kind}, {self.image_size} px images, {self.patch_size} px patches)"

    def image_tokens(self) -> int | None:
        """The tokens one image takes in the context, read from the file's metadata alone
        (no encoder loaded); None where the type does not fix them (see `varies`)."""
        pool = POOLING.get(self.kind)
        if pool is None or self.tiles or not self.patch_size:
            return None
        if self.kind == "gemma3" and self.scale_factor:  # clip reads the key for gemma3 alone of these
            pool = self.scale_factor
        return (self.image_size // self.patch_size) ** 2 // (pool * pool)

    @property
    def varies(self) -> bool:
        """Does an image's token count follow its size (tiles, or a grid of its own aspect)?"""
        return self.kind in VARIES or (self.tiles and self.kind in POOLING)

    def summary(self) -> str:
        """What `show` and `doctor` say after "vision: yes"."""
        n = self.image_tokens()
        tokens = f", image tokens per image {n}" if n else ", image tokens per image vary with image size" if self.varies else ""
        return f"projector {self.path.name}, {self.kind}{tokens}"

    def as_dict(self) -> dict[str, object]:
        return {"path": str(self.path), "projector_type": self.kind, "image_size": self.image_size, "patch_size": self.patch_size,
                "image_tokens": self.image_tokens(), "image_tokens_vary": self.varies, "summary": self.summary()}  # fmt: skip


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


def of_model(model: Path, warnings: list[str]) -> Projector | None:
    """The projector `run` would load with this model file (the one beside it that pairs with
    it; none for an embedding model, as the loader), or None; why one beside it is not taken
    goes to `warnings`. Reads GGUF headers only, and the model's only where a projector lies
    beside it: `list` asks for every model."""
    if not beside(model):
        return None
    info = inspect(Path(model))
    return None if info.embeds else for_model(None, Path(model), info, warnings)


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
    dim, scale = meta.get("clip.vision.projection_dim"), meta.get("clip.vision.projector.scale_factor")
    projector = Projector(Path(path), str(kind), int(meta.get("clip.vision.image_size", 0)), int(meta.get("clip.vision.patch_size", 0)),
                          int(dim) if dim else None, int(scale) if scale else None, "clip.vision.image_grid_pinpoints" in meta)  # fmt: skip
    if model is not None and projector.projection_dim and projector.projection_dim != model.n_embd:
        raise UserError(
            f"{projector.path.name} makes {projector.projection_dim}-wide image embeddings but {model.path.name} is {model.n_embd} wide: "
            "it is another model's projector"
        )
    return projector
