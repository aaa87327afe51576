"""`python -m kubetf.cli ...`: the same as the `kubetf` command."""

import sys

from kubetf.cli.main import main

sys.exit(main())
