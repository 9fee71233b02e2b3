"""fake_comfy: a scriptable ComfyUI 0.3.64 that answers as the real one does, without a GPU.

comfysup's hardest promises are about what ComfyUI does when things go wrong; this server replays
the shapes recorded from a real ComfyUI (a copy is in tests/recorded) and lets a test script the misfortunes
(see `script.WORDS`). Run it as `python -m fake_comfy` / `python fake_comfy/main.py` with ComfyUI's
flags, or in-process::

    with FakeComfy(base_directory=tmp_path, script=["oom"]) as fc:
        requests.post(fc.url + "/prompt", json={...})
        fc.stats()["prompts"][prompt_id]["executed"]
"""

from .inprocess import FakeComfy
from .options import Options
from .script import WORDS
from .stats import Recorder
from .version import __version__

__all__ = ["WORDS", "FakeComfy", "Options", "Recorder", "__version__"]
