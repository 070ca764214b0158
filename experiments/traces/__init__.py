"""A trace simulator for snapshot placement: the real engine (scheduler, prefix cache, snapshot
store, policies) on a model-free runner, a discrete-event clock driven by the trace's arrivals,
and a roofline cost model at real model shapes. Every time it reports is *simulated*.

    python -m experiments.traces --trace mooncake-conversation --policy aligned,ours-plus \\
        --budget-gb 16 --model bamba-9b --limit 1000          # into runs/traces/<timestamp>/

Files: `cost.py` (FLOPs and bytes per forward, save and restore; the H200 roofline), `runner.py`
(the wrapper that advances the clock around the engine's model-free `PlaceholderRunner`),
`simulate.py` (the driver, on the engine's public surface, and the per-policy metrics), `oracle.py`
(the offline optimum's capture positions), `sweep.py` (policies x budgets x readings, sharded or on
Ray), `plots.py`, `study.py` (the command, on the study skeleton; `__main__.py` runs it).
"""
