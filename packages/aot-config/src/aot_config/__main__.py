"""``python -m aot_config show ...``: same as the ``aot-config`` command."""

from __future__ import annotations

import sys

from aot_config.cli import main

sys.exit(main())
