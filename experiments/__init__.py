"""Experiments and benchmarks; each writes data and plots under results/."""
