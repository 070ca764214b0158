"""Shared pieces of every study: flags, outputs and inputs, progress, results I/O, the model runs' helpers, sweep parts, the figure style, and a background load for robustness runs."""
