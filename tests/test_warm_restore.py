"""The main experiment end to end at a scaled-down incident, on a checkpoint folder of the "tiny" model.

Block 4, budget 64, prompt 4 x 64 + 4 = 260 has the incident's shape (tests/test_ablations.py):
legacy restores at 193 and replays 67 (the incident's 8195), aligned at 252 and replays 8 (20).
"""

import json
import statistics

import torch

from experiments.warm_restore import study as warm_restore
from experiments.warm_restore import families as warm_restore_families
from experiments.common.results_io import read_csv
from experiments.common.runs import build_model
from model.loading import from_preset, save_pretrained


def save_checkpoint(folder, preset="tiny", seed=0):
    model = from_preset(preset, seed=seed)
    save_pretrained(model, folder)
    return model


def test_a_checkpoint_folder_builds_the_same_model_as_its_preset(tmp_path):
    ref = save_checkpoint(tmp_path / "ckpt", seed=3)
    got = build_model(str(tmp_path / "ckpt"))
    ids = torch.arange(40) % ref.config.vocab_size
    assert torch.equal(got.logits(ids), ref.logits(ids))


def test_scaled_incident_with_paired_repeats_and_machine_load(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "wr"
    save_checkpoint(ckpt)
    assert warm_restore.main(["--model", str(ckpt), "--prompt-len", "260", "--block-size", "4", "--prefill-budget", "64",
                              "--interval", "0", "--repeats", "3", "--curve-repeats", "1", "--out", str(out)]) == 0
    result = json.loads((out / "warm_restore.json").read_text())
    legacy, aligned = result["legacy"], result["aligned"]
    assert legacy["chunk_ends"] == [65, 129, 193, 257, 260] and aligned["chunk_ends"] == [64, 128, 192, 252, 260]
    assert (legacy["warm_restore_at"], legacy["warm_replayed_tokens"]) == (193, 67)
    assert (aligned["warm_restore_at"], aligned["warm_replayed_tokens"]) == (252, 8)
    assert legacy["warm_restore_points_all"] == [193] and aligned["warm_restore_points_all"] == [252]
    assert legacy["warm_vs_cold_max_abs_logit_diff"] <= 1e-4 and aligned["warm_vs_cold_max_abs_logit_diff"] <= 1e-4
    # warm requests interleaved in pairs whose order alternates
    assert result["warm_order"] == ["legacy", "aligned", "aligned", "legacy", "legacy", "aligned"]
    for r in (legacy, aligned):
        assert len(r["warm_ttft_s_all"]) == 3
        assert r["warm_ttft_s"] == r["warm_ttft_s_min"] == min(r["warm_ttft_s_all"])
        assert r["warm_ttft_s_median"] == statistics.median(r["warm_ttft_s_all"])
    assert result["warm_ttft_statistic"] == "min"
    assert result["warm_ttft_ratio_legacy_over_aligned"] == legacy["warm_ttft_s_min"] / aligned["warm_ttft_s_min"]
    assert len(result["warm_ttft_ratio_spread"]["all"]) == 3
    load = result["machine_load"]
    assert len(load["loadavg_start"]) == len(load["loadavg_end"]) == 3
    assert load["cpu_count"] >= 1 and load["torch_threads"] == 1  # the default: one thread
    assert result["config"]["preset"] == result["config"]["model"] == str(ckpt)
    # what each engine ran under: block 4 as asked; legacy and aligned keep no decode state and
    # evict LRU (their policies' fields); the kernel chunk is the tiny model's 16
    seed_engine = {"block_size": 4, "state_block": 0, "kernel_chunk": 16, "decode_snapshots": False,
                   "decode_snapshot_grid": 0, "prefix_match_unit": 0, "eviction": "lru",
                   "snapshot_dtype": "float32"}
    assert result["effective_settings"] == {p: {"policy": p} | seed_engine for p in ("legacy", "aligned")}
    assert [p["replayed_tokens"] for p in result["replay_curve"]] == [1, 4, 20, 64, 256]
    # a fresh process over the disk folder the aligned engine spilled its one snapshot to (the split
    # point 259 // 4 * 4 - 4 = 252; interval 0): its first request rebuilds the KV of 252 tokens (not
    # persisted; cold), the warm one restores 252 from disk
    disk = result["disk_restart"]
    assert aligned["snapshot_positions"] == [252]
    assert disk["spilled"] == disk["adopted"] == 1 and disk["adopted_positions"] == [252]
    assert disk["kv_rebuild"]["tokens"] == 252 and disk["kv_rebuild"]["restore_at"] == 0
    assert (disk["kv_match"], disk["restore_at"], disk["replayed_tokens"]) == (252, 252, 8)
    assert disk["promoted_from_disk"] == 1 and disk["spill_failures"] == 0 and disk["restore_transfer_s"] > 0
    assert len(disk["ttft_s_again"]) == 2
    assert disk["max_abs_logit_diff_vs_cold"] <= 1e-4 and disk["first_token"] == aligned["cold_first_token"]
    assert (out / "warm_restore.png").is_file()
    readme = (out / "README.md").read_text()
    assert "Machine load average" in readme and "warm TTFT (min of 3)" in readme
    assert "**Restart from disk.**" in readme and "restore at 252 from disk, 8 replayed tokens" in readme


def test_family_table_reads_each_run(tmp_path):
    """One row per warm_restore.json under the root, the family taken from the model's config."""
    root = tmp_path / "wr"
    for preset in ("tiny", "granite-tiny"):
        assert warm_restore.main(["--model", preset, "--prompt-len", "260", "--block-size", "4", "--prefill-budget", "64",
                                  "--interval", "0", "--repeats", "1", "--curve-repeats", "1",
                                  "--out", str(root / preset)]) == 0
    assert warm_restore_families.main(["--out", str(root)]) == 0
    rows = read_csv(root / "families.csv")
    assert [(r["model"], r["family"]) for r in rows] == [("granite-tiny", "granitemoehybrid"), ("tiny", "bamba")]
    for r in rows:
        assert (int(r["legacy_restore_at"]), int(r["legacy_replayed"])) == (193, 67)
        assert (int(r["restore_at"]), int(r["replayed"])) == (252, 8)
    assert "| granite-tiny | granitemoehybrid |" in (root / "families.md").read_text()


def test_replay_fit_keeps_the_fixed_cost_non_negative():
    assert warm_restore.fit_line([1, 2, 3], [3.0, 5.0, 7.0]) == (1.0, 2.0)  # exact line a + b x
    # Short replays slower than the trend (a loaded machine) pull the free intercept below 0:
    # a = -0.63 there; the fit falls back to the line through the origin, b = sum(xy) / sum(x^2).
    a, b = warm_restore.fit_line([1, 2, 10], [0.1, 0.3, 5.0])
    assert a == 0.0 and b == (0.1 + 0.6 + 50.0) / (1 + 4 + 100)
