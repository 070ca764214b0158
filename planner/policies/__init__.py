"""Snapshot placement policies: one class per policy, one file per policy or per peer.

A placement policy (`base.PlacementPolicy`) says where a prompt's prefill chunks end and where
they leave an SSM snapshot (`chunk_len`, `saves_snapshot`, `last_captures`, `marks`,
`speculative_marks`, `mark_mode`), and carries the engine defaults of the same design: the KV
block it matches with (`kv_block`), where a finishing request's decode state is kept
(`decode_grid`), its snapshot eviction (`eviction`) and whether it needs a driver that knows the
trace (`needs_oracle`). Its class docstring cites where the rules come from (`source`).
`planner.prefill_plan` turns a policy's rules into chunk plans; `registry.POLICIES` names them.

Files: `base` (the policy type, `PlanContext`, the shared junction rule), `aligned` (the seed's
pinned rules and the fix), `legacy` (before the fix), `vllm` (vLLM 0.32's two modes and its
padded block), `sglang`, `trtllm`, `marconi`, `ours_plus`, `optimum`; `registry` lists them.

To add a policy: write `planner/policies/<name>.py` with a subclass of `PlacementPolicy` that
sets `name` (and any engine default that differs from the base's), overrides the rules it
changes, and cites its source in its docstring; then add one instance to the tuple in
`registry.py`. This package's `__init__` imports nothing, so importing any of its modules loads
only what that module needs (no registration by import side effect).
"""
