"""The disk tier for real (model/engine/spill.py): a snapshot the device budget cannot keep is written
to a file and read back with a checksum. A warm request restored from disk gives the cold request's
logits; a missing or altered file is detected (one log line), the snapshot dropped, and the request
recomputes from the start with the same logits: never a wrong state."""

import logging

import pytest
import torch

from model.engine import Engine
from model.engine.spill import FileSpill, SpilledState
from model.loading import from_preset
from planner.snapshot_tiers import SpillEntry, SpillError, disk_tier

FP32_LOGITS_ATOL = 1e-5  # warm vs cold, fp32 (issue 20's bound)
A = list(range(3, 103))  # 100 tokens: aligned saves the split point 99 // 16 * 16 - 16 = 80
B = list(range(150, 250))


@pytest.fixture(scope="module")
def model():
    return from_preset("tiny", seed=0)


def engine(model, spill, num_kv_blocks=64, **extra):
    one = model.allocate_cache(1, 16, 1).state_bytes_per_slot  # the device holds one snapshot
    return Engine.for_model(model, block_size=16, prefill_budget=4096, max_batch_size=1, num_kv_blocks=num_kv_blocks,
                            policy="aligned", keep_prompt_logits=True, snapshot_byte_budget=one,
                            snapshot_lower_tiers=(disk_tier(1, spill=spill),), **extra)


def serve(eng, prompt):
    req = eng.add_request(prompt, max_new_tokens=1)
    eng.run_until_done()
    return req, eng.prompt_logits[req.request_id]


def spilled_files(tmp_path):
    return sorted(tmp_path.glob("*.safetensors"))


def test_a_restore_from_disk_gives_the_cold_logits(model, tmp_path):
    eng = engine(model, FileSpill(tmp_path))
    cold, cold_logits = serve(eng, A)
    serve(eng, B)  # B's snapshot takes the device; A's goes to disk
    assert len(spilled_files(tmp_path)) == 1 and eng.snapshots.tier_bytes()["disk"] > 0
    warm, warm_logits = serve(eng, A)
    assert (warm.metrics.restore_at, warm.metrics.replayed_tokens) == (80, 20)
    assert eng.snapshots.stats.promoted["disk"] == 1 and warm.metrics.restore_transfer_s > 0
    assert (warm_logits - cold_logits).abs().max().item() <= FP32_LOGITS_ATOL
    assert spilled_files(tmp_path) != []  # B's went down when A's came back up; A's file is gone
    assert eng.snapshots.stats.spill_failures == 0


DAMAGES = ("altered", "truncated", "missing", "emptied", "swapped")


def spoil(path, how: str, replacement: bytes | None = None) -> None:
    """Damage a spill file `how` (one of DAMAGES); "swapped" writes `replacement`, another valid spill
    file's bytes: a well-formed state, but not this one, which only the checksum can tell."""
    data = path.read_bytes()
    if how == "altered":
        path.write_bytes(data[:-8] + bytes(8))
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "missing":
        path.unlink()
    elif how == "emptied":
        path.write_bytes(b"")
    else:
        assert how == "swapped" and replacement is not None
        path.write_bytes(replacement)


@pytest.mark.parametrize("damage", ["altered", "truncated", "missing"])
def test_a_damaged_spill_file_is_detected_and_the_request_recomputes(model, tmp_path, caplog, damage):
    eng = engine(model, FileSpill(tmp_path))
    _, cold_logits = serve(eng, A)
    serve(eng, B)
    (path,) = spilled_files(tmp_path)
    spoil(path, damage)
    with caplog.at_level(logging.WARNING, logger="planner.snapshot_store"):
        warm, warm_logits = serve(eng, A)
    assert eng.snapshots.stats.spill_failures == 1 and warm.metrics.restore_at == 0  # recomputed
    assert (warm_logits - cold_logits).abs().max().item() <= FP32_LOGITS_ATOL
    (line,) = [r.getMessage() for r in caplog.records if "did not read back" in r.getMessage()]
    assert "snapshot at 80 in disk" in line and "\n" not in line


def test_file_spill_round_trip_and_checks(model, tmp_path):
    spill = FileSpill(tmp_path)
    state = model.allocate_cache(1, 16, 1).read_state(0)
    entry = SpillEntry(16, b"a" * 32, (), int(state.nbytes))
    with pytest.raises(SpillError, match="not bound"):  # an unbound spill could not be found again
        spill.put(state, entry)
    spill.bind("0" * 64)
    handle = spill.put(state, entry)
    assert isinstance(handle, SpilledState) and handle.nbytes == state.nbytes
    back = spill.get(handle)
    assert all(torch.equal(a, b) for a, b in zip(back.conv + back.ssm, state.conv + state.ssm))
    spill.drop(handle)
    with pytest.raises(SpillError, match="No such file"):
        spill.get(handle)
    with pytest.raises(TypeError, match="cannot spill a dict"):
        spill.put({"x": 1}, entry)




def test_a_hundred_damaged_spill_files_each_end_in_a_recompute_and_one_log_line(model, tmp_path, caplog):
    """The issue's bound: 100 corrupted or deleted spill files, every one detected (one warning line
    each), every request recomputed from 0 with its cold logits; none restores a wrong state."""
    gen = torch.Generator().manual_seed(20)
    # 100 tokens each; the first token differs, so no two share a block
    prompts = [[3 + i] + torch.randint(3, 256, (99,), generator=gen).tolist() for i in range(101)]
    eng = engine(model, FileSpill(tmp_path), num_kv_blocks=1024)  # every prompt's KV stays cached (7 blocks each)
    cold = [serve(eng, p)[1] for p in prompts]  # the last one's snapshot stays on the device
    files = spilled_files(tmp_path)
    assert len(files) == 100 and eng.snapshots.tier_bytes()["disk"] > 0
    how = [DAMAGES[i % len(DAMAGES)] for i in range(100)]
    intact = [f.read_bytes() for f in files]
    for i, path in enumerate(files):
        spoil(path, how[i], replacement=intact[(i + 1) % 100])
    with caplog.at_level(logging.WARNING, logger="planner.snapshot_store"):
        for i, p in enumerate(prompts[:100]):
            warm, logits = serve(eng, p)
            assert warm.metrics.kv_match_tokens == 96, (i, how[i])  # 6 cached blocks: the snapshot at 80 was reachable
            assert warm.metrics.restore_at == 0, (i, how[i])  # recomputed, never restored
            assert (logits - cold[i]).abs().max().item() <= FP32_LOGITS_ATOL, (i, how[i])
    lines = [r.getMessage() for r in caplog.records if "did not read back" in r.getMessage()]
    assert len(lines) == 100 and all("\n" not in line and "snapshot at 80 in disk" in line for line in lines)
    assert eng.snapshots.stats.spill_failures == 100
