"""One figure style for every committed figure: a fixed colour and marker per policy, system, eviction
and variant; titles that carry the workload, model, requests, budget, eviction and "simulated";
"unbounded" as its own point; goal lines; another device's numbers marked; one save.

A name keeps its colour and marker in every figure, whatever the order of the series there:

    from experiments.common import figure_style as fs
    plt = fs.pyplot()
    ax.plot(xs, ys, **fs.line("ours-plus"), label=fs.label("ours-plus", eviction="shadow_best"))
    fs.title(fig, "SSM-usable hits against snapshot memory", workload="mooncake-conversation (chains)",
             model="bamba-9b", requests=1000, budget="0.25-64 GB", eviction="each policy's own", simulated=True)
    fs.save(fig, path)   # checks (no bars on a log axis), saves with `results_io.save_figure`, closes

`save` refuses a figure with bars on a log-scaled axis (`check`): a bar's length from an arbitrary
floor means nothing on a log scale; such figures draw points.
"""

from __future__ import annotations

import textwrap
import zlib
from pathlib import Path
from typing import Iterable

# ------------------------------------------------------------------------------------------ names
# Placement policies (planner.policies.registry): a colour and a marker each, all distinct.
POLICY_STYLES: dict[str, dict] = {
    "legacy": {"color": "#d62728", "marker": "v"},         # red: the seed's incident
    "aligned": {"color": "#2ca02c", "marker": "o"},        # green: the fix
    "vllm-align": {"color": "#1f77b4", "marker": "s"},     # blues: vLLM's two modes
    "vllm-junction": {"color": "#17becf", "marker": "D"},
    "sglang": {"color": "#bcbd22", "marker": "P"},
    "trtllm": {"color": "#ff7f0e", "marker": "^"},
    "marconi": {"color": "#8c564b", "marker": "X"},
    "ours-plus": {"color": "#9467bd", "marker": "*"},      # purple: ours-plus, everywhere
    "optimum": {"color": "#222222", "marker": "h"},        # near-black: the offline bound
    "ollama": {"color": "#e7298a", "marker": "<"},
    "ours-adaptive": {"color": "#c5b0d5", "marker": "p"},  # light purple: ours-plus with gated marks
}
# Systems (whole engines, side by side): distinct among themselves; "ours" is the aligned engine's green.
SYSTEM_STYLES: dict[str, dict] = {
    "ours": {"color": "#2ca02c", "marker": "o"},
    "vllm": {"color": "#1f77b4", "marker": "s"},
    "vllm_shared_prefix": {"color": "#6baed6", "marker": "D"},
    "transformers": {"color": "#e377c2", "marker": "p"},
    "seed": {"color": "#7f7f7f", "marker": "d"},
    "off": {"color": "#bdbdbd", "marker": "x"},            # caching off
}
ALIASES = {"vllm:default": "vllm", "vllm:shared_prefix": "vllm_shared_prefix", "caching off": "off"}
# Eviction policies: a line style (for lines) and a hatch (for bars); colour stays the placement's.
EVICTION_STYLES: dict[str, dict] = {  # marker: where the placement already has the colour (the factorial)
    "lru": {"linestyle": "-", "hatch": "..", "marker": "o"},
    "flop_aware": {"linestyle": "--", "hatch": "//", "marker": "s"},
    "learned_value": {"linestyle": "-.", "hatch": "xx", "marker": "*"},
    "seglen": {"linestyle": (0, (8, 2)), "hatch": "\\\\", "marker": "D"},
    "shadow_best": {"linestyle": (0, (1, 1)), "hatch": "++", "marker": "P"},
    "next_use": {"linestyle": (0, (3, 1, 1, 1, 1, 1)), "hatch": "", "marker": "h"},
}
# Variants of one mechanism (capture modes, benchmark variants, checkpoint placements).
VARIANT_STYLES: dict[str, dict] = {
    "in_pass": {"color": "#2ca02c", "marker": "o"},
    "two_pass": {"color": "#e6a817", "marker": "s"},
    "none": {"color": "#7f7f7f", "marker": "x"},
    "capture1": {"color": "#2ca02c", "marker": "o"},
    "capture4": {"color": "#006d2c", "marker": "^"},
    "aligned, no capture": {"color": "#7f7f7f", "marker": "x"},
    "dp": {"color": "#222222", "marker": "o"},
    "uniform": {"color": "#e6a817", "marker": "s"},
    "grid": {"color": "#9467bd", "marker": "^"},
    "triton_paged": {"color": "#2ca02c", "marker": "o"},
    "sdpa_contiguous": {"color": "#1f77b4", "marker": "s"},
    "flex_paged": {"color": "#e6a817", "marker": "^"},
    "forward": {"color": "#3b4cc0", "marker": "o"},          # a measured forward of n tokens (replay cost)
    "interval 0": {"color": "#737373", "marker": "o"},      # snapshot intervals (ablation): 0 = the tail only
    "interval 64": {"color": "#1b9e77", "marker": "o"},
    "interval 512": {"color": "#a6761d", "marker": "o"},
}
# Request kinds of the multi-turn study.
KIND_STYLES: dict[str, dict] = {  # pastel: apart from the policies' colours
    "session_start": {"color": "#8dd3c7"}, "branch_start": {"color": "#fdb462"},
    "next_turn": {"color": "#bebada"}, "regenerate": {"color": "#fb8072"},
}
GOAL = {"color": "#b8860b", "linestyle": (0, (6, 2, 1, 2)), "linewidth": 1.3}   # dark goldenrod, dash-dot
_FALLBACK = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252", "#bd9e39")
_FALLBACK_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")


def _canonical(name: str) -> str:
    name = ALIASES.get(name, name)
    if name.startswith("transformers"):
        return "transformers"
    if name.startswith("ours"):
        return name if name in POLICY_STYLES else "ours"  # ours-plus, ours-adaptive: their own; variants: the engine's
    if name.startswith("grid-"):
        return "grid"
    return name


def style(name: str) -> dict:
    """{'color', 'marker'} of a policy, system or variant; the same in every figure. A name in no
    table gets a colour fixed by its text (a hash), never by its position in a list."""
    key = _canonical(name)
    for table in (POLICY_STYLES, SYSTEM_STYLES, VARIANT_STYLES, KIND_STYLES):
        if key in table:
            return dict(table[key])
    h = zlib.crc32(name.encode())
    return {"color": _FALLBACK[h % len(_FALLBACK)], "marker": _FALLBACK_MARKERS[(h // 8) % len(_FALLBACK_MARKERS)]}


def color(name: str) -> str:
    return style(name)["color"]


def marker(name: str) -> str:
    return style(name).get("marker", "o")


def line(name: str, eviction: str | None = None, **kw) -> dict:
    """ax.plot keyword arguments: the name's colour and marker, the eviction's line style."""
    out = style(name) | {"linestyle": EVICTION_STYLES.get(eviction or "", {}).get("linestyle", "-")}
    return out | kw


def eviction_marker(eviction: str | None) -> str:
    """The eviction's marker, for a figure whose colours are the placements'."""
    return EVICTION_STYLES.get(eviction or "", {}).get("marker", "o")


def hatch(eviction: str | None) -> str:
    return EVICTION_STYLES.get(eviction or "", {}).get("hatch", "")


def label(name: str, eviction: str | None = None) -> str:
    return f"{name} ({eviction})" if eviction else name


# ------------------------------------------------------------------------------------------ figure
def pyplot():
    """matplotlib.pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def subtitle(*, workload: str | None = None, model: str | None = None, requests: int | str | None = None,
             budget: str | None = None, eviction: str | None = None, simulated: bool = False,
             device: str | None = None, extra: Iterable[str] = ()) -> str:
    """'workload ... | model ... | N requests | budget ... | eviction ... | simulated | device' (the given parts)."""
    parts = []
    if workload:
        parts.append(f"workload: {workload}")
    if model:
        parts.append(f"model: {model}")
    if requests is not None:
        parts.append(f"{requests:,} requests" if isinstance(requests, int) else f"{requests} requests")
    if budget:
        parts.append(f"budget: {budget}")
    if eviction:
        parts.append(f"eviction: {eviction}")
    if simulated:
        parts.append("SIMULATED (cost model, not measured)")
    if device:
        parts.append(f"device: {device}")
    parts += [e for e in extra if e]
    return " | ".join(parts)


def _wrap_parts(parts: list[str], width: int) -> list[str]:
    """The parts joined by ' | ', a line broken only between parts (a part longer than a line: wrapped)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " | " + part
        else:
            lines += textwrap.wrap(part, width) or [""]
    return lines


def title(target, headline: str, *, width: int | None = None, fontsize: float = 10, **parts) -> str:
    """Headline (bold) and the subtitle of `subtitle(**parts)` as the figure's suptitle (a Figure) or
    an axes title (an Axes), wrapped to the width; returns the text."""
    from matplotlib.figure import Figure

    sub = subtitle(**parts)
    is_fig = isinstance(target, Figure)
    if width is None:
        inches = (target.get_figwidth() if is_fig else target.figure.get_figwidth() * target.get_position().width)
        width = max(40, int(inches * 72 / (0.56 * fontsize)))
    lines = textwrap.wrap(headline, width) + _wrap_parts(sub.split(" | ") if sub else [], width)
    text = "\n".join(lines)
    if is_fig:
        target.suptitle(text, fontsize=fontsize)
    else:
        target.set_title(text, fontsize=fontsize)
    return text


def mark_other_device(ax, device: str, what: str = "seed's numbers", x: float | None = None,
                      span: tuple[float, float] | None = None) -> None:
    """Mark data from another device: a grey band over `span` (data x) if given, and a boxed note."""
    if span is not None:
        ax.axvspan(*span, color="0.92", zorder=0)
        ax.text(sum(span) / 2, 0.98, f"{what}:\nanother device\n({device})", transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=7, color="0.3")
    else:
        ax.text(0.01 if x is None else x, 0.99, f"{what}: another device ({device})", transform=ax.transAxes,
                ha="left", va="top", fontsize=7, color="0.3", bbox=dict(boxstyle="round", fc="0.95", ec="0.6"))


def unbounded_x(finite: Iterable[float], log: bool = True) -> float:
    """Where the 'unbounded' point goes: a step past the largest finite value."""
    finite = [float(f) for f in finite]
    if not finite:
        return 1.0
    return max(finite) * 4 if log else max(finite) + (max(finite) - min(finite) or 1.0) * 0.3


def budget_axis(ax, finite: list[float], unbounded: bool, unit: str = "GB", log: bool = True) -> float | None:
    """x ticks at the finite budgets (log) and, apart, an 'unbounded' tick behind a break; returns its x."""
    if log:
        ax.set_xscale("log")
    ax.minorticks_off()
    ticks, labels = list(finite), [f"{f:g}" for f in finite]
    x_inf = None
    if unbounded:
        x_inf = unbounded_x(finite, log)
        ticks.append(x_inf)
        labels.append("unbounded")
        if finite:
            brk = (max(finite) * x_inf) ** 0.5 if log else (max(finite) + x_inf) / 2
            ax.axvline(brk, color="0.6", lw=0.8, ls=(0, (2, 2)))
            ax.text(brk, 0.0, "//", transform=ax.get_xaxis_transform(), ha="center", va="center", fontsize=9,
                    color="0.4", bbox=dict(fc="white", ec="none", pad=0.5))
    if ticks:
        lo, hi = min(ticks), max(ticks)
        ax.set_xlim(lo / 1.6, hi * 1.6) if log else ax.set_xlim(lo - 0.1 * (hi - lo + 1), hi + 0.1 * (hi - lo + 1))
        ax.set_xticks(ticks, labels)
    ax.set_xlabel(f"snapshot memory ({unit})" + ("; 'unbounded': no limit, drawn apart" if unbounded else ""))
    return x_inf


def dodge(k: int, n: int, step: float = 0.012) -> float:
    """A factor that spreads the k-th of n series a little along a log x axis (points at one budget apart)."""
    return 10 ** (step * (k - (n - 1) / 2))


def plot_budgets(ax, budgets: list[str], ys: list[float], x_inf: float | None, name: str,
                 eviction: str | None = None, shift: float = 1.0, **kw) -> None:
    """One series over budget keys: finite budgets joined by a line, 'unbounded' its own unjoined point;
    every x times `shift` (`dodge`)."""
    lab = kw.pop("label", name)
    st = line(name, eviction) | kw
    x_inf = None if x_inf is None else x_inf * shift
    fin = [(float(b) * shift, y) for b, y in zip(budgets, ys) if b != "unbounded" and y == y]
    inf = [y for b, y in zip(budgets, ys) if b == "unbounded" and y == y]
    if fin:
        ax.plot(*zip(*fin), **st, label=lab)
        lab = None
    if inf and x_inf is not None:
        ax.plot([x_inf], inf, **(st | {"linestyle": "none"}), label=lab)


def goal_line(ax, y: float, text: str, xmin: float = 0.0, xmax: float = 1.0, horizontal: bool = True,
              where: str = "right") -> None:
    """A goal, drawn the one way: dark goldenrod dash-dot, labelled 'goal: ...' at its `where` end
    (a vertical goal with `horizontal=False`, y then being the x value)."""
    if horizontal:
        ax.axhline(y, xmin=xmin, xmax=xmax, **GOAL, zorder=1)
        ax.annotate(f"goal: {text}", (xmax if where == "right" else xmin, y), xycoords=("axes fraction", "data"),
                    ha=where, va="bottom", fontsize=7, color=GOAL["color"], xytext=(-2 if where == "right" else 2, 1),
                    textcoords="offset points", bbox=dict(fc="white", ec="none", alpha=0.8, pad=0.5))
    else:
        ax.axvline(y, ymin=xmin, ymax=xmax, **GOAL, zorder=1)
        ax.annotate(f"goal: {text}", (y, 0.02), xycoords=("data", "axes fraction"), ha="right", va="bottom",
                    fontsize=7, color=GOAL["color"], rotation=90)


def goal_marks(ax, xs: list[float], ys: list[float], text: str | None, ms: float = 22, alpha: float = 1.0) -> None:
    """A goal per point (a short goldenrod bar at each x); one legend entry (a short line) unless `text` is None."""
    ax.plot(xs, ys, linestyle="none", marker="_", ms=ms, mew=2.2, color=GOAL["color"], alpha=alpha, zorder=4)
    if text:
        ax.plot([], [], color=GOAL["color"], lw=2.2, alpha=alpha, label=f"goal: {text}")


def legend_outside(ax, **kw):
    """The legend right of the axes, so it never covers data."""
    kw = {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0,
          "frameon": False} | kw
    return ax.legend(**kw)


# ------------------------------------------------------------------------------------------ checks
def bars_on_log_axes(fig) -> list[str]:
    """Axes of `fig` whose bar-length axis is log-scaled and that carry bars (should be none)."""
    from matplotlib.container import BarContainer

    bad = []
    for ax in fig.axes:
        for c in ax.containers:
            if isinstance(c, BarContainer):
                vertical = getattr(c, "orientation", "vertical") != "horizontal"
                scale = ax.get_yscale() if vertical else ax.get_xscale()
                if scale in ("log", "symlog", "logit"):
                    bad.append(f"{ax.get_title() or ax.get_ylabel()!r}: bars on a {scale} axis")
                    break
    return bad


def check(fig) -> None:
    bad = bars_on_log_axes(fig)
    if bad:
        raise ValueError("figure style: " + "; ".join(bad))


def save(fig, path: Path, tight: bool = True) -> Path:
    """Check the figure, lay it out, save it (`results_io.save_figure`) and close it."""
    from experiments.common.results_io import save_figure

    check(fig)
    if tight:
        fig.tight_layout()
    out = save_figure(fig, Path(path))
    pyplot().close(fig)
    return out
