"""What each node class of the fake computes: images as sizes and colours, real pixels from uploads, and the
PNG files SaveImage and PreviewImage write, named and counted as ComfyUI does.

The executor (executor.py) decides when a node runs, what it sends and how long it takes; these functions only
compute a node's value from its resolved inputs. What they need of the run is the small `NodeRun` protocol
(the options, the prompt and its extra data, the script word, and the run's `error_details` for a failure).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .images import OutsideOutputFolder, Raster, png_bytes, save_image_path
from .nodes import data, is_link
from .uploads import LOADERS, NotAnImage, Pixels, load, loaded_path

if TYPE_CHECKING:
    from .options import Options

#: Largest side of a written PNG; bigger images are written at this size (their names are unaffected).
MAX_SIDE = 2048


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    batch: int
    rgb: tuple[int, int, int]


@dataclass(frozen=True)
class Model:
    class_type: str
    name: str | None


class NodeFailure(Exception):
    """A node ended the prompt: interrupted, or an exception with ComfyUI's error details."""

    def __init__(self, node_id: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(node_id)
        self.node_id = node_id
        self.details = details

    @property
    def interrupted(self) -> bool:
        return self.details is None


def recorded_error(kind: str, message: str | None, inputs: dict[str, list[Any]]) -> dict[str, Any]:
    """exception_message/type, traceback and current_inputs of the recorded error `kind` (errors.json)."""
    recorded = data("errors.json")[kind]
    return {
        "exception_message": message if message is not None else recorded["exception_message"],
        "exception_type": recorded["exception_type"],
        "traceback": list(recorded["traceback"]),
        "current_inputs": inputs,
    }


def exception_details(exc: Exception, inputs: dict[str, list[Any]]) -> dict[str, Any]:
    """ComfyUI's execute() on any exception of a node: its type's full name, its message, its traceback and the
    node's inputs (logged on stderr too, as ComfyUI logs it)."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    print(f"!!! Exception during processing !!! {exc}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    return {"exception_message": f"{exc}\n", "exception_type": name,
            "traceback": traceback.format_tb(exc.__traceback__), "current_inputs": inputs}


def current_inputs(inputs: dict[str, Any], resolve: Callable[[list[Any]], Any]) -> dict[str, list[Any]]:
    """Inputs as ComfyUI formats them: plain values as they are, tensors (images) and models as their repr."""
    tensor = data("errors.json")["image_to_mask"]["tensor_repr"]
    out: dict[str, list[Any]] = {}
    for name, value in inputs.items():
        if is_link(value):
            source = resolve(value)
            out[name] = [tensor if isinstance(source, Image | Pixels | Raster) or source is None else repr(source)]
        else:
            out[name] = [value if isinstance(value, int | float | str | bool) or value is None else str(value)]
    return out


def physical_memory() -> int:
    """RAM in bytes (what EmptyImage may allocate before the recorded allocation failure)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 16 << 30


def hostile_names(images: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The "hostile" word: the same files named with ../ and absolute paths."""
    out = []
    for image in images:
        name = image["filename"]
        out += [
            {"filename": f"../../{name}", "subfolder": "", "type": image["type"]},
            {"filename": f"/etc/{name}", "subfolder": "", "type": image["type"]},
            {"filename": name, "subfolder": "../../..", "type": image["type"]},
            {"filename": name, "subfolder": "/tmp", "type": image["type"]},
        ]
    return out


class NodeRun(Protocol):
    """What a node's computation reads of the run it is part of."""

    options: Options
    prompt: dict[str, Any]
    extra_data: dict[str, Any]
    word: str | None
    preview_prefix: str

    def error_details(self, node_id: str, kind: str, message: str | None = None) -> dict[str, Any]: ...


def transform(node_id: str, class_type: str, inputs: dict[str, Any], run: NodeRun) -> Any:
    """The image nodes of the recorded workflows, well enough for sizes, colours and their errors."""
    if class_type in LOADERS or isinstance(inputs.get("image"), Pixels) or isinstance(inputs.get("mask"), Pixels):
        return pixels(node_id, class_type, inputs, run)
    image = inputs.get("image") if isinstance(inputs.get("image"), Image) else Image(64, 64, 1, (0, 0, 0))
    node = _IMAGE_NODES.get(class_type)
    return node(node_id, inputs, image, run) if node is not None else image


def _empty_image(node_id: str, inputs: dict[str, Any], image: Image, run: NodeRun) -> Image:
    width, height, batch = int(inputs["width"]), int(inputs["height"]), int(inputs["batch_size"])
    nbytes = width * height * batch * 4
    if nbytes > physical_memory():
        message = data("errors.json")["cpu_alloc"]["exception_message"].replace(
            "{nbytes}", str(nbytes)
        )
        raise NodeFailure(node_id, run.error_details(node_id, "cpu_alloc", message))
    color = int(inputs["color"])
    return Image(width, height, batch, ((color >> 16) & 0xFF, (color >> 8) & 0xFF, color & 0xFF))


def _image_invert(node_id: str, inputs: dict[str, Any], image: Image, run: NodeRun) -> Image:
    return Image(image.width, image.height, image.batch, tuple(255 - c for c in image.rgb))  # type: ignore[arg-type]


def _image_to_mask(node_id: str, inputs: dict[str, Any], image: Image, run: NodeRun) -> Image:
    if inputs.get("channel") == "alpha":  # the fake's images have three channels, like EmptyImage's
        raise NodeFailure(node_id, run.error_details(node_id, "image_to_mask"))
    channel = ("red", "green", "blue").index(inputs.get("channel", "red"))
    return Image(image.width, image.height, image.batch, (image.rgb[channel],) * 3)


def _image_scale(node_id: str, inputs: dict[str, Any], image: Image, run: NodeRun) -> Image:
    width, height = int(inputs.get("width", 0)), int(inputs.get("height", 0))
    if width == 0 and height == 0:
        return image
    width = width or max(1, round(image.width * height / image.height))
    height = height or max(1, round(image.height * width / image.width))
    return Image(width, height, image.batch, image.rgb)


def _load_image(node_id: str, inputs: dict[str, Any], image: Image, run: NodeRun) -> Image:
    return Image(64, 64, 1, (128, 128, 128))


def _mask_to_image(node_id: str, inputs: dict[str, Any], image: Image, run: NodeRun) -> Image:
    mask = inputs.get("mask")
    return mask if isinstance(mask, Image) else image


_IMAGE_NODES: dict[str, Callable[[str, dict[str, Any], Image, NodeRun], Image]] = {
    "EmptyImage": _empty_image, "ImageInvert": _image_invert, "ImageToMask": _image_to_mask,
    "ImageScale": _image_scale, "LoadImage": _load_image, "MaskToImage": _mask_to_image,
}
"""What each image node makes of its inputs (sizes and one colour: no pixels); any other passes its image on."""


def pixels(node_id: str, class_type: str, inputs: dict[str, Any], run: NodeRun) -> Any:
    """Real pixels (fake_comfy.uploads): the loaders read the uploaded file; the nodes after them compute on
    its values as ComfyUI's float32 tensors would."""
    if class_type in LOADERS:
        options = run.options
        path = loaded_path(str(inputs.get("image", "")), options.input_dir, options.directory_for_type)
        try:
            if path is None:
                raise FileNotFoundError(2, "No such file or directory", str(inputs.get("image", "")))
            return load(path, class_type, str(inputs.get("channel", "alpha")))
        except (NotAnImage, OSError, ValueError) as exc:
            unidentified = isinstance(exc, NotAnImage | ValueError)  # PIL.Image.open's failure, or a later read's
            message = f"cannot identify image file '{path}'\n" if unidentified else f"{exc}\n"
            details = run.error_details(node_id, "image_to_mask", message)
            details["exception_type"] = "PIL.UnidentifiedImageError" if unidentified else type(exc).__name__
            raise NodeFailure(node_id, details) from None
    image = inputs.get("image") if isinstance(inputs.get("image"), Pixels) else inputs.get("mask")
    if class_type == "ImageInvert":
        return image.invert()
    if class_type == "MaskToImage":
        return image.as_rgb()
    return image

def save(node_id: str, inputs: dict[str, Any], kind: str, run: NodeRun) -> list[dict[str, Any]]:
    """SaveImage (output) and PreviewImage (temp): real PNGs, named and counted as ComfyUI does (a Raster's
    images each their own PNG, at their size)."""
    pixels = inputs.get("images") if isinstance(inputs.get("images"), Pixels | Raster) else None
    image = Image(pixels.width, pixels.height, getattr(pixels, "batch", 1), (0, 0, 0)) if pixels is not None else (
        inputs.get("images")
        if isinstance(inputs.get("images"), Image)
        else Image(64, 64, 1, (128, 128, 128))
    )
    options = run.options
    if kind == "output":
        prefix, folder_root = str(inputs.get("filename_prefix", "ComfyUI")), options.output_dir
    else:
        prefix, folder_root = "ComfyUI" + run.preview_prefix, options.temp_dir
    try:
        folder, stem, counter, subfolder = save_image_path(prefix, folder_root, image.width, image.height)
    except OutsideOutputFolder as exc:
        message = data("errors.json")["save_outside"]["exception_message"].replace("{message}", str(exc))
        raise NodeFailure(node_id, run.error_details(node_id, "save_outside", message)) from None
    text = {"prompt": json.dumps(run.prompt)}
    for key, value in (run.extra_data.get("extra_pnginfo") or {}).items():
        text[str(key)] = json.dumps(value)
    if isinstance(pixels, Raster):
        pngs = [pixels.png(i, text) for i in range(image.batch)]
    else:
        pngs = [pixels.png(text) if pixels is not None else png_bytes(
            min(image.width, MAX_SIDE), min(image.height, MAX_SIDE), image.rgb, text)] * image.batch
    results = []
    for batch_number, png in enumerate(pngs):
        name = f"{stem.replace('%batch_num%', str(batch_number))}_{counter:05}_.png"
        (folder / name).write_bytes(png)
        if run.word == "hostile:run:store-temp-name":  # fake_comfy.hostile_bodies: a client's temporary name
            (folder / f".{name}.part").write_bytes(png)
            results.append({"filename": f".{name}.part", "subfolder": subfolder, "type": kind})
        results.append({"filename": name, "subfolder": subfolder, "type": kind})
        counter += 1
    return hostile_names(results) if run.word == "hostile" else results
