"""`python -m experiments.peer_vllm`: runs `experiments.peer_vllm.study.main`."""

import sys

from experiments.peer_vllm.study import main

if __name__ == "__main__":
    sys.exit(main())
