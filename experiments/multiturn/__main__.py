"""`python -m experiments.multiturn`: the multi-turn study (see the package docstring)."""

import sys

from experiments.multiturn.cli import main

sys.exit(main())
