"""The ablation sweeps end to end on the "tiny" model, at a scaled-down incident.

The seed's incident is block 16, budget 8192, prompt 4 x 8192 + 4. At block 4, budget 64 and
prompt 4 x 64 + 4 = 260 the planner makes the same shape: legacy chunk ends 65, 129, 193, 257,
260 leave no snapshot at the split point 252, so the identical warm request (KV match 256)
restores at 193 and replays 67 (= budget + 3, the incident's 8195); aligned ends 64, 128, 192,
252, 260 restore at 252 and replay 8 (= block + 4, the incident's 20).
"""

import json

import pytest

from experiments.ablations import study as ablations
from experiments.common import sweep_parts

COMMON = ["--model", "tiny", "--repeats", "2", "--threads", "1"]


def rows_by(out, name):
    return sweep_parts.load_rows(out / f"{name}.csv")


def test_prompt_length_sweep_scaled_incident_and_capture(tmp_path):
    out = tmp_path / "pl"
    assert ablations.main(["prompt-len", *COMMON, "--prompt-len", "40,260", "--block-size", "4", "--prefill-budget", "64",
                           "--interval", "0", "--out", str(out)]) == 0
    for f in ("prompt_len.csv", "prompt_len.json", "prompt_len.png", "parts/prompt_len.part0of1.json.gz"):
        assert (out / f).is_file(), f
    got = {(r["prompt_len"], r["label"]): r for r in rows_by(out, "prompt_len")}
    assert sorted(got) == [(40, "aligned"), (40, "aligned, no capture"), (40, "legacy"), (260, "aligned"), (260, "legacy")]
    legacy, aligned = got[(260, "legacy")], got[(260, "aligned")]
    assert legacy["chunk_ends"] == [65, 129, 193, 257, 260] and legacy["snapshot_positions"] == [65, 129, 193, 257]
    assert aligned["chunk_ends"] == [64, 128, 192, 252, 260] and aligned["snapshot_positions"] == [252]
    assert legacy["warm_kv_match"] == aligned["warm_kv_match"] == 256
    assert (legacy["warm_restore_at"], legacy["warm_replayed_tokens"]) == (193, 67)
    assert (aligned["warm_restore_at"], aligned["warm_replayed_tokens"]) == (252, 8)
    # Shorter than the budget: one last chunk; only its in-pass capture leaves the tail snapshot (split 32).
    assert (got[(40, "aligned")]["warm_restore_at"], got[(40, "aligned")]["warm_replayed_tokens"]) == (32, 8)
    assert (got[(40, "legacy")]["warm_restore_at"], got[(40, "legacy")]["warm_replayed_tokens"]) == (32, 8)
    none = got[(40, "aligned, no capture")]
    assert none["snapshot_positions"] == [] and (none["warm_restore_at"], none["warm_replayed_tokens"]) == (0, 40)
    for r in got.values():
        assert 0 <= r["warm_vs_cold_max_abs_logit_diff"] <= 1e-4
        assert r["cold_ttft_s"] > 0 and len(r["warm_ttft_s_all"]) == 2
    meta = json.loads((out / "prompt_len.json").read_text())
    assert meta["failed_points"] == [] and meta["environments"][0]["device"] == "cpu"
    # one engine setting per policy (the capture mode is not one of them): block 4, the tiny
    # model's kernel chunk 16, no decode state, LRU (legacy's and aligned's fields)
    seed_engine = {"block_size": 4, "state_block": 0, "kernel_chunk": 16, "decode_snapshots": False,
                   "decode_snapshot_grid": 0, "prefix_match_unit": 0, "eviction": "lru",
                   "snapshot_dtype": "float32"}
    assert meta["effective_settings"] == {p: [{"policy": p} | seed_engine] for p in ("legacy", "aligned")}
    assert got[(260, "aligned")]["effective_settings"] == {"policy": "aligned"} | seed_engine


def test_interval_sweep_restores_at_the_deepest_checkpoint_under_a_partial_match(tmp_path):
    out = tmp_path / "iv"
    assert ablations.main(["interval", *COMMON, "--interval", "0,2,8", "--prompt-len", "260", "--block-size", "4",
                           "--prefill-budget", "16", "--shared-prefixes", "50,130", "--suffix-len", "8", "--out", str(out)]) == 0
    rows = rows_by(out, "interval")
    ident = {r["interval_blocks"]: r for r in rows if r["request"] == "identical"}
    # budget 16 (+1 slot, floored): chunk ends every 16 tokens; split point 252
    assert ident[0]["snapshot_positions"] == [252]
    assert ident[2]["snapshot_positions"] == list(range(16, 241, 16)) + [252]  # every 8 tokens -> every chunk end
    assert ident[8]["snapshot_positions"] == list(range(32, 225, 32)) + [252]
    assert [ident[i]["n_snapshots"] for i in (0, 2, 8)] == [1, 16, 8]
    each = ident[0]["snapshot_bytes_each"]
    assert [ident[i]["snapshot_bytes_held"] for i in (0, 2, 8)] == [each, 16 * each, 8 * each]
    shared = {(r["interval_blocks"], r["shared_prefix"]): r for r in rows if r["request"] == "shared_prefix"}
    # KV match 48 (k = 50) and 128 (k = 130); restore = deepest checkpoint at or below it
    assert {k: (r["warm_kv_match"], r["warm_restore_at"]) for k, r in shared.items()} == {
        (0, 50): (48, 0), (0, 130): (128, 0),
        (2, 50): (48, 48), (2, 130): (128, 128),
        (8, 50): (48, 32), (8, 130): (128, 128)}
    assert shared[(8, 50)]["warm_replayed_tokens"] == 50 + 8 - 32
    assert all(r["warm_vs_cold_max_abs_logit_diff"] <= 1e-4 for r in rows)


def test_capture_modes_cost_a_pass_or_the_tail(tmp_path):
    out = tmp_path / "cap"
    assert ablations.main(["capture", *COMMON, "--prompt-len", "40", "--block-size", "4", "--prefill-budget", "64",
                           "--out", str(out)]) == 0
    got = {r["capture_mode"]: r for r in rows_by(out, "capture")}
    assert {m: r["cold_prefill_passes"] for m, r in got.items()} == {"in_pass": 1, "two_pass": 2, "none": 1}
    assert {m: r["warm_replayed_tokens"] for m, r in got.items()} == {"in_pass": 8, "two_pass": 8, "none": 40}
    assert all(r["cold_repeats"] == 2 and len(r["cold_ttft_s_all"]) == 2 for r in got.values())
    assert (out / "capture.png").is_file()


def test_shards_write_parts_and_merge_combines_them(tmp_path, capsys):
    out = tmp_path / "bs"
    args = ["block-size", *COMMON, "--block-size", "4,8", "--prompt-len", "260", "--prefill-budget", "64", "--out", str(out)]
    assert ablations.main([*args, "--shard", "0/2"]) == 0
    assert not (out / "block_size.csv").exists()  # a shard alone does not merge
    with pytest.raises(SystemExit) as exc:  # an incomplete sweep is a usage error naming what is missing
        ablations.main([*args, "--merge"])
    assert exc.value.code == 2 and "missing shards [1]" in capsys.readouterr().err.strip().splitlines()[-1]
    assert ablations.main([*args, "--shard", "1/2"]) == 0
    assert ablations.main([*args, "--merge"]) == 0
    got = {(r["block_size"], r["label"]): r for r in rows_by(out, "block_size")}
    assert sorted(r["point"] for r in got.values()) == [0, 1, 2, 3]
    assert {k: (r["warm_restore_at"], r["warm_replayed_tokens"]) for k, r in got.items()} == {
        (4, "legacy"): (193, 67), (4, "aligned"): (252, 8),
        # block 8: last boundary 256, split 248, legacy ends 65 .. 257 -> 193; aligned 248, replay 12
        (8, "legacy"): (193, 67), (8, "aligned"): (248, 12)}
    assert (out / "block_size.png").is_file()
    # A rerun with another split replaces the old parts instead of mixing with them.
    assert ablations.main([*args, "--prefill-budget", "32"]) == 0
    assert sorted(p.name for p in (out / "parts").iterdir()) == ["block_size.part0of1.json.gz"]


def test_a_point_that_fails_the_logit_check_is_not_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(ablations, "FP32_LOGIT_TOL", -1.0)  # nothing can pass: every point must be withheld
    out = tmp_path / "fail"
    assert ablations.main(["prompt-len", *COMMON, "--prompt-len", "40", "--block-size", "4", "--prefill-budget", "64",
                           "--out", str(out)]) == 1
    meta = json.loads((out / "prompt_len.json").read_text())
    assert len(meta["failed_points"]) == 3 and "max abs logit diff" in meta["failed_points"][0]["error"]
    assert rows_by(out, "prompt_len") == [] and not (out / "prompt_len.png").exists()
