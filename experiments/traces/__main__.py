"""`python -m experiments.traces`: runs `experiments.traces.study.main` (the study, its flags and files)."""

import sys

from experiments.traces.study import main, parser  # noqa: F401  (parser: what `--help` shows, for tests)

if __name__ == "__main__":
    sys.exit(main())
