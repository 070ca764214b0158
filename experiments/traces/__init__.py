"""A trace simulator for snapshot placement: the real engine (scheduler, prefix cache, snapshot
store, policies) on a model-free runner, a discrete-event clock driven by the trace's arrivals,
and a roofline cost model at real model shapes. Every time it reports is *simulated*.

    python -m experiments.traces --trace mooncake-conversation --policies aligned,ours-plus \\
        --budget-gb 16 --shape bamba-9b --limit 1000 --out /tmp/sim

Files: `cost.py` (FLOPs and bytes per forward, save and restore; the H200 roofline), `runner.py`
(the vectorized placeholder runner and the wrapper that forces the trace's replies and advances
the clock), `simulate.py` (the driver and the per-policy metrics), `oracle.py` (the offline
optimum's capture positions), `sweep.py` (policies x budgets x readings, sharded or on Ray),
`plots.py`, `__main__.py` (the command).
"""
