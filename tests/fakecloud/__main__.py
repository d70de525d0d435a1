"""`python -m tests.fakecloud`: a fake cloud in the foreground, printing the environment to export.

The cloud's module is imported under its own dotted name (tests.fakecloud.cloud), never run as `__main__`: moto's
model classes (the fake image's) take their service from a dotted module name (it crashed at start with an
IndexError)."""

import sys

from tests.fakecloud.cloud import main

sys.exit(main())
