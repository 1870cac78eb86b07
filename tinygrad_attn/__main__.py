"""``python -m tinygrad_attn ...``: the ``tinygrad-attn`` command line."""

import sys

from .cli import main

sys.exit(main())
