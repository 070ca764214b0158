"""`python -m experiments.warm_restore`: runs `experiments.warm_restore.study.main`."""

import sys

from experiments.warm_restore.study import main

if __name__ == "__main__":
    sys.exit(main())
