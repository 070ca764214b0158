"""experiments.peer_vllm.study: argument checks, settings, result shaping (no vLLM needed), and the
comparison itself on tiny prompts when vllm imports here or PEER_VLLM_PYTHON names a python with it."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch

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
])
def test_bad_flags_are_usage_errors(argv, text, capsys):
    ap = pv.parser()
    with pytest.raises(SystemExit) as e:
        pv.check_args(ap, ap.parse_args(argv))
    assert e.value.code == 2 and text in capsys.readouterr().err


def test_no_vllm_anywhere_is_a_usage_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(pv, "DEFAULT_VLLM_VENV_PYTHON", tmp_path / "missing" / "python")
    monkeypatch.setattr(pv.importlib.util, "find_spec", lambda name: None)
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


def test_ours_warm_request_recomputes_only_the_tail(tmp_path):
    pv.write_checkpoint("granite-tiny", 0, tmp_path, 512)
    ours = pv.OursPeer(load_pretrained(tmp_path), num_kv_blocks=64)
    ids = list(range(3, 203))
    cold, warm = ours.run([pv.request(ids), pv.request(ids)])
    assert cold["recomputed_tokens"] == 200 and cold["num_cached_tokens"] == 0
    assert warm["num_cached_tokens"] == 176 and warm["recomputed_tokens"] == 24  # split point 192 - 16
    assert warm["tokens"] == cold["tokens"] and len(warm["top_logprobs"][0]) == pv.TOP_LOGPROBS
    assert ours.state_bytes()["state_bytes_held"] > 0


# ------------------------------------------------------------------------------------------ shaping
def _rec(n, cached, wall, tokens=(7,), top=((7, -1.0), (8, -2.0)), **extra):
    return {"prompt_len": n, "num_cached_tokens": cached, "wall_s": wall, "tokens": list(tokens),
            "top_logprobs": [[list(t) for t in top]]} | extra


def _raw(vllm_tokens=(7,), vllm_top=((7, -1.0), (8, -2.0))):
    ours = lambda n, c: _rec(n, c, 0.01 if c else 1.0, recomputed_tokens=n - c)  # noqa: E731
    theirs = lambda n, c: _rec(n, c, 0.05 if c else 0.9, vllm_tokens, vllm_top)  # noqa: E731
    pairs = lambda f: [{"cold": f(n, 0), "warm": f(n, c)} for n, c in ((1000, 976), (700, 672))]  # noqa: E731
    moon = lambda f: [f(900, 0) | {"index": 0, "parent": None, "session": 0},  # noqa: E731
                      f(1500, 880) | {"index": 1, "parent": 0, "session": 0}]
    systems = {"ours": ours, "vllm:default": theirs}
    return {"config": {"prompt_len": 1000, "repeats": 2, "random_count": 2, "random_min": 600, "random_max": 1000,
                       "mooncake_sessions": 1, "mooncake_max_prompt": 2000, "vllm_python": "py", "threads": 1,
                       "model": "granite-dense-cpu", "seed": 0, "dtype": "float32"},
            "environment": {"device_name": "CPU", "torch": "t", "python": "p", "date": "d"},
            "model": {"params_m": 1.0, "layers": "MMMAMM"}, "checkpoint": {"perturbed": "x",
                                                                       "model.safetensors_sha256": "0" * 64},
            "machine_load": {"loadavg_start": [1.0], "loadavg_end": [1.0], "cpu_count": 2}, "probes": [],
            "our_engine": pv.OUR_ENGINE, "ours_state": {"state_bytes_per_snapshot": 10, "state_bytes_held": 20},
            "vllm_env": {}, "vllm_ready": {"default": {"ok": True, "vllm": "0.32.0", "settings": {},
                                                       "resolved": {"mamba_page_size_padded": 4, "block_size": 640}}},
            "raw": {"warm_restore": {"pairs": {s: pairs(f) for s, f in systems.items()},
                                     "continuation": {s: f(1000, 976) for s, f in systems.items()}},
                    "random_lengths": {"lengths": [1000, 700], "pairs": {s: pairs(f) for s, f in systems.items()}},
                    "mooncake": {"requests": [], "records": {s: moon(f) for s, f in systems.items()}}}}


def test_shape_figures_agreement_and_goals():
    ran = {"aligned": {"policy": "aligned", "block_size": 16}}
    r = rep.shape(_raw() | {"our_dtype_check": {"tokens": 8, "float32_cold_s": 1.0, "bfloat16_cold_s": 3.0},
                            "effective_settings": ran})
    assert r["our_dtype_check"]["bfloat16_cold_s"] == 3.0 and r["effective_settings"] == ran
    o, v = r["systems"]["ours"]["scenarios"], r["systems"]["vllm"]["scenarios"]
    assert o["random_lengths"]["warm_recomputed_tokens"] == [24, 28] and o["random_lengths"]["mean_recomputed_tokens"] == 26
    assert v["random_lengths"]["warm_recomputed_tokens"] == [24, 28]  # prompt - num_cached_tokens
    assert v["mooncake"]["total_recomputed_tokens"] == 900 + 620 and v["mooncake"]["n_first_turns"] == 1
    assert r["greedy_tokens_identical"] is True
    assert r["goals"]["recomputed_le_fifth"]["met"] is False  # equal, not 1/5
    assert r["goals"]["warm_ttft_le"]["met"] is True and r["goals"]["cold_ttft_within_1.5x"]["met"] is True
    assert r["systems"]["vllm"]["state_memory"]["state_bytes_per_checkpoint"] == 4 * 5
    assert r["mean_recomputed_tokens"] == {"ours": 26, "vllm": 26, "vllm:default": 26}


def test_agreement_catches_a_token_and_a_logprob_difference():
    r = rep.shape(_raw(vllm_tokens=(8,), vllm_top=((7, -1.5), (8, -2.0))))
    a = r["agreement"]["vllm:default"]["random_lengths"]
    assert r["greedy_tokens_identical"] is False and a["greedy_identical"] == 0
    assert a["top_logprob_max_abs_diff"] == pytest.approx(0.5)


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
    rc = pv.main(["--out", str(out), "--prompt-len", "700", "--repeats", "1", "--random-count", "2",
                  "--random-min", "300", "--random-max", "700", "--mooncake-sessions", "1", "--mooncake-max-prompt",
                  "2500", "--no-probes", "--vllm-configs", "default", "--gen-tokens", "4",
                  "--checkpoint-dir", str(tmp_path / "ckpt"), "--vllm-python", VLLM_PYTHON])
    r = json.loads((out / "peer_vllm.json").read_text())
    assert rc == 0 and r["greedy_tokens_identical"] is True
    v, o = r["systems"]["vllm"], r["systems"]["ours"]
    block = v["configs"]["default"]["resolved"]["block_size"]
    warm = v["scenarios"]["warm_restore"]
    assert warm["errors"] == [] and warm["warm_cached_tokens"] == [(700 - 1) // block * block]
    assert o["scenarios"]["warm_restore"]["warm_recomputed_tokens"] == [700 - ((700 - 1) // 16 * 16 - 16)]
    assert r["agreement"]["vllm:default"]["warm_restore"]["top_logprob_max_abs_diff"] < 1e-3
    assert (out / "README.md").exists() and (out / "peer_vllm.png").exists()
