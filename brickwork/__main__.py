"""``python -m brickwork`` runs the ``brickwork`` command."""

import sys

from brickwork.cli import main

sys.exit(main())
