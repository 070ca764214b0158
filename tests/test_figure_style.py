"""The one figure style (`experiments.common.figure_style`): a fixed colour and marker per policy, the same in
every figure whatever the order of its series, and no bars on a log-scaled axis."""

from __future__ import annotations

import json
import pathlib

import pytest

from experiments.common import figure_style as fs
from planner.policies.registry import POLICIES

REPO = pathlib.Path(__file__).resolve().parents[1]
PLOTTING = ("experiments/ablations/plots.py", "experiments/warm_restore/report.py", "experiments/multiturn/report.py",
            "experiments/peer_vllm/report.py", "experiments/traces/plots.py", "experiments/traces/snapshot_budget.py",
            "experiments/bench/ssd_scan.py", "experiments/bench/paged_attention.py",
            "experiments/bench/model_prefill.py")


def test_every_registered_policy_has_its_own_fixed_colour_and_marker():
    assert set(POLICIES) <= set(fs.POLICY_STYLES), "a registered policy without a style"
    colours = [fs.color(n) for n in POLICIES]
    markers = [fs.marker(n) for n in POLICIES]
    assert len(set(colours)) == len(POLICIES), colours
    assert len(set(markers)) == len(POLICIES), markers
    systems = [fs.color(n) for n in fs.SYSTEM_STYLES]
    assert len(set(systems)) == len(systems)
    assert fs.style("vllm:default") == fs.style("vllm") and fs.color("ours_torch_forward_batch") == fs.color("ours")
    assert fs.color("transformers_bamba") == fs.color("transformers")
    assert fs.style("some-new-name") == fs.style("some-new-name")  # unknown: fixed by its name, not its position


def test_every_registered_eviction_has_its_own_line_style_and_hatch():
    from planner.evictions.registry import EVICTION_POLICIES

    assert set(EVICTION_POLICIES) <= set(fs.EVICTION_STYLES)
    styles = [fs.EVICTION_STYLES[e] for e in EVICTION_POLICIES]
    assert len({str(s["linestyle"]) for s in styles}) == len(styles)
    assert len({s["hatch"] for s in styles}) == len(styles)


def _summary(order: list[str], budgets: list[str]) -> tuple[dict, list[dict]]:
    prompt = 1000
    pols = {}
    for k, name in enumerate(order):
        by = {b: {"ssm_hit_tokens": 100 + 10 * k + j, "kv_hit_tokens": 300, "lost_tokens": 200 - 10 * k,
                  "replayed_tokens": 900 - 10 * k, "block_size": 16, "forwards": 10}
              for j, b in enumerate(budgets)}
        pols[name] = {"eviction": POLICIES[name].eviction if name in POLICIES else None, "by_budget": by}
    summary = {"trace": "synthetic", "shape": "bamba-9b", "requests": 3, "simulated": True, "config": {},
               "readings": {"chains": {"prompt_tokens": prompt, "policies": pols}}}
    ttft = [{"reading": "chains", "policy": n, "budget_gb": None if b == "unbounded" else float(b),
             "ttft_s": [0.1, 0.2, 0.3 + k]} for k, n in enumerate(order) for b in budgets]
    return summary, ttft


@pytest.fixture
def captured(monkeypatch):
    """Every figure `figure_style.save` is given, kept open instead of written."""
    figs = []

    def keep(fig, path, tight=True):
        fs.check(fig)
        figs.append((pathlib.Path(path).name, fig))
        return pathlib.Path(path)

    monkeypatch.setattr(fs, "save", keep)
    yield figs
    plt = fs.pyplot()
    for _, fig in figs:
        plt.close(fig)


def _line_colours(fig) -> dict[str, str]:
    from matplotlib.colors import to_hex

    return {ln.get_label(): to_hex(ln.get_color()) for ax in fig.axes for ln in ax.get_lines()
            if not ln.get_label().startswith("_")}


def test_a_policy_keeps_its_colour_across_figures(tmp_path, captured):
    from experiments.traces.plots import plot_all

    orders = (["ours-plus", "legacy", "vllm-align", "optimum"], ["marconi", "vllm-align", "optimum", "ours-plus"])
    for i, order in enumerate(orders):
        out = tmp_path / f"run{i}"
        out.mkdir()
        summary, ttft = _summary(order, ["0.25", "4", "unbounded"])
        (out / "summary.json").write_text(json.dumps(summary))
        (out / "ttft.json").write_text(json.dumps(ttft))
        plot_all(out)
    hit = [fig for name, fig in captured if name.startswith("hit_rate_vs_memory")]
    cdf = [fig for name, fig in captured if name.startswith("ttft_cdf")]
    assert len(hit) == 2 and len(cdf) == 2
    for figs in (hit, cdf):
        a, b = (_line_colours(f) for f in figs)
        for name in ("ours-plus", "vllm-align", "optimum"):
            la = next(k for k in a if k.split(" (")[0] == name)
            lb = next(k for k in b if k.split(" (")[0] == name)
            assert a[la] == b[lb] == fs.color(name), (name, a[la], b[lb])
    # 'unbounded' is its own tick, not a number, and its point is not joined to the finite budgets
    ax = hit[0].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "unbounded"
    ours = [ln for ln in ax.get_lines() if ln.get_color() == fs.color("ours-plus") and ln.get_linestyle() == "None"]
    assert ours, "the unbounded point is drawn apart"


def test_no_log_axis_carries_bars(captured, tmp_path):
    from experiments.traces.plots import plot_all

    summary, ttft = _summary(list(POLICIES), ["1", "unbounded"])
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "ttft.json").write_text(json.dumps(ttft))
    plot_all(tmp_path)
    assert captured and all(fs.bars_on_log_axes(fig) == [] for _, fig in captured)

    plt = fs.pyplot()
    fig, ax = plt.subplots()
    ax.bar([0, 1], [1, 100])
    ax.set_yscale("log")
    assert fs.bars_on_log_axes(fig)
    with pytest.raises(ValueError, match="bars on a log axis"):
        fs.check(fig)
    plt.close(fig)


@pytest.mark.parametrize("path", PLOTTING)
def test_plotting_code_takes_its_style_from_the_one_module(path):
    text = (REPO / path).read_text()
    assert "figure_style" in text, f"{path} does not use experiments.common.figure_style"
    assert "save_figure(" not in text, f"{path} saves around figure_style.save"
    assert '"tab:' not in text and '"C0"' not in text and 'f"C{' not in text, f"{path} picks its own colours"
