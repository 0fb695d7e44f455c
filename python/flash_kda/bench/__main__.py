"""Entry point of `python -m flash_kda.bench`."""

import sys

from .main import main

sys.exit(main())
