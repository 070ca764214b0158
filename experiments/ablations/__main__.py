"""`python -m experiments.ablations`: runs `experiments.ablations.study.main`."""

import sys

from experiments.ablations.study import main

if __name__ == "__main__":
    sys.exit(main())
