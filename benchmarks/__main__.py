"""``python -m benchmarks``: run the kernel benchmark sweep (see ``runner``)."""

import sys

from .runner import main

sys.exit(main())
