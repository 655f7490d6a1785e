"""`python -m sandbox ...` == `posttrain sandbox ...`."""

import sys

from sandbox.cli import main

sys.exit(main())
