"""``python -m lm`` is the ``lm`` command (and what ``torchrun -m lm train ...`` runs)."""

import sys

from lm.cli import main

sys.exit(main())
