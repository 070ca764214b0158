"""Model families, and the one registry of them.

Each module here maps one transformers `model_type` onto the shared model and owns everything
that is that family's (`model.families.base.Family`): its config.json mapping both ways, its
checkpoint tensor names, its feed-forward and the cost of it, and its presets. This file lists
the families (`REGISTERED`, one line each) and builds from them the two lookups everything else
reads: `FAMILIES` (model_type -> Family) and `PRESETS` (preset name -> HybridConfig, in the
order of `REGISTERED`, then each family's own order).

Adding a family: one new module exposing `FAMILY`, and its line in `REGISTERED`
(docs/add_a_family.md walks through it; tests/test_family_guide.py follows the walk).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kernels.checks import require
from model.config import HybridConfig
from model.families import bamba, granite, nemotron_h, qwen3_next
from model.families.base import Family

# The registered families, one line each.
REGISTERED: tuple[Family, ...] = (
    bamba.FAMILY,
    granite.FAMILY,
    nemotron_h.FAMILY,
    qwen3_next.FAMILY,
)

FAMILIES: dict[str, Family] = {}  # model_type -> family
PRESETS: dict[str, HybridConfig] = {}  # preset name -> shapes, every family's


def register(family: Family) -> None:
    """Add a family and its presets to `FAMILIES` and `PRESETS` (in place: every importer sees it).
    A model_type or preset name already taken, or a preset of another model_type, raises naming it."""
    require(isinstance(family, Family), "family", f"expected a Family, got {family!r}")
    require(family.model_type not in FAMILIES, "model_type", f"family {family.model_type!r} is already registered")
    for name, config in family.presets.items():
        require(name not in PRESETS, "presets", f"preset {name!r} of {family.model_type!r} is already "
                f"{PRESETS[name].model_type if name in PRESETS else ''}'s")
        require(isinstance(config, HybridConfig) and config.model_type == family.model_type, "presets",
                f"preset {name!r} of family {family.model_type!r} has model_type "
                f"{getattr(config, 'model_type', None)!r}")
    FAMILIES[family.model_type] = family
    PRESETS.update(family.presets)


for _family in REGISTERED:
    register(_family)
del _family


def get_family(model_type: str) -> Family:
    require(model_type in FAMILIES, "model_type", f"unsupported model family {model_type!r}; supported: "
            f"{sorted(FAMILIES)}")
    return FAMILIES[model_type]


def config_from_hf(hf: dict[str, Any]) -> HybridConfig:
    """A config.json dict -> HybridConfig through the family its `model_type` names; unsupported
    fields or values raise naming the field."""
    return get_family(hf.get("model_type")).config_from_hf(hf)


def config_from_json_file(path: str | Path) -> HybridConfig:
    """`config_from_hf` of a config.json file."""
    return config_from_hf(json.loads(Path(path).read_text()))


def config_to_hf(config: HybridConfig) -> dict[str, Any]:
    """The transformers config kwargs (with `model_type`) that build the same model there."""
    return get_family(config.model_type).config_to_hf(config)


__all__ = ["FAMILIES", "PRESETS", "REGISTERED", "Family", "config_from_hf", "config_from_json_file", "config_to_hf",
           "get_family", "register"]
