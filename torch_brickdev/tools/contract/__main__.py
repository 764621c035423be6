"""``python -m torch_brickdev.tools.contract``: the ``check`` command (see :func:`main`)."""

import sys

from torch_brickdev.tools.contract import main

sys.exit(main())
