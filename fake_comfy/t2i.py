"""Text-to-image on the fake: what the recorded model nodes (object-info-t2i.json) compute, one row per class.

No model runs. Loaders (the executor's) hand out model handles; CLIPTextEncode makes a conditioning that carries
its text; EmptyLatentImage a latent of width × height × batch; KSampler sends a progress message per step (each
`--step-ms`) and returns a latent whose content is a function of seed, positive text and size; VAEDecode draws
it as an image of the latent's size in pixels (a mosaic of one cell per latent pixel, its colours drawn from
that content: the same seed and prompt give the same bytes); SaveImage writes it as a real PNG. LoRA and
ControlNet pass their inputs through, upscaling scales (LatentUpscale and ImageScale to their size,
ImageUpscaleWithModel by the factor in the model's name), and SaveAnimatedWEBP / SaveWEBM write a real WebP /
WebM (fake_comfy.media). Audio and video: EmptyAudio makes silence, CreateVideo a video of a batch,
and SaveAudio, SaveVideo and VideoHelperSuite's VHS_VideoCombine write a FLAC / MP4 header, each listed in the
history as ComfyUI lists it: SaveVideo's under ``images`` with ``animated: [true]`` (ui.PreviewVideo, read in
comfy_api/latest/_ui.py and comfy_extras/nodes_video.py@0413db9da96134a570d506b540231253672ec369), SaveAudio's under
``audio`` (nodes_audio.py@01e93c7b7f3ef8ebcd100507f04b875d60d10cca), VHS_VideoCombine's under ``gifs`` with its
``format``, ``frame_rate``, ``workflow`` and absolute ``fullpath``.

A row is ``async fn(node_id, inputs, run) -> (value, ui output or None)``; the executor calls it in place of its
generic node (`behaviour`). What a row reads of the run is the `Run` protocol below.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from . import media
from .images import OutsideOutputFolder, Raster, save_image_path
from .models import scale_of
from .uploads import Pixels, to_uint8

if TYPE_CHECKING:
    from .options import Options

GREY = (128, 128, 128)


@dataclass(frozen=True)
class Conditioning:
    """A CLIPTextEncode's output: the text it encoded (ControlNet adds the names of what it applied)."""

    text: str
    control: tuple[str, ...] = ()


@dataclass(frozen=True)
class Latent:
    """A latent batch: its size in image pixels and its content, a key (None: empty, as EmptyLatentImage's)."""

    width: int
    height: int
    batch: int
    key: str | None = None


@dataclass(frozen=True)
class Outputs:
    """The values of a node with several outputs, by index (ControlNetApplyAdvanced's positive, negative)."""

    values: tuple[Any, ...]


class Run(Protocol):
    """What a row reads of the run it is part of (the executor's _Run)."""

    options: Options

    async def node_time(self, node_id: str) -> None: ...

    async def step(self, node_id: str, step: int, steps: int) -> None: ...


Result = tuple[Any, dict[str, Any] | None]
Row = Callable[[str, dict[str, Any], Run], Awaitable[Result]]


def digest(*parts: Any) -> str:
    """A stable content key (the same in every process, unlike hash())."""
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def as_raster(value: Any) -> Raster:
    """Any image value of the fake as a Raster: its own, a solid Image, real Pixels of an upload."""
    if isinstance(value, Raster):
        return value
    if isinstance(value, Pixels):
        rgb = value.as_rgb()
        return Raster(rgb.width, rgb.height, (rgb.width, rgb.height), (bytes(to_uint8(x) for x in rgb.data),))
    width, height = int(getattr(value, "width", 64)), int(getattr(value, "height", 64))
    colour = bytes(getattr(value, "rgb", GREY))
    return Raster(width, height, (1, 1), (colour,) * max(1, int(getattr(value, "batch", 1))))


def _latent(value: Any) -> Latent:
    return value if isinstance(value, Latent) else Latent(512, 512, 1)


def _int(inputs: dict[str, Any], name: str, default: int) -> int:
    try:
        return int(inputs.get(name, default))
    except (TypeError, ValueError):
        return default


async def text_encode(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    await run.node_time(node_id)
    return Conditioning(str(inputs.get("text", ""))), None


async def empty_latent(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    await run.node_time(node_id)
    return Latent(_int(inputs, "width", 512), _int(inputs, "height", 512), _int(inputs, "batch_size", 1)), None


async def sample(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    """KSampler and KSamplerAdvanced: a progress message per step, then a latent of seed, prompt and size."""
    await run.node_time(node_id)
    steps = _int(inputs, "steps", 20)
    if "noise_seed" in inputs:  # KSamplerAdvanced samples from start_at_step to end_at_step
        first, last = _int(inputs, "start_at_step", 0), min(_int(inputs, "end_at_step", steps), steps)
        steps, seed = max(0, last - first), _int(inputs, "noise_seed", 0)
    else:
        seed = _int(inputs, "seed", 0)
    for step in range(1, steps + 1):
        await run.step(node_id, step, steps)
    latent, positive = _latent(inputs.get("latent_image")), inputs.get("positive")
    text = positive.text if isinstance(positive, Conditioning) else ""
    key = digest(seed, text, latent.width, latent.height, latent.batch, latent.key)
    return Latent(latent.width, latent.height, latent.batch, key), None


async def vae_decode(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    """The latent drawn at its size: one cell per latent pixel (8 × 8 image pixels), colours from its key."""
    await run.node_time(node_id)
    latent = _latent(inputs.get("samples"))
    grid = (max(1, latent.width // 8), max(1, latent.height // 8))
    size = grid[0] * grid[1] * 3
    frames = tuple(bytes(GREY) * (size // 3) if latent.key is None
                   else random.Random(f"{latent.key}/{i}").randbytes(size) for i in range(max(1, latent.batch)))
    return Raster(max(1, latent.width), max(1, latent.height), grid, frames), None


async def vae_encode(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    await run.node_time(node_id)
    image = as_raster(inputs.get("pixels"))
    return Latent(image.width, image.height, image.batch, digest(image.width, image.height, *image.frames)), None


def _scaled(width: int, height: int, old_width: int, old_height: int, least: int) -> tuple[int, int]:
    """ComfyUI's upscale arithmetic: 0 keeps the aspect ratio from the other side; 0 and 0 keep the size."""
    if width == 0 and height == 0:
        return old_width, old_height
    if width == 0:
        height = max(least, height)
        return max(least, round(old_width * height / max(old_height, 1))), height
    if height == 0:
        width = max(least, width)
        return width, max(least, round(old_height * width / max(old_width, 1)))
    return max(least, width), max(least, height)


async def latent_upscale(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    await run.node_time(node_id)
    latent = _latent(inputs.get("samples"))
    width, height = _scaled(_int(inputs, "width", 0), _int(inputs, "height", 0), latent.width, latent.height, 64)
    return Latent(width, height, latent.batch, latent.key), None


async def image_scale(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    await run.node_time(node_id)
    image = as_raster(inputs.get("image"))
    width, height = _scaled(_int(inputs, "width", 0), _int(inputs, "height", 0), image.width, image.height, 1)
    return image.resized(width, height), None


async def image_invert(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    await run.node_time(node_id)
    image = as_raster(inputs.get("image"))
    return Raster(image.width, image.height, image.grid, tuple(bytes(255 - b for b in f) for f in image.frames)), None


async def upscale_with_model(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    """By the model's factor, read from its name (4x-UltraSharp: 4, RealESRGAN_x2plus: 2; else 4)."""
    await run.node_time(node_id)
    image, factor = as_raster(inputs.get("image")), scale_of(getattr(inputs.get("upscale_model"), "name", None))
    return image.resized(image.width * factor, image.height * factor), None


async def controlnet_apply(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    """Both conditionings through, each noting the ControlNet applied."""
    await run.node_time(node_id)
    name = str(getattr(inputs.get("control_net"), "name", "controlnet"))
    out = tuple(Conditioning(c.text, (*c.control, name)) if isinstance(c, Conditioning) else c
                for c in (inputs.get("positive"), inputs.get("negative")))
    return Outputs(out), None


def _save_path(inputs: dict[str, Any], image: Raster, run: Run) -> tuple[Any, str, int, str]:
    try:
        return save_image_path(str(inputs.get("filename_prefix", "ComfyUI")), run.options.output_dir,
                               image.width, image.height)
    except OutsideOutputFolder as exc:
        raise Exception(str(exc)) from None  # ComfyUI raises a plain Exception


async def save_webp(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    """SaveAnimatedWEBP: one file of every image of the batch, animated when there are several."""
    image = as_raster(inputs.get("images"))
    folder, stem, counter, subfolder = _save_path(inputs, image, run)
    fps = float(inputs.get("fps", 6.0)) or 6.0
    name = f"{stem}_{counter:05}_.webp"
    frames = [image.mean(i) for i in range(image.batch)]
    (folder / name).write_bytes(media.webp(image.width, image.height, frames, int(1000.0 / fps)))
    await run.node_time(node_id)
    return None, {"images": [{"filename": name, "subfolder": subfolder, "type": "output"}],
                  "animated": [image.batch != 1]}


async def save_webm(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    """SaveWEBM: a WebM container of the batch's frames (see fake_comfy.media)."""
    image = as_raster(inputs.get("images"))
    folder, stem, counter, subfolder = _save_path(inputs, image, run)
    name = f"{stem}_{counter:05}_.webm"
    data = media.webm(image.width, image.height, image.batch, float(inputs.get("fps", 24.0)), str(inputs.get("codec")))
    (folder / name).write_bytes(data)
    await run.node_time(node_id)
    return None, {"images": [{"filename": name, "subfolder": subfolder, "type": "output"}], "animated": [True]}


@dataclass(frozen=True)
class Audio:
    """EmptyAudio's output: silence of ``seconds`` at a rate, in channels."""

    seconds: float
    sample_rate: int
    channels: int


@dataclass(frozen=True)
class Video:
    """CreateVideo's output: the frames of an image batch at ``fps`` (audio, when given, is kept but not written)."""

    images: Raster
    fps: float
    audio: Audio | None = None


def _saved(name: str, subfolder: str) -> dict[str, Any]:
    return {"filename": name, "subfolder": subfolder, "type": "output"}


async def empty_audio(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    await run.node_time(node_id)
    return Audio(float(inputs.get("duration", 60.0)), int(inputs.get("sample_rate", 44100)),
                 int(inputs.get("channels", 2))), None


async def save_audio(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    """SaveAudio: ``<prefix>_NNNNN_.flac`` per batch item (one here), listed under ``audio``."""
    audio = inputs.get("audio")
    audio = audio if isinstance(audio, Audio) else Audio(1.0, 44100, 2)
    folder, stem, counter, subfolder = _save_path(inputs, Raster(0, 0, (1, 1), (b"\0\0\0",)), run)
    name = f"{stem}_{counter:05}_.flac"
    (folder / name).write_bytes(media.flac(audio.sample_rate, audio.channels, round(audio.seconds * audio.sample_rate)))
    await run.node_time(node_id)
    return None, {"audio": [_saved(name, subfolder)]}


async def create_video(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    await run.node_time(node_id)
    audio = inputs.get("audio")
    return Video(as_raster(inputs.get("images")), float(inputs.get("fps", 30.0)),
                 audio if isinstance(audio, Audio) else None), None


async def save_video(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    """SaveVideo: ``<prefix>_NNNNN_.mp4`` (format auto and mp4 are MP4), listed under ``images``, animated."""
    video = inputs.get("video")
    video = video if isinstance(video, Video) else Video(as_raster(None), 30.0)
    folder, stem, counter, subfolder = _save_path(inputs, video.images, run)
    name = f"{stem}_{counter:05}_.mp4"
    (folder / name).write_bytes(media.mp4(video.images.width, video.images.height, video.images.batch, video.fps))
    await run.node_time(node_id)
    return None, {"images": [_saved(name, subfolder)], "animated": [True]}


async def video_combine(node_id: str, inputs: dict[str, Any], run: Run) -> Result:
    """VHS_VideoCombine: an MP4 (video/*) or an animated WebP (image/*), listed under ``gifs``."""
    image, fps, kind = as_raster(inputs.get("images")), float(inputs.get("frame_rate", 8.0)), str(inputs.get("format"))
    folder, stem, counter, subfolder = _save_path(inputs, image, run)
    name = f"{stem}_{counter:05}.{'mp4' if kind.startswith('video/') else 'webp'}"  # VHS: no trailing underscore
    data = media.mp4(image.width, image.height, image.batch, fps) if kind.startswith("video/") else \
        media.webp(image.width, image.height, [image.mean(i) for i in range(image.batch)], int(1000.0 / fps))
    (folder / name).write_bytes(data)
    await run.node_time(node_id)
    item = {**_saved(name, subfolder), "format": kind, "frame_rate": fps,
            "workflow": f"{stem}_{counter:05}.png", "fullpath": str(folder / name)}
    return None, {"gifs": [item]}


NODES: dict[str, Row] = {
    "CLIPTextEncode": text_encode,
    "EmptyLatentImage": empty_latent,
    "KSampler": sample,
    "KSamplerAdvanced": sample,
    "VAEDecode": vae_decode,
    "VAEEncode": vae_encode,
    "LatentUpscale": latent_upscale,
    "ImageUpscaleWithModel": upscale_with_model,
    "ControlNetApplyAdvanced": controlnet_apply,
    "SaveAnimatedWEBP": save_webp,
    "SaveWEBM": save_webm,
    "EmptyAudio": empty_audio,
    "SaveAudio": save_audio,
    "CreateVideo": create_video,
    "SaveVideo": save_video,
    "VHS_VideoCombine": video_combine,
}
"""Class → what it computes. Loaders are the executor's (model handles, load time on a swap)."""

ON_RASTERS: dict[str, Row] = {"ImageScale": image_scale, "ImageInvert": image_invert}
"""Image nodes the sample's solid images know too: these rows take them when their image is a Raster."""


def behaviour(class_type: str, inputs: dict[str, Any]) -> Row | None:
    """The row that runs this node, or None: the executor's generic node (fake_comfy.nodework)."""
    if class_type in ON_RASTERS and isinstance(inputs.get("image"), Raster):
        return ON_RASTERS[class_type]
    return NODES.get(class_type)
