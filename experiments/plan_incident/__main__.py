"""`python -m experiments.plan_incident`: runs `experiments.plan_incident.study.main`."""

import sys

from experiments.plan_incident.study import main

if __name__ == "__main__":
    sys.exit(main())
