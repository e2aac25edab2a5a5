"""``python -m specactor.cli``: the ``specactor`` command."""

import sys

from specactor.cli.main import main

sys.exit(main())
