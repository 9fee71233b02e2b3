"""The node classes the fake knows: the recorded object_info sample, the recorded text-to-image nodes
(object-info-t2i.json), model loaders, the progress demo.

Loaders are pass-through nodes: any class whose name contains "Loader" is accepted, takes any inputs
and links to anything, because model-swap tests need loaders and the fake has no models to list. With
`--models` (fake_comfy.models) the recorded loaders list those files and are checked as ComfyUI checks them.
"""

from __future__ import annotations

import json
import mimetypes
import os
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from .models import FOLDER_OF
from .uploads import LOAD_IMAGE_MASK_INFO

_LOADER = re.compile(r"Loader")


@cache
def data(name: str) -> Any:
    """A JSON file from fake_comfy/data (recorded shapes; read once)."""
    return json.loads(resources.files("fake_comfy").joinpath("data", name).read_text())


@dataclass(frozen=True)
class NodeClass:
    """One node class: its object_info entry and what validation and execution need from it."""

    name: str
    info: dict[str, Any]
    passthrough: bool = False

    @property
    def output_node(self) -> bool:
        return bool(self.info.get("output_node"))

    @property
    def return_types(self) -> list[str]:
        return list(self.info.get("output", []))

    def input_specs(self) -> dict[str, tuple[str, list[Any]]]:
        """Input name -> (category, spec) for required then optional inputs, as validation walks them."""
        specs: dict[str, tuple[str, list[Any]]] = {}
        for category in ("required", "optional"):
            for name, spec in self.info.get("input", {}).get(category, {}).items():
                specs[name] = (category, spec)
        return specs


def _synthetic_loader(name: str) -> dict[str, Any]:
    """An object_info entry for a loader the sample does not have, so /object_info agrees with validation."""
    return {
        "input": {"required": {}},
        "input_order": {"required": []},
        "output": ["*"],
        "output_is_list": [False],
        "output_name": ["*"],
        "name": name,
        "display_name": name,
        "description": "fake_comfy pass-through loader",
        "python_module": "fake_comfy",
        "category": "loaders",
        "output_node": False,
    }


class Catalogue:
    """Looks node classes up by class_type; LoadImage's choices are the files in the input folder."""

    def __init__(self, input_dir: Path, options: Any = None) -> None:
        self._input_dir = input_dir
        self._known: dict[str, dict[str, Any]] = {**data("object_info.json"),
                                                   **data("object-info-t2i.json")["object_info"],
                                                   **data("object-info-media.json")["object_info"]}
        self._known.setdefault("LoadImageMask", LOAD_IMAGE_MASK_INFO)
        self._options = options
        """fake_comfy.options.Options: its without_nodes and choices (read live) make this server's own catalogue."""

    def _lacks(self, class_type: str) -> bool:
        return self._options is not None and class_type in self._options.without_nodes

    def _with_choices(self, class_type: str, info: dict[str, Any]) -> dict[str, Any]:
        """``info`` with the combo choices that --models and --choices (the latter winning) set for this class."""
        models = self._options.model_files() if self._options else None
        chosen = {k.partition(".")[2]: models.get(folder, []) for k, folder in FOLDER_OF.items()
                  if models is not None and k.partition(".")[0] == class_type}
        chosen.update({k.partition(".")[2]: v for k, v in (self._options.choices if self._options else {}).items()
                       if k.partition(".")[0] == class_type})
        if not chosen:
            return info
        info = json.loads(json.dumps(info))
        for category in ("required", "optional"):
            for name, spec in info.get("input", {}).get(category, {}).items():
                if name not in chosen:
                    continue
                if spec[0] == "COMBO":  # the v3 nodes' shape: ["COMBO", {"options": [...]}]
                    spec[1]["options"] = list(chosen[name])
                else:
                    spec[0] = list(chosen[name])
        return info

    def _load_image_info(self, class_type: str = "LoadImage") -> dict[str, Any]:
        info = json.loads(json.dumps(self._known[class_type]))
        try:
            files = sorted(f for f in os.listdir(self._input_dir) if (self._input_dir / f).is_file()
                           and (class_type == "LoadImageMask" or _is_image_name(f)))
        except OSError:
            files = []
        info["input"]["required"]["image"][0] = files
        return info

    def get(self, class_type: Any) -> NodeClass | None:
        """The class, or None when ComfyUI would say "node ... does not exist"."""
        if not isinstance(class_type, str) or self._lacks(class_type):
            return None
        if class_type in ("LoadImage", "LoadImageMask"):
            return NodeClass(class_type, self._load_image_info(class_type))
        if class_type in self._known:
            info = self._with_choices(class_type, self._known[class_type])
            # A loader whose choices --choices set is checked as ComfyUI checks it; the others take any file.
            return NodeClass(class_type, info, passthrough=is_loader(class_type) and info is self._known[class_type])
        if is_loader(class_type):
            return NodeClass(class_type, _synthetic_loader(class_type), passthrough=True)
        return None

    def object_info(self) -> dict[str, Any]:
        """GET /object_info: every class the fake knows by name."""
        return {name: self.get(name).info for name in self._known if not self._lacks(name)}  # type: ignore[union-attr]


def _is_image_name(name: str) -> bool:
    """LoadImage lists the files whose extension's mimetype is image/* (a text file named .png too)."""
    return (mimetypes.guess_type(name)[0] or "").startswith("image/")


def is_loader(class_type: str) -> bool:
    """A pass-through model loader, by name (CheckpointLoaderSimple, UNETLoader, LoraLoader, ...)."""
    return bool(_LOADER.search(class_type))


def model_name(inputs: dict[str, Any]) -> str | None:
    """The model a loader loads: its *_name inputs (ckpt_name, unet_name, lora_name, ...), joined."""
    names = [str(v) for k, v in sorted(inputs.items()) if k.endswith("_name") and not is_link(v)]
    return "+".join(names) if names else None


def is_link(value: Any) -> bool:
    """ComfyUI's is_link: ["node_id", output_index]."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    )
