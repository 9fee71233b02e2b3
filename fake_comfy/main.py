"""`python fake_comfy/main.py --port 8188 ...`: the fake where a supervisor expects ComfyUI's main.py.

Runnable as a plain script without installing the package: Python then puts this folder first on
sys.path, so it is swapped for its parent, which makes `fake_comfy` importable (and keeps the
package's module names from shadowing anything).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)

from fake_comfy.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
