"""``python -m slimgrpo`` (and ``torchrun -m slimgrpo``) = the ``slimgrpo`` command."""

import sys

from slimgrpo.commands.cli import main

sys.exit(main())
