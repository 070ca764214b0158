"""One knob at a time around the incident: prompt length, block size, prefill budget, snapshot interval, capture mode (`python -m experiments.ablations SWEEP`; `plots.py` draws them)."""
