"""Shaping, figure and report of `experiments.peer_vllm.study` (everything drawn from the JSON).

`shape(raw)` turns the per-request records into the figures per system and scenario (cold and
warm TTFT medians, cached and recomputed tokens, state memory), the agreement of greedy tokens and
top logprobs between ours and each vLLM configuration, and the goals. Systems: "ours" (our engine
under its `--our-policy`), "vllm" (vLLM's "default" configuration, as its documentation sets up
hybrid prefix caching) and "vllm_shared_prefix" (the "shared_prefix" configuration); every vLLM
configuration is also under "vllm"."configs". The goals (`goals`, issue 21 item 5) hold ours to
"vllm_shared_prefix"; `goals_by_vllm_config` holds ours to the same goals against each configuration.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from experiments.common.results_io import write_text
from kernels.checks import require

OURS = "ours"
VLLM_DEFAULT = "vllm:default"
SYSTEM_KEYS = {"default": "vllm", "shared_prefix": "vllm_shared_prefix"}  # vLLM config -> its key in "systems"
GOALS_AGAINST = "shared_prefix"  # the vLLM configuration the goals are measured against
PAIRED = ("warm_restore", "random_lengths")  # a cold request, then the byte-identical one (warm)
SLICES = ("mooncake", "sharegpt")  # multi-turn trace slices: requests in arrival order
# Goal bounds: ours / vLLM's figure must be <= the bound ("<" for the slices' recomputed tokens).
RECOMPUTED_BOUND = 0.2  # mean recomputed tokens of the byte-identical repeats <= 1/5 of vLLM's
WARM_TTFT_BOUND = 0.5  # warm TTFT <= 0.5 x vLLM's (16K warm restore, random lengths)
COLD_TTFT_BOUND = 1.0  # cold TTFT <= vLLM's (16K warm restore, random lengths)


# ------------------------------------------------------------------------------------------ figures
def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def recomputed(rec: dict) -> int | None:
    """Prompt tokens run again: our engine's replayed tokens, else prompt length - cached tokens."""
    if "error" in rec:
        return None
    if "recomputed_tokens" in rec:
        return rec["recomputed_tokens"]
    return rec["prompt_len"] - rec["num_cached_tokens"]


def errors(recs: list[dict]) -> list[dict]:
    return [{"prompt_len": r.get("prompt_len"), "error": r["error"]} for r in recs if "error" in r]


def pair_figures(pairs: list[dict]) -> dict:
    """Cold/warm pairs -> medians, cached and recomputed tokens of the warm requests."""
    cold, warm = [p["cold"] for p in pairs], [p["warm"] for p in pairs]
    ok = [w for w in warm if "error" not in w]
    return {"n": len(pairs), "cold_ttft_s": median(c.get("wall_s") for c in cold),
            "warm_ttft_s": median(w.get("wall_s") for w in warm),
            "cold_ttft_s_all": [c.get("wall_s") for c in cold], "warm_ttft_s_all": [w.get("wall_s") for w in warm],
            # the process's CPU time per request (records from before issue 35 have none)
            "cold_cpu_s": median(c.get("cpu_s") for c in cold), "warm_cpu_s": median(w.get("cpu_s") for w in warm),
            "cold_cpu_s_all": [c.get("cpu_s") for c in cold], "warm_cpu_s_all": [w.get("cpu_s") for w in warm],
            "prompt_lens": [w.get("prompt_len") for w in warm],
            "warm_cached_tokens": [w.get("num_cached_tokens") for w in warm],
            "warm_recomputed_tokens": [recomputed(w) for w in warm],
            "mean_recomputed_tokens": mean(recomputed(w) for w in ok),
            "cold_cached_tokens": [c.get("num_cached_tokens") for c in cold],
            "errors": errors(cold + warm)}


def slice_figures(recs: list[dict]) -> dict:
    """A trace slice (Mooncake, ShareGPT): first turns (no parent) and continuations, in arrival order;
    TTFT medians over all requests (`ttft_s`), first turns (`cold_ttft_s`) and continuations (`warm_ttft_s`)."""
    first = [r for r in recs if r["parent"] is None]
    cont = [r for r in recs if r["parent"] is not None]
    ok = [r for r in recs if "error" not in r]
    return {"n": len(recs), "n_first_turns": len(first), "n_continuations": len(cont),
            "ttft_s": median(r.get("wall_s") for r in recs),
            "cold_ttft_s": median(r.get("wall_s") for r in first), "warm_ttft_s": median(r.get("wall_s") for r in cont),
            "ttft_s_all": [r.get("wall_s") for r in recs], "prompt_lens": [r.get("prompt_len") for r in recs],
            "cached_tokens": [r.get("num_cached_tokens") for r in recs],
            "recomputed_tokens": [recomputed(r) for r in recs],
            "total_prompt_tokens": sum(r["prompt_len"] for r in ok),
            "total_recomputed_tokens": sum(recomputed(r) for r in ok),
            "continuation_recomputed_tokens": sum(recomputed(r) for r in cont if "error" not in r),
            "mean_recomputed_tokens": mean(recomputed(r) for r in ok), "errors": errors(recs)}


# ------------------------------------------------------------------------------------------ agreement
def top_diff(ours: dict, theirs: dict) -> dict:
    """First-token top logprobs: same top-k ids (as a set), and the largest |ours - theirs| at their ids."""
    mine, other = ours["top_logprobs"][0], theirs["top_logprobs"][0]
    diffs = [abs(float(ours["logprobs_all"][tok]) - lp) for tok, lp in other] if "logprobs_all" in ours else \
        [abs(a[1] - b[1]) for a, b in zip(mine, other)]
    return {"same_top_ids": {t for t, _ in mine} == {t for t, _ in other}, "max_abs_diff": max(diffs)}


def agreement(ours_recs: list[dict], their_recs: list[dict]) -> dict:
    """Greedy tokens and first-token top logprobs, request by request."""
    require(len(ours_recs) == len(their_recs), "records", f"{len(ours_recs)} vs {len(their_recs)}")
    pairs = [(a, b) for a, b in zip(ours_recs, their_recs) if "error" not in a and "error" not in b]
    same = [a["tokens"] == b["tokens"] for a, b in pairs]
    tops = [top_diff(a, b) for a, b in pairs if a.get("top_logprobs") and b.get("top_logprobs")]
    return {"compared": len(pairs), "skipped_on_error": len(ours_recs) - len(pairs),
            "greedy_identical": sum(same), "greedy_tokens_identical": bool(pairs) and all(same),
            "top_ids_identical": sum(t["same_top_ids"] for t in tops),
            "top_logprob_max_abs_diff": max((t["max_abs_diff"] for t in tops), default=None),
            "top_logprob_median_abs_diff": median(t["max_abs_diff"] for t in tops)}


def flat_records(raw_scenario: dict, system: str, scenario: str) -> list[dict]:
    if scenario in SLICES:
        return raw_scenario["records"][system]
    recs = [r for p in raw_scenario["pairs"][system] for r in (p["cold"], p["warm"])]
    if scenario == "warm_restore":
        recs.append(raw_scenario["continuation"][system])
    return recs


def decode_step(cont: dict) -> float | None:
    """The warm floor: one decode step at the warm prompt's context, from the greedy continuation
    (wall minus its first token, over the tokens after it); None without our TTFT or 2 tokens."""
    n, wall, ttft = len(cont.get("tokens") or []), cont.get("wall_s"), cont.get("ttft_s")
    return (wall - ttft) / (n - 1) if n >= 2 and wall is not None and ttft is not None else None


# ------------------------------------------------------------------------------------------ shape
def system_figures(raw: dict, system: str) -> dict:
    out = {}
    for scenario, data in raw["raw"].items():
        if scenario in SLICES:
            out[scenario] = slice_figures(data["records"][system])
        else:
            out[scenario] = pair_figures(data["pairs"][system])
        if scenario == "warm_restore":
            c = data["continuation"][system]
            out[scenario]["continuation_tokens"] = c.get("tokens")
            out[scenario]["decode_step_s"] = decode_step(c)
        if system == OURS and "ours_state" in data:
            out[scenario]["state_bytes_held_after"] = data["ours_state"]["state_bytes_held"]
    return out


def vllm_state_bytes(ready: dict, mamba_layers: int) -> dict:
    """A vLLM Mamba checkpoint: one padded page per Mamba layer (conv + SSM state, padded to the
    attention page); the pool holding KV and states is preallocated."""
    r = ready.get("resolved") or {}
    page = r.get("mamba_page_size_padded")
    return {"state_bytes_per_checkpoint": page * mamba_layers if page else None,
            "state_bytes_per_checkpoint_per_layer": page, "mamba_layers": mamba_layers,
            "kv_cache_memory_bytes_preallocated": r.get("kv_cache_memory_bytes"), "block_size": r.get("block_size")}


# ------------------------------------------------------------------------------------------ goals
def _both(xs: list, ys: list) -> tuple[list, list]:
    """The entries of two request-aligned lists where neither system failed (None)."""
    kept = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    return [x for x, _ in kept], [y for _, y in kept]


def _goal(scenario, statistic: str, ours, theirs, bound: float, strict: bool = False, **extra) -> dict:
    """ours vs theirs: the two numbers, ours / theirs, the bound on that ratio, met (`strict`: ours < theirs)."""
    ratio = ours / theirs if ours is not None and theirs else None
    met = ours is not None and theirs is not None and (ours < theirs if strict else ours <= bound * theirs)
    return {"scenario": scenario, "statistic": statistic, "ours": ours, "vllm": theirs, "ratio": ratio,
            "bound": bound, "strict": strict, "met": bool(met)} | extra


def _ttft_goal(o: dict, v: dict, scenario: str, field: str, bound: float) -> dict:
    """Median TTFT of the cold or warm requests (`field`), with the per-pair ratios and the ratio of minima."""
    mine, theirs = o[scenario][f"{field}_all"], v[scenario][f"{field}_all"]
    pairs = [x / y for x, y in zip(mine, theirs) if x and y]
    lo_mine, lo_theirs = min((x for x in mine if x), default=None), min((y for y in theirs if y), default=None)
    return _goal(scenario, "median", o[scenario][field], v[scenario][field], bound, pair_ratios=pairs,
                 median_pair_ratio=median(pairs),
                 ratio_of_minima=lo_mine / lo_theirs if lo_mine and lo_theirs else None)


def goals(o: dict, v: dict, ident: dict) -> dict:
    """The issue's goals, ours (`o`) against one vLLM configuration (`v`), from per-scenario figures;
    `ident`: the greedy-token agreement the goal counts (`_identical`). Each goal: the
    two numbers ("ours", "vllm"), "ratio" = ours / vllm, the "bound" on it, "met"."""
    out = {"greedy_tokens_identical": {"identical": ident["identical"], "compared": ident["compared"],
                                       "ratio": ident["identical"] / ident["compared"] if ident["compared"] else None,
                                       "bound": 1.0, "met": ident["met"]}}
    paired = [s for s in PAIRED if s in o and s in v]
    if paired:  # every byte-identical repeat, over the requests both served
        mine, theirs = _both([x for s in paired for x in o[s]["warm_recomputed_tokens"]],
                             [y for s in paired for y in v[s]["warm_recomputed_tokens"]])
        if mine:
            out["recomputed_le_fifth"] = _goal(paired, "mean over the byte-identical repeats", mean(mine),
                                               mean(theirs), RECOMPUTED_BOUND, n=len(mine))
    for scenario in PAIRED:
        if scenario not in paired:
            continue
        suffix = "" if scenario == "warm_restore" else f"_{scenario}"
        if o[scenario]["warm_ttft_s"] is not None and v[scenario]["warm_ttft_s"]:
            out[f"warm_ttft_le_half{suffix}"] = _ttft_goal(o, v, scenario, "warm_ttft_s", WARM_TTFT_BOUND)
        if o[scenario]["cold_ttft_s"] is not None and v[scenario]["cold_ttft_s"]:
            out[f"cold_ttft_le{suffix}"] = _ttft_goal(o, v, scenario, "cold_ttft_s", COLD_TTFT_BOUND)
    for scenario in SLICES:
        if scenario in o and scenario in v:
            mine, theirs = _both(o[scenario]["recomputed_tokens"], v[scenario]["recomputed_tokens"])
            if mine:
                out[f"recomputed_below_{scenario}"] = _goal(
                    scenario, "sum over the requests both served", sum(mine), sum(theirs), 1.0, strict=True,
                    n=len(mine), ours_mean=mean(mine), vllm_mean=mean(theirs))
    return out


def _identical(agree: dict) -> dict:
    """Greedy-token agreement summed over scenarios (and systems): identical requests of those compared;
    "met": every scenario of every system compared some and all were identical."""
    per = [a for scenarios in agree.values() for a in scenarios.values()]
    return {"identical": sum(a["greedy_identical"] for a in per), "compared": sum(a["compared"] for a in per),
            "met": bool(per) and all(a["greedy_tokens_identical"] for a in per)}


# ------------------------------------------------------------------------------------------ shape: systems
def _vllm_system(vconfigs: dict, name: str, first_ready: dict) -> dict:
    """A vLLM configuration as a system: its figures per scenario, settings, version, state memory."""
    c = vconfigs.get(name, {})
    return {"scenarios": c.get("scenarios", {}), "settings": c.get("settings"), "config": name,
            "started": c.get("started"), "start_error": c.get("start_error"), "version": first_ready.get("vllm"),
            "torch": first_ready.get("torch"), "state_memory": c.get("state_memory")}


def _strip_tensors(raw_scenarios: dict) -> None:
    """Our full logprob tensors out of the stored records (kept only for the agreement)."""
    for per in raw_scenarios.values():
        for recs in (per.get("records") or {}).values():
            for r in recs:
                r.pop("logprobs_all", None)
        for pairs in (per.get("pairs") or {}).values():
            for p in pairs:
                p["cold"].pop("logprobs_all", None)
                p["warm"].pop("logprobs_all", None)
        for c in (per.get("continuation") or {}).values():
            c.pop("logprobs_all", None)


def shape(raw: dict) -> dict:
    """The JSON: settings, per-system figures, agreement, goals; the raw records without tensors."""
    first = raw["raw"][next(iter(raw["raw"]))] if raw["raw"] else {}
    names = list(first.get("pairs", first.get("records", {})))
    vllm_names = [n for n in names if n.startswith("vllm:")]
    agree = {n: {s: agreement(flat_records(d, OURS, s), flat_records(d, n, s)) for s, d in raw["raw"].items()}
             for n in vllm_names}
    vconfigs = {n.split(":", 1)[1]: {"scenarios": system_figures(raw, n), "agreement_with_ours": agree[n]}
                for n in vllm_names}
    for name, ready in raw["vllm_ready"].items():
        vconfigs.setdefault(name, {"scenarios": {}, "agreement_with_ours": {}})
        vconfigs[name] |= {"settings": ready.get("settings"), "started": bool(ready.get("ok")),
                           "start_error": ready.get("error"), "resolved": ready.get("resolved"),
                           "start_s": ready.get("start_s"),
                           "state_memory": vllm_state_bytes(ready, raw["model"]["layers"].count("M"))}
    first_ready = next(iter(raw["vllm_ready"].values()), {})
    systems = {OURS: {"scenarios": system_figures(raw, OURS) if names else {}, "settings": raw["our_engine"],
                      "policy": raw["our_engine"].get("policy"), "state_memory": raw.get("ours_state")}}
    for config, key in SYSTEM_KEYS.items():
        if config in vconfigs or config == "default":
            systems[key] = _vllm_system(vconfigs, config, first_ready)
    systems["vllm"] |= {"device": raw["environment"]["device_name"], "env": raw["vllm_env"], "configs": vconfigs}
    identical = _identical(agree)
    by_config = {n: goals(systems[OURS]["scenarios"], c["scenarios"], _identical({n: agree.get(f"vllm:{n}", {})}))
                 for n, c in vconfigs.items() if c.get("scenarios")}
    against = vconfigs.get(GOALS_AGAINST, {})
    main_goals = goals(systems[OURS]["scenarios"], against["scenarios"], identical) if against.get("scenarios") else {}
    _strip_tensors(raw["raw"])
    return {k: raw[k] for k in ("config", "environment", "model", "checkpoint", "machine_load", "probes",
                                "measure_seconds", "our_dtype_check", "effective_settings") if k in raw} | {
        "systems": systems, "agreement": agree, "greedy_tokens_identical": identical["met"],
        "mean_recomputed_tokens": {s: systems[s]["scenarios"].get("random_lengths", {}).get("mean_recomputed_tokens")
                                   for s in systems} | {f"vllm:{n}": c["scenarios"].get("random_lengths", {}).get(
                                       "mean_recomputed_tokens") for n, c in vconfigs.items()},
        "goals_against": SYSTEM_KEYS[GOALS_AGAINST] if main_goals else None, "goals": main_goals,
        "goals_by_vllm_config": by_config, "raw": raw["raw"]}


def write_all(result: dict, out: Path, flags: argparse.ArgumentParser | None = None) -> None:
    """peer_vllm.png and README.md from the JSON (`flags`: the study's parser, for the command line)."""
    plot(result, out / "peer_vllm.png")
    write_text(out / "README.md", report(result, flags))



# ------------------------------------------------------------------------------------------ figure
def series(result: dict) -> dict[str, dict]:
    """System label -> its per-scenario figures: ours, then every vLLM configuration that started."""
    out = {OURS: result["systems"][OURS]["scenarios"]}
    for name, cfg in result["systems"]["vllm"]["configs"].items():
        if cfg.get("scenarios"):
            out[f"vllm:{name}"] = cfg["scenarios"]
    return out


def our_policy(result: dict) -> str:
    return result["systems"][OURS].get("policy") or result["systems"][OURS]["settings"].get("policy") or "aligned"


def _style(result: dict, name: str, fs) -> dict:
    """A system's fixed style; ours takes its placement policy's (ours-plus purple, aligned green)."""
    return fs.style(our_policy(result)) if name == OURS else fs.style(name)


def _label(result: dict, name: str) -> str:
    return f"ours ({our_policy(result)})" if name == OURS else name


def _warm_restore_points(ax, result: dict, systems: dict, names: list[str], fs) -> None:
    """Cold (hollow) and warm (filled) median TTFT per system, as points, each with its value."""
    for k, n in enumerate(names):  # points, not bars, on the log axis: cold hollow, warm filled
        f, st = systems[n]["warm_restore"], _style(result, n, fs)
        cold, warm = f["cold_ttft_s"], f["warm_ttft_s"]
        if cold:
            ax.plot([k - 0.15], [cold], linestyle="none", ms=10, mfc="none", mew=2, **st)
            ax.annotate(f"{cold:.3g} s", (k - 0.15, cold), xytext=(-15, 0), textcoords="offset points",
                        ha="right", va="center", fontsize=7)
        if warm:
            ax.plot([k + 0.15], [warm], linestyle="none", ms=10, **st)
            rec = f["mean_recomputed_tokens"]
            ax.annotate(f"{warm * 1e3:.0f} ms\n{'-' if rec is None else f'{rec:.0f}'} tok", (k + 0.15, warm),
                        xytext=(8, 0), textcoords="offset points", ha="left", va="center", fontsize=7)


def _warm_restore_goal_marks(ax, names: list[str], goals: dict, fs) -> None:
    """The TTFT goals' bounds (bound x vLLM shared-prefix's warm and cold TTFT) beside ours."""
    if OURS not in names:
        return
    k = names.index(OURS)
    for key, x, text in (("warm_ttft_le_half", k + 0.15, "warm <= 0.5 x vLLM shared-prefix's"),
                         ("cold_ttft_le", k - 0.15, "cold <= vLLM shared-prefix's")):
        g = goals.get(key)
        if g and g.get("vllm"):
            fs.goal_marks(ax, [x], [g["bound"] * g["vllm"]], f"ours {text}", ms=20,
                          alpha=1.0 if key.startswith("warm") else 0.55)


def _warm_restore_axis(ax, result: dict, names: list[str], prompt_len: int) -> None:
    """Ticks, log scale, labels and title of the warm-restore panel."""
    ax.set_xticks(range(len(names)), [f"{_label(result, n)}\ncold (hollow) | warm" for n in names], fontsize=8)
    ax.set_xlim(-0.7, len(names) - 0.3)
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (s, median)")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.set_title(f"warm restore: {prompt_len}-token prompt, then the same again", fontsize=10)


def _offsets(systems: dict) -> dict[str, float]:
    """Each system's x offset in the per-slice panel (side by side around the slice's tick)."""
    return {n: (i - (len(systems) - 1) / 2) * 0.2 for i, n in enumerate(systems)}


def _per_request_points(axes: dict, result: dict, systems: dict, fs) -> None:
    """Every request's recomputed tokens and warm TTFT (random lengths), TTFT (each slice), and the
    slices' summed recomputed tokens, per system."""
    for n, sc in systems.items():
        st, label, dx = _style(result, n, fs), _label(result, n), _offsets(systems)[n]
        if "random_lengths" in sc:
            f = sc["random_lengths"]
            rec = f["mean_recomputed_tokens"]
            axes["rec"].plot(f["prompt_lens"], f["warm_recomputed_tokens"], linestyle="none", ms=4, alpha=0.8,
                             label=f"{label} (mean {'-' if rec is None else f'{rec:.0f}'})", **st)
            axes["rl"].plot(f["prompt_lens"], f["warm_ttft_s_all"], linestyle="none", ms=4, alpha=0.8, label=label,
                            **st)
        for k, scenario in enumerate(SLICES):
            if scenario in sc:
                f = sc[scenario]
                axes[scenario].plot(range(f["n"]), f["ttft_s_all"], ms=4, label=label, lw=0.8, **st)
                total = f["total_recomputed_tokens"]
                axes["sum"].plot([k + dx], [max(total, 1)], linestyle="none", ms=9, alpha=0.85,
                                 label=label if k == 0 or "mooncake" not in sc else None, **st)
                axes["sum"].annotate(f"{total}", (k + dx, max(total, 1)), xytext=(0, -12), textcoords="offset points",
                                     ha="center", va="top", fontsize=7)


def _per_request_axes(axes: dict, result: dict, systems: dict, goals: dict, fs) -> None:
    """The goal lines and marks, then the labels, scales, titles and grids of the per-request panels."""
    g = goals.get("recomputed_le_fifth")
    if g and g.get("vllm"):
        fs.goal_line(axes["rec"], g["vllm"] * g["bound"], f"ours' mean <= 1/5 of vLLM shared-prefix's "
                     f"({g['vllm'] * g['bound']:.1f}, both repeat scenarios)", where="left")
    for k, scenario in enumerate(SLICES):
        g = goals.get(f"recomputed_below_{scenario}")
        if g and g.get("vllm"):
            dx = _offsets(systems).get(OURS, 0.0)  # the bound beside ours
            fs.goal_marks(axes["sum"], [k + dx], [g["vllm"]], "ours < vLLM shared-prefix's" if k == 0 else None, ms=20)
    cfg = result["config"]
    axes["rec"].set(xlabel="prompt tokens", ylabel="tokens recomputed by the warm request", yscale="symlog")
    axes["rec"].set_title("random lengths: recomputed tokens of the byte-identical request", fontsize=10)
    axes["rl"].set(xlabel="prompt tokens", ylabel="warm TTFT (s)", yscale="log")
    axes["rl"].set_title("random lengths: warm TTFT", fontsize=10)
    for scenario, what in (("mooncake", f"Mooncake conversation slice ({cfg.get('mooncake_sessions')} sessions)"),
                           ("sharegpt", f"ShareGPT slice ({cfg.get('sharegpt_conversations')} conversations)")):
        axes[scenario].set(xlabel="request (arrival order)", ylabel="TTFT (s)", yscale="log")
        axes[scenario].set_title(what, fontsize=10)
    axes["sum"].set(ylabel="recomputed prompt tokens (sum over the slice)", yscale="log")
    axes["sum"].set_xticks(range(len(SLICES)), list(SLICES))
    axes["sum"].set_xlim(-0.6, len(SLICES) - 0.4)
    axes["sum"].set_title("trace slices: prompt tokens recomputed", fontsize=10)
    for ax in axes.values():
        ax.grid(alpha=0.3, which="both")


def _legends(axes: dict) -> None:
    """Each panel's legend, with headroom above the data for the two upper-left ones."""
    for key, kw in (("wr", dict(loc="center right")), ("rec", dict(loc="upper left", ncol=2)),
                    ("rl", dict(loc="upper left", ncol=2)), ("mooncake", dict(loc="upper right", ncol=2)),
                    ("sharegpt", dict(loc="upper right", ncol=2)), ("sum", dict(loc="upper center", ncol=2))):
        if axes[key].get_legend_handles_labels()[0]:
            axes[key].legend(fontsize=7, **kw)
    for key, room in (("rec", 8), ("rl", 3), ("sum", 8)):
        ax = axes[key]
        lo, hi = ax.get_ylim()
        lo = max(lo, 0) if ax.get_yscale() == "symlog" else lo / 3 if key == "sum" else lo  # "sum": its labels below
        ax.set_ylim(lo, hi * room)  # room for the legend


def _figure_title(fig, result: dict, fs) -> None:
    """The figure's title block: the systems, the workloads, the model and the device."""
    env, cfg = result["environment"], result["config"]
    fs.title(fig, f"Ours ({our_policy(result)}) vs vLLM {result['systems']['vllm']['version']}, side by side "
                  "on one machine",
             workload=", ".join(text for scenario, text in (
                 ("warm_restore", f"warm restore ({cfg['prompt_len']} tokens x {cfg['repeats']})"),
                 ("random_lengths", f"{cfg['random_count']} random lengths"),
                 ("mooncake", f"Mooncake slice ({cfg['mooncake_sessions']} sessions)"),
                 ("sharegpt", f"ShareGPT slice ({cfg.get('sharegpt_conversations')} conversations)"))
                 if scenario in (cfg.get("scenarios") or (*PAIRED, *SLICES))),
             model=f"{cfg['model']} checkpoint ({cfg['dtype']}, {cfg['threads']} thread(s) each)",
             device=f"{env['device_name']}, measured, both systems",
             extra=[f"goals: vs vLLM's {GOALS_AGAINST} configuration"])


def plot(result: dict, path: Path) -> Path:
    """peer_vllm.png: warm restore TTFT, random lengths' recomputed tokens and warm TTFT, each slice's
    TTFT per request and its summed recomputed tokens."""
    from experiments.common import figure_style as fs

    plt = fs.pyplot()
    fig, grid = plt.subplots(2, 3, figsize=(19, 9.5))
    axes = dict(zip(("wr", "rec", "rl", "mooncake", "sharegpt", "sum"), grid.flat))
    systems = series(result)
    goals = result.get("goals", {})
    names = [n for n in systems if "warm_restore" in systems[n]]
    _warm_restore_points(axes["wr"], result, systems, names, fs)
    _warm_restore_goal_marks(axes["wr"], names, goals, fs)
    _warm_restore_axis(axes["wr"], result, names, result["config"]["prompt_len"])
    _per_request_points(axes, result, systems, fs)
    _per_request_axes(axes, result, systems, goals, fs)
    _legends(axes)
    for scenario in SLICES:  # a slice the run was not given: its panels say so instead of standing empty
        if scenario not in (result["config"].get("scenarios") or SLICES):
            axes[scenario].text(0.5, 0.5, f"{scenario}: not in this run (--scenarios)", ha="center", va="center",
                                transform=axes[scenario].transAxes, color="0.4")
    _figure_title(fig, result, fs)
    return fs.save(fig, path)


# ------------------------------------------------------------------------------------------ report
def _s(v) -> str:
    return "-" if v is None else (f"{v * 1e3:.0f} ms" if v < 1 else f"{v:.2f} s")


def _n(v, fmt="{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _scenario_rows(systems: dict, scenario: str) -> list[str]:
    rows = []
    for n, sc in systems.items():
        f = sc.get(scenario)
        if not f:
            continue
        if scenario in SLICES:
            rows.append(f"| {n} | {f['n']} ({f['n_first_turns']} first turns) | {_s(f.get('ttft_s'))} | "
                        f"{_s(f['cold_ttft_s'])} | {_s(f['warm_ttft_s'])} | "
                        f"{sum(c or 0 for c in f['cached_tokens'])} | "
                        f"{f['total_recomputed_tokens']} of {f['total_prompt_tokens']} "
                        f"(continuations: {f['continuation_recomputed_tokens']}) | "
                        f"{_n(f['mean_recomputed_tokens'], '{:.1f}')} | {len(f['errors'])} |")
        else:
            cached = mean(f["warm_cached_tokens"])
            rows.append(f"| {n} | {f['n']} | {_s(f['cold_ttft_s'])} | {_s(f['warm_ttft_s'])} | {_n(cached)} | "
                        f"{_n(f['mean_recomputed_tokens'], '{:.1f}')} | {len(f['errors'])} |")
    return rows


def _agreement_rows(result: dict) -> list[str]:
    rows = []
    for n, per in result["agreement"].items():
        for s, a in per.items():
            rows.append(f"| {n} | {s} | {a['greedy_identical']}/{a['compared']} | {a['top_ids_identical']}/"
                        f"{a['compared']} | {_n(a['top_logprob_max_abs_diff'], '{:.1e}')} |")
    return rows


GOAL_LABELS = {  # goal key -> what it asks, in the report's words
    "recomputed_le_fifth": "mean recomputed tokens of the byte-identical repeats <= 1/5 of vLLM's",
    "warm_ttft_le_half": "warm TTFT <= 0.5x vLLM's", "warm_ttft_le_half_random_lengths": "warm TTFT <= 0.5x vLLM's",
    "cold_ttft_le": "cold TTFT <= vLLM's", "cold_ttft_le_random_lengths": "cold TTFT <= vLLM's",
    "recomputed_below_mooncake": "recomputed tokens below vLLM's",
    "recomputed_below_sharegpt": "recomputed tokens below vLLM's",
}


def _goal_figures(key: str, r: dict) -> str:
    """A goal's two numbers, ratio and extras, as one cell."""
    if key.startswith("recomputed_below"):
        return (f"{r['ours']} vs {r['vllm']} tokens over {r['n']} requests (ratio {_n(r['ratio'], '{:.3f}')}; "
                f"means {_n(r['ours_mean'], '{:.1f}')} vs {_n(r['vllm_mean'], '{:.1f}')})")
    if key.startswith("recomputed"):
        return f"{r['ours']:.2f} vs {r['vllm']:.2f} over {r['n']} repeats (ratio {_n(r['ratio'], '{:.3f}')})"
    extra = ""
    if r.get("pair_ratios"):
        extra = (f"; median per-pair ratio {_n(r['median_pair_ratio'], '{:.2f}')}, ratio of minima "
                 f"{_n(r['ratio_of_minima'], '{:.2f}')}")
    return f"{_s(r['ours'])} vs {_s(r['vllm'])} (ratio {_n(r['ratio'], '{:.2f}')}{extra})"


def _goal_rows(result: dict) -> list[str]:
    """One row per goal and vLLM configuration (the goals proper: against shared_prefix)."""
    rows = []
    by = result.get("goals_by_vllm_config") or {}
    met = lambda r: "**met**" if r["met"] else "**missed**"  # noqa: E731
    for name in sorted(by, key=lambda n: n != GOALS_AGAINST):  # the goals' own configuration first
        g = by[name]
        i = g["greedy_tokens_identical"]
        rows.append(f"| identical greedy tokens | {name} | {met(i)} | {i['identical']}/{i['compared']} requests |")
        for key, label in GOAL_LABELS.items():
            if key in g:
                r = g[key]
                where = ", ".join(r["scenario"]) if isinstance(r["scenario"], list) else r["scenario"]
                rows.append(f"| {label} ({where}, {r['statistic']}) | {name} | {met(r)} | {_goal_figures(key, r)} |")
    return rows


def _probe_rows(result: dict) -> list[str]:
    rows = []
    for p in result.get("probes", []):
        err = p.get("start_error") or p.get("first_prefill_error") or "none"
        outcome = "did not start" if not p["started"] else ("first prefill failed" if not p.get("first_prefill_ok")
                                                            else "ran")
        block = (p.get("resolved") or {}).get("block_size")
        rows.append(f"| `{p['probe']}` | `{p['change']}` | {outcome} | {block or '-'} | "
                    f"{' '.join(err[:300].replace('|', '/').split())} |")
    return rows


def _command_flags(result: dict, flags: argparse.ArgumentParser | None) -> str:
    """The flags of the run: the record's usual ones, then every other flag of `flags` (the study's
    parser, handed in: the study imports this module) whose recorded value is not its default (seed,
    dtype, model, threads, configurations, scenarios, ...); without a parser the usual ones only."""

    cfg = result["config"]
    text = (f"--our-policy {our_policy(result)} --prompt-len {cfg['prompt_len']} --repeats {cfg['repeats']} "
            f"--random-count {cfg['random_count']} --mooncake-sessions {cfg['mooncake_sessions']} "
            f"--sharegpt-conversations {cfg.get('sharegpt_conversations')}")
    shown = {"our_policy", "prompt_len", "repeats", "random_count", "mooncake_sessions", "sharegpt_conversations",
             "out", "publish", "replot", "vllm_python", "checkpoint_dir"}
    for action in (flags._actions if flags is not None else ()):
        name, default = action.dest, action.default
        if name in shown or name not in cfg or not action.option_strings:
            continue
        value = ",".join(cfg[name]) if isinstance(cfg[name], list) else cfg[name]
        if value != default:
            text += " --no-probes" if name == "probes" else f" {action.option_strings[-1]} {value}"
    return text


def _machine_lines(env: dict) -> list[str]:
    """The CPU and our CPU routes (`experiments.common.machine`, `kernels.torch_cpu.capability`);
    none for records written before they were recorded."""
    m, routes = env.get("machine"), (env.get("cpu_routes") or {}).get("routes")
    overridden = (env.get("cpu_routes") or {}).get("overridden") or []
    if not m:
        return []
    line = (f"Machine: {m.get('cpu_model')} ({m.get('cpu_vendor')}), {m.get('cores')} cores; ISA "
            f"{', '.join(k for k, v in (m.get('isa') or {}).items() if v) or '-'}; oneDNN {m.get('onednn')}, "
            f"MKL {m.get('mkl')}, torch CPU capability {m.get('torch_cpu_capability')}.  ")
    if routes:
        how = "decided at start-up from the capabilities and a probe" + (
            f"; set by `KERNELS_CPU_ROUTES`: {', '.join(overridden)}" if overridden else "")
        line += f"\nOur CPU routes ({how}): `{routes}`.  "
    return [line]


def _cpu_time_section(systems: dict) -> list[str]:
    """Median CPU time of each system's process per request (on a shared machine the wall time
    also holds other jobs' turns), and our warm floor: one decode step at the same context."""
    rows = []
    for scenario in PAIRED:
        for n, sc in systems.items():
            f = sc.get(scenario)
            if f and f.get("cold_cpu_s") is not None:
                rows.append(f"| {scenario} | {n} | {_s(f['cold_cpu_s'])} | {_s(f.get('warm_cpu_s'))} |")
    if not rows:
        return []
    floor = (systems.get(OURS, {}).get("warm_restore") or {})
    step, warm = floor.get("decode_step_s"), floor.get("warm_ttft_s")
    out = ["## CPU time per request (the process's, median)", "",
           "Wall time on a machine shared with other jobs also holds their turns on the cores; each system's "
           "process CPU time (`cpu_s` in the records) does not.", "",
           "| scenario | system | cold CPU time | warm CPU time |", "|---|---|---|---|", *rows, ""]
    if step:
        out += [f"Warm floor (ours): one decode step at the warm prompt's context, from the greedy continuation, "
                f"{_s(step)}; warm TTFT (median wall) {_s(warm)}, {warm / step:.2f}x the floor.", ""]
    return out


def _header_lines(result: dict, flags: argparse.ArgumentParser | None) -> list[str]:
    """Title, command, device and versions, machine load, checkpoint, and how requests are served."""
    cfg, env, v = result["config"], result["environment"], result["systems"]["vllm"]
    load = result.get("machine_load", {})
    return [
        "# Side by side with vLLM: the same checkpoint, token ids, dtype and threads", "",
        f"Command: `python -m experiments.peer_vllm {_command_flags(result, flags)}` (vLLM run by `{cfg['vllm_python']}`)  ",
        f"Ours: policy `{our_policy(result)}`, capture in the pass; as it ran: "
        f"`{(result.get('effective_settings') or {}).get(our_policy(result))}`.  ",
        f"Device: {env['device_name']}; ours: torch {env['torch']}, Python {env['python']}; vLLM {v['version']} "
        f"(torch {v['torch']}); {env['date']}; {result.get('measure_seconds', 0):.0f} s of measurement.  ",
        *_machine_lines(env),
        f"Load average (1 min) at start {_n((load.get('loadavg_start') or [None])[0], '{:.2f}')}, at end "
        f"{_n((load.get('loadavg_end') or [None])[0], '{:.2f}')} on {load.get('cpu_count')} cores shared with other "
        f"jobs; each system pinned to {cfg['threads']} thread(s) (vLLM: `{v['env']}`).  ",
        f"Checkpoint: preset `{cfg['model']}` ({result['model']['params_m']:.1f} M parameters, layers "
        f"{result['model']['layers']}, GraniteMoeHybrid), seed {cfg['seed']}, {result['checkpoint']['perturbed']}; "
        f"both systems load the same folder (sha256 {result['checkpoint']['model.safetensors_sha256'][:12]}...), "
        f"dtype {cfg['dtype']} for both.", "",
        "Every request is served alone with one output token; TTFT is the wall time of the call (vLLM: one "
        "`LLM.generate`, ours: `runs.serve`). Systems alternate request by request, the order flipping each time. "
        "*Cached* = tokens not run again (ours: the SSM restore point; vLLM: `num_cached_tokens`); *recomputed* = "
        "prompt - cached. The trace slices send each prompt alone (one output token): a later turn's prompt "
        "holds the earlier replies as tokens, which no system generated, so a turn recomputes at least the "
        "previous reply and its new user message.", "",
    ]


def _scenario_sections(result: dict, systems: dict) -> list[str]:
    """The warm restore, random lengths, Mooncake and ShareGPT tables, one row per system."""
    cfg = result["config"]
    head = ["| system | requests | cold TTFT (median) | warm TTFT (median) | cached tokens (mean, warm) | "
            "recomputed tokens (mean, warm) | errors |", "|---|---|---|---|---|---|---|"]
    slice_head = ["| system | requests | TTFT (median) | first-turn TTFT (median) | continuation TTFT (median) | "
                  "cached tokens (sum) | recomputed tokens (sum) | recomputed tokens (mean) | errors |",
                  "|---|---|---|---|---|---|---|---|---|"]
    sections = {
        "warm_restore": [f"## Warm restore ({cfg['prompt_len']} tokens, {cfg['repeats']} paired repeats, a fresh "
                         "prompt each)", "", *head],
        "random_lengths": [f"## Random lengths ({cfg['random_count']} seeded lengths in [{cfg['random_min']}, "
                           f"{cfg['random_max']}])", "", *head],
        "mooncake": [f"## Mooncake conversation slice ({cfg['mooncake_sessions']} sessions, prompts <= "
                     f"{cfg['mooncake_max_prompt']})", "", *slice_head],
        "sharegpt": [f"## ShareGPT slice ({cfg.get('sharegpt_conversations')} conversations with >= 2 requests, "
                     f"prompts <= {cfg.get('sharegpt_max_prompt')}; Qwen BPE ids folded into the checkpoint's "
                     "vocabulary, id % vocab)", "", *slice_head],
    }
    out = []
    for scenario, lines in sections.items():
        rows = _scenario_rows(systems, scenario)
        if rows or scenario in (cfg.get("scenarios") or sections):  # a scenario the run was not given: no table
            out += [*lines, *rows, ""]
    return out


def _agreement_and_goal_sections(result: dict) -> list[str]:
    """The agreement of greedy tokens and top logprobs, then the goals per vLLM configuration."""
    return [
        "## Agreement with ours (greedy tokens; first-token top-5 logprobs at vLLM's ids)", "",
        "| vLLM config | scenario | greedy identical | same top-5 ids | max abs logprob diff |", "|---|---|---|---|---|",
        *_agreement_rows(result), "",
        "## Goals", "", f"The goals (`\"goals\"` in the JSON) hold ours to vLLM's `{GOALS_AGAINST}` configuration "
        "(`\"systems\".\"vllm_shared_prefix\"`: `prefix_match_unit` 16, our block, and the shared-prefix checkpoint "
        "switch); the `default` rows (`\"systems\".\"vllm\"`, hybrid prefix caching as vLLM's documentation sets it "
        "up) hold ours to the same goals. Ratio = ours / vLLM; TTFT goals compare medians.", "",
        "| goal | vs vLLM config | | measured |", "|---|---|---|---|", *_goal_rows(result), "",
    ]


def _state_memory_section(result: dict, systems: dict) -> list[str]:
    """Bytes per snapshot and held (ours) against bytes per checkpoint and the pool (vLLM)."""
    ours_mem = result["systems"][OURS].get("state_memory") or {}
    vmem = result["systems"]["vllm"].get("state_memory") or {}
    held_after = ", ".join(f"{k} {_n(f.get('state_bytes_held_after'))}" for k, f in systems[OURS].items())
    return [
        "## State memory", "",
        f"Ours: {_n(ours_mem.get('state_bytes_per_snapshot'))} bytes per snapshot ({vmem.get('mamba_layers')} Mamba "
        f"layers' SSM + conv "
        f"state), {_n(ours_mem.get('state_bytes_held'))} bytes held at the end of the run (unbounded store; after "
        f"each scenario: {held_after}). "
        f"vLLM: {_n(vmem.get('state_bytes_per_checkpoint'))} bytes per checkpoint ({vmem.get('mamba_layers')} pages of "
        f"{vmem.get('state_bytes_per_checkpoint_per_layer')}: the state padded to a {vmem.get('block_size')}-token "
        f"attention page), inside a preallocated {_n(vmem.get('kv_cache_memory_bytes_preallocated'))}-byte pool; "
        "how many checkpoints it held is not exposed by its API and is not reported.", "",
    ]


def _vllm_settings_section(v: dict) -> list[str]:
    """What each vLLM configuration was given and what vLLM resolved (block sizes, batched tokens)."""
    lines = [
        "## vLLM settings and what vLLM made of them", "",
        "| config | started | block | hash block | max batched tokens | settings |", "|---|---|---|---|---|---|",
    ]
    for name, c in v["configs"].items():
        r = c.get("resolved") or {}
        lines.append(f"| {name} | {c['started']} {c.get('start_error') or ''} | {r.get('block_size')} | "
                     f"{r.get('hash_block_size')} | {r.get('max_num_batched_tokens')} | `{c.get('settings')}` |")
    return lines


def _probe_and_dtype_sections(result: dict) -> list[str]:
    """The probes of the settings the workarounds avoid, and our float32/bfloat16 check."""
    lines = ["", "## Probes: the settings the workarounds avoid (each run once)", "",
             "| probe | change | outcome | block vLLM chose | error |", "|---|---|---|---|---|", *_probe_rows(result), ""]
    d = result.get("our_dtype_check")
    if d:
        lines += [f"Our dtype check (cold {d['tokens']}-token prompt, same checkpoint): float32 "
                  f"{_s(d['float32_cold_s'])}, bfloat16 {_s(d['bfloat16_cold_s'])}: our torch CPU path is not fast "
                  "in bf16, so both systems run float32 (vLLM's CPU build supports float32).", ""]
    return lines


def report(result: dict, flags: argparse.ArgumentParser | None = None) -> str:
    """README.md: every table and the settings, from the JSON (`flags`: the study's parser, whose
    non-default values the command line names)."""
    systems = series(result)
    lines = [*_header_lines(result, flags), *_scenario_sections(result, systems), *_cpu_time_section(systems),
             *_agreement_and_goal_sections(result),
             *_state_memory_section(result, systems), *_vllm_settings_section(result["systems"]["vllm"]),
             *_probe_and_dtype_sections(result)]
    return "\n".join(lines) + "\n"
