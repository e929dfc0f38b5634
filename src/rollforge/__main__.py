"""``python -m rollforge ...`` is the ``rollforge`` command (what ``torchrun -m rollforge train`` runs on each rank)."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
