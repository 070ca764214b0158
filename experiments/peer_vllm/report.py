"""Shaping, figure and report of `experiments.peer_vllm.study` (everything drawn from the JSON).

`shape(raw)` turns the per-request records into the figures per system and scenario (cold and
warm TTFT medians, cached and recomputed tokens, state memory), the agreement of greedy tokens and
top logprobs between ours and each vLLM configuration, and the goals. The system "vllm" is vLLM's
"default" configuration; every configuration is also under "vllm_configs".
"""

from __future__ import annotations

import statistics
from pathlib import Path

from experiments.common.results_io import write_text
from kernels.checks import require

OURS = "ours"
VLLM_DEFAULT = "vllm:default"


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
            "prompt_lens": [w.get("prompt_len") for w in warm],
            "warm_cached_tokens": [w.get("num_cached_tokens") for w in warm],
            "warm_recomputed_tokens": [recomputed(w) for w in warm],
            "mean_recomputed_tokens": mean(recomputed(w) for w in ok),
            "cold_cached_tokens": [c.get("num_cached_tokens") for c in cold],
            "errors": errors(cold + warm)}


def mooncake_figures(recs: list[dict]) -> dict:
    """First turns (no parent) and continuations, in arrival order."""
    first = [r for r in recs if r["parent"] is None]
    cont = [r for r in recs if r["parent"] is not None]
    ok = [r for r in recs if "error" not in r]
    return {"n": len(recs), "n_first_turns": len(first), "n_continuations": len(cont),
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
    if scenario == "mooncake":
        return raw_scenario["records"][system]
    recs = [r for p in raw_scenario["pairs"][system] for r in (p["cold"], p["warm"])]
    if scenario == "warm_restore":
        recs.append(raw_scenario["continuation"][system])
    return recs


# ------------------------------------------------------------------------------------------ shape
def system_figures(raw: dict, system: str) -> dict:
    out = {}
    for scenario, data in raw["raw"].items():
        if scenario == "mooncake":
            out[scenario] = mooncake_figures(data["records"][system])
        else:
            out[scenario] = pair_figures(data["pairs"][system])
        if scenario == "warm_restore":
            c = data["continuation"][system]
            out[scenario]["continuation_tokens"] = c.get("tokens")
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


def goals(o: dict, v: dict, ident: bool) -> dict:
    """The issue's four goals, ours (`o`) against one vLLM configuration (`v`), per-scenario figures."""
    out = {"greedy_tokens_identical": {"met": ident}}
    if "random_lengths" in o and v.get("random_lengths", {}).get("mean_recomputed_tokens"):
        a, b = o["random_lengths"]["mean_recomputed_tokens"], v["random_lengths"]["mean_recomputed_tokens"]
        out["recomputed_le_fifth"] = {"ours": a, "vllm": b, "ratio": a / b, "met": a <= b / 5}
    for key, scen, bound in (("warm_ttft_le", "warm_restore", 1.0), ("cold_ttft_within_1.5x", "warm_restore", 1.5)):
        field = "warm_ttft_s" if key.startswith("warm") else "cold_ttft_s"
        if scen in o and v.get(scen, {}).get(field):
            a, b = o[scen][field], v[scen][field]
            pairs = [x / y for x, y in zip(o[scen][f"{field}_all"], v[scen][f"{field}_all"]) if x and y]
            mins = min(x for x in o[scen][f"{field}_all"] if x) / min(y for y in v[scen][f"{field}_all"] if y)
            out[key] = {"scenario": scen, "ours_s": a, "vllm_s": b, "ratio": a / b, "met": a <= bound * b,
                        "statistic": "median", "ratio_of_minima": mins, "pair_ratios": pairs}
    if "random_lengths" in o and v.get("random_lengths", {}).get("cold_ttft_s"):
        a, b = o["random_lengths"]["cold_ttft_s"], v["random_lengths"]["cold_ttft_s"]
        out["cold_ttft_within_1.5x_random_lengths"] = {"scenario": "random_lengths", "ours_s": a, "vllm_s": b,
                                                        "ratio": a / b, "met": a <= 1.5 * b, "statistic": "median"}
    return out


def shape(raw: dict) -> dict:
    """The JSON: settings, per-system figures, agreement, goals; the raw records without tensors."""
    names = [n for n in raw["raw"][next(iter(raw["raw"]))].get("pairs", raw["raw"][next(iter(raw["raw"]))].get(
        "records"))] if raw["raw"] else []
    vllm_names = [n for n in names if n.startswith("vllm:")]
    agree = {n: {s: agreement(flat_records(d, OURS, s), flat_records(d, n, s)) for s, d in raw["raw"].items()}
             for n in vllm_names}
    vconfigs = {n.split(":", 1)[1]: {"scenarios": system_figures(raw, n), "agreement_with_ours": agree[n]}
                for n in vllm_names}
    for name, ready in raw["vllm_ready"].items():
        vconfigs.setdefault(name, {"scenarios": {}, "agreement_with_ours": {}})
        vconfigs[name] |= {"settings": ready.get("settings"), "started": bool(ready.get("ok")),
                           "start_error": ready.get("error"), "resolved": ready.get("resolved"),
                           "start_s": ready.get("start_s"), "state_memory": vllm_state_bytes(ready, raw["model"]["layers"].count("M"))}
    default = vconfigs.get("default", {"scenarios": {}})
    first_ready = next(iter(raw["vllm_ready"].values()), {})
    systems = {OURS: {"scenarios": system_figures(raw, OURS) if names else {}, "settings": raw["our_engine"],
                      "state_memory": raw.get("ours_state")},
               "vllm": {"scenarios": default["scenarios"], "settings": default.get("settings"),
                        "version": first_ready.get("vllm"), "torch": first_ready.get("torch"),
                        "device": raw["environment"]["device_name"], "env": raw["vllm_env"],
                        "state_memory": default.get("state_memory"), "configs": vconfigs}}
    ident = bool(agree) and all(a["greedy_tokens_identical"] for per in agree.values() for a in per.values())
    for per in raw["raw"].values():  # tensors out of the stored records
        for recs in (per.get("records") or {}).values():
            for r in recs:
                r.pop("logprobs_all", None)
        for pairs in (per.get("pairs") or {}).values():
            for p in pairs:
                p["cold"].pop("logprobs_all", None)
                p["warm"].pop("logprobs_all", None)
        for c in (per.get("continuation") or {}).values():
            c.pop("logprobs_all", None)
    return {k: raw[k] for k in ("config", "environment", "model", "checkpoint", "machine_load", "probes",
                                "measure_seconds", "our_dtype_check", "effective_settings") if k in raw} | {
        "systems": systems, "agreement": agree, "greedy_tokens_identical": ident,
        "mean_recomputed_tokens": {s: systems[s]["scenarios"].get("random_lengths", {}).get("mean_recomputed_tokens")
                                   for s in systems} | {f"vllm:{n}": c["scenarios"].get("random_lengths", {}).get(
                                       "mean_recomputed_tokens") for n, c in vconfigs.items()},
        "goals": goals(systems[OURS]["scenarios"], systems["vllm"]["scenarios"], ident) if names else {},
        "goals_by_vllm_config": {n: goals(systems[OURS]["scenarios"], c["scenarios"], all(
            a["greedy_tokens_identical"] for a in agree.get(f"vllm:{n}", {}).values()) and f"vllm:{n}" in agree)
            for n, c in vconfigs.items() if c.get("scenarios")},
        "raw": raw["raw"]}


def write_all(result: dict, out: Path) -> None:
    """peer_vllm.png and README.md from the JSON."""
    plot(result, out / "peer_vllm.png")
    write_text(out / "README.md", report(result))



# ------------------------------------------------------------------------------------------ figure
def series(result: dict) -> dict[str, dict]:
    """System label -> its per-scenario figures: ours, then every vLLM configuration that started."""
    out = {OURS: result["systems"][OURS]["scenarios"]}
    for name, cfg in result["systems"]["vllm"]["configs"].items():
        if cfg.get("scenarios"):
            out[f"vllm:{name}"] = cfg["scenarios"]
    return out


def _warm_restore_points(ax, systems: dict, names: list[str], fs) -> None:
    """Cold (hollow) and warm (filled) median TTFT per system, as points, each with its value."""
    for k, n in enumerate(names):  # points, not bars, on the log axis: cold hollow, warm filled
        f, st = systems[n]["warm_restore"], fs.style(n)
        cold, warm = f["cold_ttft_s"], f["warm_ttft_s"]
        if cold:
            ax.plot([k - 0.15], [cold], linestyle="none", ms=10, mfc="none", mew=2, **st)
            ax.annotate(f"{cold:.3g} s", (k - 0.15, cold), xytext=(-15, 0), textcoords="offset points",
                        ha="right", va="center", fontsize=7)
        if warm:
            ax.plot([k + 0.15], [warm], linestyle="none", ms=10, **st)
            ax.annotate(f"{warm * 1e3:.0f} ms\n{f['mean_recomputed_tokens']:.0f} tok", (k + 0.15, warm),
                        xytext=(8, 0), textcoords="offset points", ha="left", va="center", fontsize=7)


def _warm_restore_goal_marks(ax, names: list[str], goals: dict, fs) -> None:
    """The TTFT goals' bounds (vLLM default's warm TTFT, 1.5 x its cold TTFT) beside ours."""
    if OURS not in names:
        return
    k = names.index(OURS)
    for key, x, text in (("warm_ttft_le", k + 0.15, "warm <= vLLM default's"),
                         ("cold_ttft_within_1.5x", k - 0.15, "cold <= 1.5 x vLLM default's")):
        g = goals.get(key)
        if g and g.get("vllm_s"):
            bound = g["vllm_s"] * (1.5 if key.startswith("cold") else 1.0)
            fs.goal_marks(ax, [x], [bound], f"ours {text}", ms=20, alpha=1.0 if key.startswith("warm") else 0.55)


def _warm_restore_axis(ax, names: list[str], prompt_len: int) -> None:
    """Ticks, log scale, labels and title of the warm-restore panel."""
    ax.set_xticks(range(len(names)), [f"{n}\ncold (hollow) | warm" for n in names], fontsize=8)
    ax.set_xlim(-0.7, len(names) - 0.3)
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (s, median)")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.set_title(f"warm restore: {prompt_len}-token prompt, then the same again", fontsize=10)


def _per_request_points(ax_rec, ax_rl, ax_mc, systems: dict, fs) -> None:
    """Every request's recomputed tokens and warm TTFT (random lengths) and TTFT (Mooncake), per system."""
    for n, sc in systems.items():
        st = fs.style(n)
        if "random_lengths" in sc:
            f = sc["random_lengths"]
            ax_rec.plot(f["prompt_lens"], f["warm_recomputed_tokens"], linestyle="none", ms=4, alpha=0.8,
                        label=f"{n} (mean {f['mean_recomputed_tokens']:.0f})", **st)
            ax_rl.plot(f["prompt_lens"], f["warm_ttft_s_all"], linestyle="none", ms=4, alpha=0.8, label=n, **st)
        if "mooncake" in sc:
            f = sc["mooncake"]
            ax_mc.plot(range(f["n"]), f["ttft_s_all"], ms=4, label=n, lw=0.8, **st)


def _per_request_axes(ax_rec, ax_rl, ax_mc, goals: dict, fs) -> None:
    """The recomputed-tokens goal line, then the labels, scales, titles and grids of the per-request panels."""
    g = goals.get("recomputed_le_fifth")
    if g and g.get("vllm"):
        fs.goal_line(ax_rec, g["vllm"] / 5, f"ours' mean <= 1/5 of vLLM default's ({g['vllm'] / 5:.0f})",
                     where="left")
    ax_rec.set(xlabel="prompt tokens", ylabel="tokens recomputed by the warm request", yscale="symlog")
    ax_rec.set_title("random lengths: recomputed tokens of the byte-identical request", fontsize=10)
    ax_rl.set(xlabel="prompt tokens", ylabel="warm TTFT (s)", yscale="log")
    ax_rl.set_title("random lengths: warm TTFT", fontsize=10)
    ax_mc.set(xlabel="request (arrival order)", ylabel="TTFT (s)", yscale="log")
    ax_mc.set_title("Mooncake conversation slice (chains reading)", fontsize=10)
    for ax in (ax_rec, ax_rl, ax_mc):
        ax.grid(alpha=0.3, which="both")


def _legends(ax_wr, ax_rec, ax_rl, ax_mc) -> None:
    """Each panel's legend, with headroom above the data for the two upper-left ones."""
    ax_wr.legend(fontsize=7, loc="center right")
    ax_rec.legend(fontsize=7, loc="upper left", ncol=3)
    ax_rl.legend(fontsize=7, loc="upper left", ncol=3)
    ax_mc.legend(fontsize=7, loc="upper right", ncol=3)
    for ax, room in ((ax_rec, 8), (ax_rl, 3)):
        lo, hi = ax.get_ylim()
        ax.set_ylim(max(lo, 0) if ax.get_yscale() == "symlog" else lo, hi * room)  # room for the legend


def _figure_title(fig, result: dict, fs) -> None:
    """The figure's title block: the systems, the workloads, the model and the device."""
    env, cfg = result["environment"], result["config"]
    fs.title(fig, f"Ours vs vLLM {result['systems']['vllm']['version']}, side by side on one machine",
             workload=f"warm restore ({cfg['prompt_len']} tokens x {cfg['repeats']}), {cfg['random_count']} random "
                      f"lengths, Mooncake slice ({cfg['mooncake_sessions']} sessions)",
             model=f"{cfg['model']} checkpoint ({cfg['dtype']}, {cfg['threads']} thread(s) each)",
             device=f"{env['device_name']}, measured, both systems", extra=["goals: vs vLLM's default configuration"])


def plot(result: dict, path: Path) -> Path:
    """peer_vllm.png: warm restore TTFT, random lengths' recomputed tokens and warm TTFT, Mooncake TTFT."""
    from experiments.common import figure_style as fs

    plt = fs.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    (ax_wr, ax_rec), (ax_rl, ax_mc) = axes
    systems = series(result)
    goals = result.get("goals", {})
    names = [n for n in systems if "warm_restore" in systems[n]]
    _warm_restore_points(ax_wr, systems, names, fs)
    _warm_restore_goal_marks(ax_wr, names, goals, fs)
    _warm_restore_axis(ax_wr, names, result["config"]["prompt_len"])
    _per_request_points(ax_rec, ax_rl, ax_mc, systems, fs)
    _per_request_axes(ax_rec, ax_rl, ax_mc, goals, fs)
    _legends(ax_wr, ax_rec, ax_rl, ax_mc)
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
        if scenario == "mooncake":
            rows.append(f"| {n} | {f['n']} ({f['n_first_turns']} first turns) | {_s(f['cold_ttft_s'])} | "
                        f"{_s(f['warm_ttft_s'])} | {sum(c or 0 for c in f['cached_tokens'])} | "
                        f"{f['total_recomputed_tokens']} of {f['total_prompt_tokens']} "
                        f"(continuations: {f['continuation_recomputed_tokens']}) | {len(f['errors'])} |")
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


def _goal_rows(result: dict) -> list[str]:
    """One row per goal and vLLM configuration ("default" is the issue's "vllm")."""
    rows = []
    by = result.get("goals_by_vllm_config") or {"default": result["goals"]}
    for name, g in by.items():
        met = lambda r: "**met**" if r["met"] else "**missed**"  # noqa: E731
        rows.append(f"| identical greedy tokens | {name} | {met(g['greedy_tokens_identical'])} | every compared request |")
        if "recomputed_le_fifth" in g:
            r = g["recomputed_le_fifth"]
            rows.append(f"| mean recomputed tokens (random lengths) <= 1/5 of vLLM's | {name} | {met(r)} | "
                        f"{r['ours']:.1f} vs {r['vllm']:.1f} (ratio {r['ratio']:.3f}) |")
        for key, label in (("warm_ttft_le", "warm TTFT <= vLLM's"), ("cold_ttft_within_1.5x",
                                                                     "cold TTFT <= 1.5x vLLM's"),
                           ("cold_ttft_within_1.5x_random_lengths", "cold TTFT <= 1.5x vLLM's")):
            if key in g:
                r = g[key]
                extra = ""
                if "pair_ratios" in r:
                    extra = (f"; ratio of minima {r['ratio_of_minima']:.2f}, per pair "
                             f"{', '.join(f'{x:.2f}' for x in r['pair_ratios'])}")
                rows.append(f"| {label} ({r['scenario']}, medians) | {name} | {met(r)} | {_s(r['ours_s'])} vs "
                            f"{_s(r['vllm_s'])} (ratio {r['ratio']:.2f}{extra}) |")
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


def _header_lines(result: dict) -> list[str]:
    """Title, command, device and versions, machine load, checkpoint, and how requests are served."""
    cfg, env, v = result["config"], result["environment"], result["systems"]["vllm"]
    load = result.get("machine_load", {})
    return [
        "# Side by side with vLLM: the same checkpoint, token ids, dtype and threads", "",
        f"Command: `python -m experiments.peer_vllm --prompt-len {cfg['prompt_len']} --repeats {cfg['repeats']} "
        f"--random-count {cfg['random_count']} --mooncake-sessions {cfg['mooncake_sessions']}` "
        f"(vLLM run by `{cfg['vllm_python']}`)  ",
        f"Device: {env['device_name']}; ours: torch {env['torch']}, Python {env['python']}; vLLM {v['version']} "
        f"(torch {v['torch']}); {env['date']}; {result.get('measure_seconds', 0):.0f} s of measurement.  ",
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
        "prompt - cached.", "",
    ]


def _scenario_sections(result: dict, systems: dict) -> list[str]:
    """The warm restore, random lengths and Mooncake tables, one row per system."""
    cfg = result["config"]
    head = ["| system | requests | cold TTFT (median) | warm TTFT (median) | cached tokens (mean, warm) | "
            "recomputed tokens (mean, warm) | errors |", "|---|---|---|---|---|---|---|"]
    return [
        f"## Warm restore ({cfg['prompt_len']} tokens, {cfg['repeats']} paired repeats, a fresh prompt each)", "",
        *head, *_scenario_rows(systems, "warm_restore"), "",
        f"## Random lengths ({cfg['random_count']} seeded lengths in [{cfg['random_min']}, {cfg['random_max']}])", "",
        *head, *_scenario_rows(systems, "random_lengths"), "",
        f"## Mooncake conversation slice ({cfg['mooncake_sessions']} sessions, prompts <= {cfg['mooncake_max_prompt']})",
        "", "| system | requests | first-turn TTFT (median) | continuation TTFT (median) | cached tokens (sum) | "
            "recomputed tokens (sum) | errors |", "|---|---|---|---|---|---|---|",
        *_scenario_rows(systems, "mooncake"), "",
    ]


def _agreement_and_goal_sections(result: dict) -> list[str]:
    """The agreement of greedy tokens and top logprobs, then the goals per vLLM configuration."""
    return [
        "## Agreement with ours (greedy tokens; first-token top-5 logprobs at vLLM's ids)", "",
        "| vLLM config | scenario | greedy identical | same top-5 ids | max abs logprob diff |", "|---|---|---|---|---|",
        *_agreement_rows(result), "",
        "## Goals", "", "`\"systems\".\"vllm\"` in the JSON (and the issue's goals) is vLLM's `default` configuration, "
        "as its documentation sets up hybrid prefix caching; the `shared_prefix` rows hold ours to the same goals "
        "against vLLM with `prefix_match_unit` 16 (our block) and the shared-prefix checkpoint switch.", "",
        "| goal | vs vLLM config | | measured |", "|---|---|---|---|", *_goal_rows(result), "",
    ]


def _state_memory_section(result: dict, systems: dict) -> list[str]:
    """Bytes per snapshot and held (ours) against bytes per checkpoint and the pool (vLLM)."""
    ours_mem = result["systems"][OURS].get("state_memory") or {}
    vmem = result["systems"]["vllm"].get("state_memory") or {}
    held_after = ", ".join(f"{k} {_n(f.get('state_bytes_held_after'))}" for k, f in systems[OURS].items())
    return [
        "## State memory", "",
        f"Ours: {_n(ours_mem.get('state_bytes_per_snapshot'))} bytes per snapshot (5 Mamba layers' SSM + conv "
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


def report(result: dict) -> str:
    """README.md: every table and the settings, from the JSON."""
    systems = series(result)
    lines = [*_header_lines(result), *_scenario_sections(result, systems), *_agreement_and_goal_sections(result),
             *_state_memory_section(result, systems), *_vllm_settings_section(result["systems"]["vllm"]),
             *_probe_and_dtype_sections(result)]
    return "\n".join(lines) + "\n"
