"""`python -m fake_comfy --port 8188 --base-directory DIR ...`"""

import sys

from fake_comfy.cli import main

sys.exit(main())
