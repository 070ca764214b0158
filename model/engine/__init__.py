"""The engine layer: scheduler ticks -> one batched forward on a runner, snapshot save/restore.

It sits above the model core (`model.hybrid`, layers, loading, backends) and the planner; neither
of those imports it.
"""

from model.engine.engine import CAPTURE_MODES, Engine, EngineConfig
from model.engine.model_runner import ModelRunner
from model.engine.placeholder_runner import PlaceholderRunner
from model.engine.runner import Runner, RunnerOutput, RunRow

__all__ = ["CAPTURE_MODES", "Engine", "EngineConfig", "ModelRunner", "PlaceholderRunner", "Runner", "RunnerOutput",
           "RunRow"]
