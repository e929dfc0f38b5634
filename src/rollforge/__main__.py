"""``python -m rollforge ...`` is the ``rollforge`` command (what ``torchrun -m rollforge train`` runs on each rank)."""

import sys

from .cli.main import main

sys.exit(main())
