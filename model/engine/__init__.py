"""The engine layer: scheduler ticks -> one batched forward on a runner, snapshots saved and restored.

It sits above the model core (`model.hybrid`, layers, loading, backends) and the planner; neither
of those imports it.

    engine = Engine.for_model(model, block_size=16, prefill_budget=8192, policy="aligned")
    req = engine.add_request(ids, max_new_tokens=16); engine.run_until_done()

A policy's engine defaults (its KV block, decode-state grid, eviction) are applied by every
`Engine.for_*` in one place, `settings.resolve_settings`; explicit settings win.
"""

from model.engine.engine import CAPTURE_MODES, Engine, EngineConfig, StepReport, to_chunk
from model.engine.model_runner import ModelRunner
from model.engine.placeholder_runner import PlaceholderRunner
from model.engine.runner import Runner
from model.engine.settings import EFFECTIVE_KEYS, ModelShape, resolve_settings
from model.engine.two_pass import cut_at_captures, run_in_passes

__all__ = ["CAPTURE_MODES", "EFFECTIVE_KEYS", "Engine", "EngineConfig", "ModelRunner", "ModelShape", "PlaceholderRunner",
           "Runner", "StepReport", "cut_at_captures", "resolve_settings", "run_in_passes", "to_chunk"]
