"""Everything a fake server is started with, shared by the command line and the in-process class."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .models import scan
from .version import default_version

#: ComfyUI's execution.MAXIMUM_HISTORY_SIZE; checked with '>' before an insert, so 10,001 entries stay.
MAXIMUM_HISTORY_SIZE = 10000


@dataclass
class Options:
    """ComfyUI's own flags that the fake honours, then the fake's knobs.

    The knobs (node_ms, load_ms, history_delay_ms) are read live on every use, so an in-process test
    may change them while the server runs.
    """

    listen: str = "127.0.0.1"
    port: int = 8188
    base_directory: Path = field(default_factory=Path.cwd)
    output_directory: Path | None = None
    temp_directory: Path | None = None
    input_directory: Path | None = None
    cuda_device: int | str | None = None
    """--cuda-device: an int in 0.3.64; in 0.38 a string (a list such as "0,1", or "all")."""
    cpu: bool = False
    extra_model_paths_config: list[str] = field(default_factory=list)
    node_ms: float = 5.0
    load_ms: float = 50.0
    history_delay_ms: float = 0.0
    script: list[str] = field(default_factory=list)
    script_file: Path | None = None
    busy: int = 0
    max_history: int = MAXIMUM_HISTORY_SIZE
    exec_log: Path | None = None
    """--exec-log: append each execution's start and end to this file (see stats.Recorder)."""
    argv: list[str] = field(default_factory=list)
    hostile_seed: int | None = None
    without_nodes: list[str] = field(default_factory=list)
    """--without-nodes: node classes this server lacks (as a ComfyUI without that custom node): left out of
    /object_info, and POST /prompt refuses them. Read live: an in-process test may change it."""
    choices: dict[str, list[str]] = field(default_factory=dict)
    """--choices CLASS.INPUT=a,b: that combo input's choices in /object_info and in validation (the model files
    a server has). Read live."""
    models: dict[str, list[str]] | None = None
    """--models: the model files of each folder (fake_comfy.models), listed and checked by the loaders; None
    (the default): loaders take any name. Read live."""
    model_folders: dict[str, list[Path]] = field(default_factory=dict)
    """The folders the --extra-model-paths-config files add (models.read_extra_paths): their files are listed
    besides --models' (``model_files``), read again at every use as ComfyUI sees a file added while it runs."""
    step_ms: float = 2.0
    """--step-ms: the time of each sampler step (KSampler sends a progress message per step). Read live."""
    """--hostile-seed: give a random mutation (hostile.choose) to a share of the prompts scripted "ok"."""
    hostile_rate: float = 0.3
    hostile_only: list[str] = field(default_factory=list)
    """--hostile-only: the seed picks among these mutations (names, or places such as "history")."""
    hostile_trickle_s: float = 1.0
    """Seconds between the bytes of a trickled body."""
    hostile_cap_s: float = 60.0
    hostile_cap_bytes: int = 256 << 20
    """A trickled or endless body is dropped after this long or this much."""

    comfyui_version: str = field(default_factory=default_version)
    """--comfyui-version: "0.3.64" or "0.38" (see v038.py); the default is FAKE_COMFY_VERSION or 0.38."""
    database_url: str | None = None
    disable_assets: bool = False
    cache_classic: bool = False
    ram_pressure: bool = False
    """0.38 only: the fake's stand-in for memory pressure under the RAM_PRESSURE cache (every prompt runs
    uncached). Read live."""
    device_count: int = 1
    """How many devices /system_stats of 0.38 lists (it lists every visible one)."""

    def model_files(self) -> dict[str, list[str]] | None:
        """Each models folder's files: --models' and those in the --extra-model-paths-config folders; None when
        neither is given (the loaders take any name)."""
        if not self.model_folders:
            return self.models
        listed = {folder: list(files) for folder, files in (self.models or {}).items()}
        for folder, files in scan(self.model_folders).items():
            listed[folder] = sorted({*listed.get(folder, []), *files})
        return listed

    def _absolute(self, path: Path | None, default: str) -> Path:
        chosen = Path(path) if path is not None else Path(self.base_directory) / default
        return Path(os.path.abspath(chosen))

    @property
    def output_dir(self) -> Path:
        """Where SaveImage writes: <base-directory>/output unless --output-directory says otherwise."""
        return self._absolute(self.output_directory, "output")

    @property
    def temp_dir(self) -> Path:
        """Where PreviewImage writes (type "temp"); ComfyUI empties it at start."""
        return self._absolute(self.temp_directory, "temp")

    @property
    def input_dir(self) -> Path:
        """Where LoadImage reads from (type "input")."""
        return self._absolute(self.input_directory, "input")

    def directory_for_type(self, kind: str) -> Path | None:
        """ComfyUI's folder_paths.get_directory_by_type: None for an unknown type."""
        return {"output": self.output_dir, "temp": self.temp_dir, "input": self.input_dir}.get(kind)
