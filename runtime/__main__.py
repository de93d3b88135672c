"""`python -m runtime ...`: see `runtime.tools.cli`."""

import sys

from runtime.tools.cli import main

sys.exit(main())
