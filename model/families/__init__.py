"""Model families: each module maps one transformers `model_type` onto the shared model
(`model.families.base.Family` says what a family provides). Adding a family: one module here,
its entry in FAMILIES, and its presets in `model.config.PRESETS`."""

from __future__ import annotations

from typing import Any

from kernels.checks import require
from model.config import HybridConfig
from model.families import bamba, granite, nemotron_h
from model.families.base import Family

FAMILIES: dict[str, Family] = {f.model_type: f for f in (bamba.FAMILY, granite.FAMILY, nemotron_h.FAMILY)}


def get_family(model_type: str) -> Family:
    require(model_type in FAMILIES, "model_type", f"unsupported model family {model_type!r}; supported: "
            f"{sorted(FAMILIES)}")
    return FAMILIES[model_type]


def config_from_hf(hf: dict[str, Any]) -> HybridConfig:
    """A config.json dict -> HybridConfig through the family its `model_type` names."""
    return get_family(hf.get("model_type")).config_from_hf(hf)


__all__ = ["FAMILIES", "Family", "config_from_hf", "get_family"]
