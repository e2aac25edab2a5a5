"""``python -m specactor``: the ``specactor`` command."""

import sys

from specactor.cli.main import main

sys.exit(main())
