"""Snapshots survive a restart (model/engine/spill.py, SnapshotStore's adoption): a new engine over a
disk tier's folder finds what an earlier one spilled there, keyed by the model's identity, and a
crash at any point loses at most the snapshot being written or dropped, never yielding a wrong state.

The KV cache is not persisted, and the scheduler restores a snapshot only under a KV match, so a
new engine's first request of a prompt recomputes it whatever the disk holds. The engine tests
therefore first serve the prompt's first 90 tokens (`warm_kv`: its KV for 5 blocks, and its own
snapshot at 64), then the prompt: its KV match is 80 and the disk's snapshot at 80 restores.

The crash points: every file operation of a writing store (file write, index append, log rewrite,
unlink), each stopped halfway (in this process: `Crash`), and a writer process SIGKILLed at random
file operations and at random times (tests.disk_tier_writer). The expected states come from what
was saved (exact tensors) or from the cold request (logits), never from the spill's own answer.
`DISK_KILL_RUNS=N` runs N of each kind of SIGKILL instead of 1 (a writer process costs ~10 s here).
"""

import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from model.cache import SSMState
from model.engine.spill import FileOps, FileSpill, encode_line, state_identity
from model.engine import ModelRunner, PlaceholderRunner
from model.loading import from_preset
from planner.block_pool import hash_full_blocks
from planner.evictions.registry import get_eviction
from planner.snapshot_store import SnapshotStore
from planner.snapshot_tiers import SpillEntry, SpillError, Tier, disk_tier
from tests.disk_tier_writer import SNAPSHOT_AT, KillingOps, prompts, restart_engine

FP32_LOGITS_ATOL = 1e-5  # warm vs cold, fp32 (issue 20's bound, as tests/test_disk_tier.py)
ROOT = Path(__file__).resolve().parents[1]
KILL_RUNS = int(os.environ.get("DISK_KILL_RUNS", "1"))


class Crash(BaseException):
    """A writer stopped in this process (a BaseException: the store's `except OSError` cannot catch it)."""


def crash():
    raise Crash


# ------------------------------------------------------------------------------------------ the store alone
IDENTITY = "ab" * 32
BS = 4


def state(i: int) -> SSMState:
    g = torch.Generator().manual_seed(i)
    return SSMState([torch.randn(6, 3, generator=g)], [torch.randn(2, 3, 4, generator=g)])


ONE = state(0).nbytes


def store_over(folder, ops=None, disk_snapshots=3, eviction=None, spill=None):
    spill = spill or FileSpill(folder, ops=ops)
    spill.bind(IDENTITY)
    tier = Tier("disk", disk_snapshots * ONE, 7.0, spill=spill)
    return SnapshotStore(BS, ONE, eviction, lower_tiers=(tier,)), spill


def request(i: int):
    """The i-th prompt (12 tokens, its own first token), its block hashes and where it saves (8-10:
    a snapshot on a block boundary or with a tail)."""
    gen = random.Random(i)
    tokens = [100 + i] + [gen.randrange(1000) for _ in range(11)]
    return tokens, hash_full_blocks(tokens, BS), 8 + i % 3


def key(i: int):
    tokens, hashes, pos = request(i)
    return (hashes[pos // BS - 1], tuple(tokens[pos // BS * BS: pos]))


def write_scenario(folder, ops) -> tuple[SnapshotStore, FileSpill]:
    """Ten saves on a device of one snapshot and a disk of three (each save spills the last one,
    from the fifth on the disk evicts: drops), and every third save a restore of the one two back
    (a promotion off the disk: a drop). Stops where `ops` raises Crash (None: while opening)."""
    store, spill = None, FileSpill(folder, ops=ops)
    try:
        store, _ = store_over(folder, spill=spill)
        for i in range(10):
            tokens, hashes, pos = request(i)
            store.save(tokens, pos, state(i), hashes)
            if i % 3 == 2:
                tokens, hashes, pos = request(i - 2)
                snap = store.lookup(tokens, pos, hashes)
                assert snap is not None and snap.position == pos
                store.mark_restored(snap)
    except Crash:
        pass
    spill.close()  # what the process's death does: the lock goes, nothing is written
    return store, spill


def on_disk(store) -> set:
    if store is None:
        return set()
    return {s.key for s in store._lru.values() if store.tier_name(s) == "disk"}


def check_restart(folder) -> tuple[set, dict]:
    """A new store over `folder`: every snapshot it holds reads back exactly what was saved for its key."""
    store, spill = store_over(folder)
    keys = {key(i): i for i in range(10)}
    held = set()
    for snap in list(store._lru.values()):
        back = spill.get(snap.spilled)
        i = keys[snap.key]
        assert snap.position == request(i)[2]
        assert all(torch.equal(a, b) for a, b in zip(back.conv + back.ssm, state(i).conv + state(i).ssm)), snap.key
        held.add(snap.key)
    assert store.stats.adopted == len(held) and store.tier_bytes()["disk"] == len(held) * ONE <= 3 * ONE
    opened = spill.opened
    spill.close()
    return held, opened


def test_a_crash_at_every_file_operation_loses_at_most_the_snapshot_in_flight(tmp_path):
    """Every file operation of the scenario, stopped halfway (a seeded fraction of its bytes): the next
    store over the folder holds what the crashed one held on disk, but for at most the one snapshot
    whose write or drop was in flight, and each reads back bit for bit what was saved."""
    clean = KillingOps(None, 0.0, durable=False)
    write_scenario(tmp_path / "clean", clean)
    total = clean.count
    assert {"write_file", "append", "unlink", "replace"} <= set(clean.log) and total > 40
    held, opened = check_restart(tmp_path / "clean")  # every drop was logged: nothing stale, nothing orphaned
    assert len(held) == 3 and opened == {"found": 3, "torn_lines": 0, "stale_lines": 0, "orphan_files": 0}
    rng = random.Random(34)
    tally = {}
    for at in range(total):
        folder = tmp_path / f"crash{at}"
        ops = KillingOps(at, rng.random(), die=crash, durable=False)
        store, _ = write_scenario(folder, ops)
        assert ops.count == at + 1  # it stopped there
        held, opened = check_restart(folder)
        before = on_disk(store)
        assert len(before - held) <= 1 and len(held - before) <= 1, (at, ops.log[-1])
        kind = ops.log[-1]
        tally.setdefault(kind, [0, 0])
        tally[kind][0] += 1
        tally[kind][1] += len(before - held)
        # the crashed index is consistent again after one open: a second open finds the same, nothing stale
        again, opened2 = check_restart(folder)
        assert again == held and opened2 == {"found": len(held), "torn_lines": 0, "stale_lines": 0, "orphan_files": 0}
    print("crash points (kind: tried, snapshots lost):", tally)


def test_a_crash_while_reopening_changes_nothing(tmp_path):
    """The open's own operations (orphan removal, the log's rewrite), each stopped halfway over a
    crashed folder: a clean open afterwards finds what a clean open would have."""
    rng = random.Random(7)
    for trial in range(4):
        at = rng.randrange(60)
        folder = tmp_path / f"t{trial}"
        write_scenario(folder, KillingOps(at, rng.random(), die=crash, durable=False))
        reference = tmp_path / f"ref{trial}"
        os.system(f"cp -a {folder} {reference}")
        expected, _ = check_restart(reference)
        for at_open in range(6):
            ops = KillingOps(at_open, rng.random(), die=crash, durable=False)
            spill = FileSpill(folder, ops=ops)
            try:
                spill.bind(IDENTITY)
            except Crash:
                pass
            spill.close()
        assert check_restart(folder)[0] == expected


def spill_three(folder):
    """A store that spilled three snapshots (saves 0-3: the device keeps the last); closed."""
    store, spill = store_over(folder)
    for i in range(4):
        tokens, hashes, pos = request(i)
        store.save(tokens, pos, state(i), hashes)
    assert on_disk(store) == {key(0), key(1), key(2)}
    spill.close()
    return spill


def index_of(folder) -> Path:
    (path,) = folder.glob("index-*.log")
    return path


def test_a_torn_last_index_line_is_ignored_and_its_file_removed(tmp_path):
    spill_three(tmp_path)
    index = index_of(tmp_path)
    data = index.read_bytes()
    index.write_bytes(data[: len(data) - 20])  # the third put line loses its end
    held, opened = check_restart(tmp_path)
    assert held == {key(0), key(1)}
    assert opened == {"found": 2, "torn_lines": 1, "stale_lines": 0, "orphan_files": 1}
    assert len(list(tmp_path.glob("*.safetensors"))) == 2


def test_an_altered_index_line_is_ignored(tmp_path):
    spill_three(tmp_path)
    index = index_of(tmp_path)
    lines = index.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"position":9', b'"position":8')  # save 1 is at 9; its checksum no longer matches
    index.write_bytes(b"\n".join(lines))
    held, opened = check_restart(tmp_path)
    assert held == {key(0), key(2)} and opened["torn_lines"] == 1


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_stale_index_line_is_forgotten(tmp_path, damage):
    spill = spill_three(tmp_path)
    (_, handle) = next((e, h) for e, h in spill_records(tmp_path) if e.position == request(1)[2])
    if damage == "missing":
        handle.path.unlink()
    else:
        handle.path.write_bytes(handle.path.read_bytes()[:-1])
    held, opened = check_restart(tmp_path)
    assert held == {key(0), key(2)} and opened["stale_lines"] == 1
    assert not handle.path.exists()


def spill_records(folder):
    spill = FileSpill(folder)
    spill.bind(IDENTITY)
    records = spill.recorded()
    spill.close()
    return records


def test_a_file_swapped_for_another_snapshots_is_never_restored(tmp_path, caplog):
    """Two files of the same length exchanged: each is a well-formed state, of the other prefix. The
    open cannot tell (it reads no file); the read's checksum does: both dropped, nothing restored."""
    spill_three(tmp_path)
    (e0, h0), (e1, h1) = spill_records(tmp_path)[:2]
    a, b = h0.path.read_bytes(), h1.path.read_bytes()
    assert len(a) == len(b) and a != b
    h0.path.write_bytes(b)
    h1.path.write_bytes(a)
    store, spill = store_over(tmp_path)
    assert store.stats.adopted == 3
    with caplog.at_level(logging.WARNING, logger="planner.snapshot_store"):
        for i in range(3):
            tokens, hashes, pos = request(i)
            snap = store.lookup(tokens, pos, hashes)
            if i < 2:
                assert snap is None
            else:
                back = spill.get(snap.spilled)
                assert torch.equal(back.ssm[0], state(2).ssm[0])
    assert store.stats.spill_failures == 2
    assert sum("checksum mismatch" in r.getMessage() for r in caplog.records) == 2


def test_another_identity_finds_nothing_and_keeps_the_others_files(tmp_path):
    spill_three(tmp_path)
    other = FileSpill(tmp_path)
    other.bind("cd" * 32)
    assert other.recorded() == [] and other.opened["orphan_files"] == 0
    store = SnapshotStore(BS, ONE, lower_tiers=(Tier("disk", 3 * ONE, 7.0, spill=other),))
    tokens, hashes, pos = request(0)
    assert len(store) == 0 and store.lookup(tokens, pos, hashes) is None
    other.close()
    assert len(list(tmp_path.glob("*.safetensors"))) == 3  # the first identity's, untouched
    assert check_restart(tmp_path)[0] == {key(0), key(1), key(2)}


def test_an_index_under_another_identitys_name_is_not_read(tmp_path):
    """Each line names its identity: an index renamed to another identity's file restores nothing."""
    spill_three(tmp_path)
    other = "cd" * 32
    index_of(tmp_path).rename(tmp_path / f"index-{other[:16]}.log")
    spill = FileSpill(tmp_path)
    spill.bind(other)
    assert spill.recorded() == [] and spill.opened["torn_lines"] == 3
    spill.close()


def test_a_smaller_disk_budget_keeps_the_newest(tmp_path):
    spill_three(tmp_path)
    store, spill = store_over(tmp_path, disk_snapshots=2)
    assert on_disk(store) == {key(1), key(2)}
    assert (store.stats.adopted, store.stats.adopted_dropped) == (2, 1)
    spill.close()
    assert len(list(tmp_path.glob("*.safetensors"))) == 2
    # LRU order is the spill order: the next eviction from disk takes 1, the older of the two
    store, spill = store_over(tmp_path, disk_snapshots=2)
    tokens, hashes, pos = request(5)
    store.save(tokens, pos, state(5), hashes)  # the device's 5 ... and what pushes it: nothing yet
    tokens, hashes, pos = request(6)
    store.save(tokens, pos, state(6), hashes)  # 5 goes to disk, 1 leaves it
    assert on_disk(store) == {key(2), key(5)}
    spill.close()


def test_a_needs_prefix_eviction_adopts_only_snapshots_with_their_tokens(tmp_path):
    """seglen reads each snapshot's prefix: a store under it records the tokens, and a later seglen
    store adopts those (their hashes recomputed); snapshots spilled without tokens are dropped."""
    spill_three(tmp_path)  # LRU: no tokens recorded
    store, spill = store_over(tmp_path, eviction=get_eviction("seglen"))
    assert (store.stats.adopted, store.stats.adopted_dropped) == (0, 3)
    for i in range(4):
        tokens, hashes, pos = request(i)
        store.save(tokens, pos, state(i), hashes)
    spill.close()
    store, spill = store_over(tmp_path, eviction=get_eviction("seglen"))
    assert on_disk(store) == {key(0), key(1), key(2)} and store.stats.adopted == 3
    for snap in store._lru.values():
        tokens, hashes, pos = request([k for k in range(3) if key(k) == snap.key][0])
        assert list(snap.prefix_tokens) == tokens[:pos] and list(snap.prefix_hashes) == hashes[: pos // BS]
    spill.close()


def test_spill_all_moves_every_snapshot_to_disk(tmp_path):
    store, spill = store_over(tmp_path, disk_snapshots=3)
    for i in range(2):
        tokens, hashes, pos = request(i)
        store.save(tokens, pos, state(i), hashes)
    assert store.spill_all() == 2 and store.tier_bytes() == {"device": 0, "disk": 2 * ONE}
    spill.close()
    assert check_restart(tmp_path)[0] == {key(0), key(1)}


def test_one_writer_per_folder_and_identity(tmp_path):
    first = FileSpill(tmp_path)
    first.bind(IDENTITY)
    with pytest.raises(SpillError, match="another engine of this model holds this folder"):
        FileSpill(tmp_path).bind(IDENTITY)
    first.close()
    FileSpill(tmp_path).bind(IDENTITY)


def test_the_log_is_rewritten_when_dead_lines_dominate(tmp_path):
    """300 spills and drops with one snapshot live: the log never exceeds 4 lines per live one + 64."""
    spill = FileSpill(tmp_path, ops=FileOps(durable=False))
    spill.bind(IDENTITY)
    index = index_of(tmp_path)
    longest = 0
    for i in range(300):
        handle = spill.put(state(i), SpillEntry(8, bytes(32), (), ONE))
        longest = max(longest, index.read_bytes().count(b"\n"))
        spill.drop(handle)
    assert 64 < longest <= 4 * 1 + 64 + 1
    spill.put(state(0), SpillEntry(8, bytes(32), (), ONE))
    spill.close()
    assert len(spill_records(tmp_path)) == 1


def test_an_append_after_a_failed_one_does_not_land_on_its_stub(tmp_path):
    """A write that failed halfway (a full disk) leaves a line's stub; the next put rewrites the log first."""

    class FailOnce(FileOps):
        failed = False

        def write(self, fd, data):
            if fd != -1 and not self.failed and b'"op":"put"' in data and b'"position":9' in data:
                self.failed = True
                os.write(fd, data[:10])
                raise OSError(28, "No space left on device")
            super().write(fd, data)

    spill = FileSpill(tmp_path, ops=FailOnce(durable=False))
    spill.bind(IDENTITY)
    spill.put(state(0), SpillEntry(8, b"0" * 32, (), ONE))
    with pytest.raises(OSError):
        spill.put(state(1), SpillEntry(9, b"1" * 32, (1,), ONE))
    spill.put(state(2), SpillEntry(10, b"2" * 32, (1, 2), ONE))
    spill.close()
    assert [e.position for e, _ in spill_records(tmp_path)] == [8, 10]
    assert len(list(tmp_path.glob("*.safetensors"))) == 2  # the failed put's file removed


def test_index_lines_check_themselves():
    line = encode_line({"op": "put", "file": "x"})
    from model.engine.spill import decode_line
    assert decode_line(line.rstrip(b"\n")) == {"op": "put", "file": "x"}
    assert decode_line(line[:-5]) is None and decode_line(line.replace(b"x", b"y")) is None


# ------------------------------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def model():
    return from_preset("tiny", seed=0)


@pytest.fixture(scope="module")
def cold_logits(model):
    """Each writer prompt's last prompt-token logits with no snapshot anywhere (caching off)."""
    eng = restart_engine(model, None, enable_prefix_caching=False)
    out = []
    for p in prompts(0, 12):
        req = eng.add_request(p, max_new_tokens=1)
        eng.run_until_done()
        out.append(eng.prompt_logits[req.request_id])
    return out


def warm_serve(eng, prompt):
    req = eng.add_request(prompt, max_new_tokens=1)
    eng.run_until_done()
    return req, eng.prompt_logits[req.request_id]


def test_identity_names_the_weights_the_dtype_and_the_block(model):
    same = state_identity(ModelRunner(from_preset("tiny", seed=0), None), 16)
    assert state_identity(ModelRunner(model, None), 16) == same
    assert state_identity(ModelRunner(from_preset("tiny", seed=1), None), 16) != same  # another checkpoint
    assert state_identity(ModelRunner(model, None), 32) != same  # keys chained over another block
    assert state_identity(ModelRunner(from_preset("tiny", seed=0).to(torch.float64), None), 16) != same
    nudged = from_preset("tiny", seed=0)
    with torch.no_grad():
        next(nudged.parameters()).view(-1)[7] += 1e-3  # one weight of a fine-tune
    assert state_identity(ModelRunner(nudged, None), 16) != same
    placeholder = state_identity(PlaceholderRunner(1, 4, 16), 16)
    assert placeholder != same and placeholder == state_identity(PlaceholderRunner(2, 8, 16), 16)
    with pytest.raises(TypeError, match="runner: cannot name the states of a object"):
        state_identity(object(), 16)


KV_PREFIX = 90  # `warm_kv`'s request: 5 full blocks of KV (80 tokens), its own snapshot at 89 // 16 * 16 - 16 = 64


def warm_kv(eng, prompt):
    """Serve the prompt's first KV_PREFIX tokens: the KV a restart lost (a cold request: no KV yet)."""
    req, _ = warm_serve(eng, prompt[:KV_PREFIX])
    bs = eng.config.scheduler.block_size
    assert req.metrics.kv_match_tokens == 0 and req.metrics.snapshot_positions == [(KV_PREFIX - 1) // bs * bs - bs]
    return req.metrics.snapshot_positions[0]


def test_a_new_engine_restores_what_the_last_one_spilled(model, tmp_path, cold_logits):
    ps = prompts(0, 3)
    first = restart_engine(model, FileSpill(tmp_path))
    for p in ps:
        warm_serve(first, p)
    assert first.snapshots.positions("disk") == [SNAPSHOT_AT, SNAPSHOT_AT]
    first.snapshots.lower_tiers[0].spill.close()  # the process ends
    second = restart_engine(model, FileSpill(tmp_path))
    assert second.snapshots.stats.adopted == 2 and second.snapshots.tier_bytes() == {"device": 0, "disk": 2 * (
        first.snapshots.tier_bytes()["device"])}
    warm, logits = warm_serve(second, ps[0])  # no KV after a restart: no restore, whatever the disk holds
    assert (warm.metrics.kv_match_tokens, warm.metrics.restore_at) == (0, 0)
    assert (logits - cold_logits[0]).abs().max().item() <= FP32_LOGITS_ATOL
    warm_kv(second, ps[1])
    warm, logits = warm_serve(second, ps[1])
    assert (warm.metrics.kv_match_tokens, warm.metrics.restore_at, warm.metrics.replayed_tokens) == (80, SNAPSHOT_AT, 20)
    assert (logits - cold_logits[1]).abs().max().item() <= FP32_LOGITS_ATOL
    assert second.snapshots.stats.promoted["disk"] == 1 and second.snapshots.stats.spill_failures == 0
    warm_kv(second, ps[2])  # the first engine's device snapshot died with it: the 90-token request's 64
    warm, _ = warm_serve(second, ps[2])
    assert warm.metrics.restore_at == 64


def test_another_checkpoint_over_the_folder_restores_nothing(model, tmp_path):
    first = restart_engine(model, FileSpill(tmp_path))
    for p in prompts(0, 3):
        warm_serve(first, p)
    first.snapshots.lower_tiers[0].spill.close()
    for other in (restart_engine(from_preset("tiny", seed=1), FileSpill(tmp_path)),
                  restart_engine(model, FileSpill(tmp_path), block_size=32)):
        assert other.snapshots.stats.adopted == 0
        own = warm_kv(other, prompts(0, 1)[0])
        warm, _ = warm_serve(other, prompts(0, 1)[0])
        assert warm.metrics.restore_at == own < SNAPSHOT_AT  # the 90-token request's own, not the first model's 80
        other.snapshots.lower_tiers[0].spill.close()
    assert restart_engine(model, FileSpill(tmp_path)).snapshots.stats.adopted == 2


def check_after_kill(model, folder, cold_logits, served: int):
    """A new engine over a killed writer's folder: with the KV back (`warm_kv`), every prompt restores
    at 80 (the disk's snapshot, only for a prompt the writer served) or at 64 (its own), with the
    cold logits either way; every snapshot found restores."""
    one = model.allocate_cache(1, 16, 1).state_bytes_per_slot  # a disk that the checks' own spills do not fill
    eng = restart_engine(model, None, snapshot_lower_tiers=(disk_tier(30 * one / 1e9, spill=FileSpill(folder)),))
    adopted = eng.snapshots.stats.adopted
    assert adopted <= min(served, 6)
    restored = 0
    for i, p in enumerate(prompts(0, 12)):
        warm_kv(eng, p)
        warm, logits = warm_serve(eng, p)
        assert warm.metrics.restore_at in (64, SNAPSHOT_AT), i
        assert warm.metrics.restore_at == 64 or i < served, i
        assert (logits - cold_logits[i]).abs().max().item() <= FP32_LOGITS_ATOL, i
        restored += warm.metrics.restore_at == SNAPSHOT_AT
    assert restored == adopted == eng.snapshots.stats.promoted["disk"] and eng.snapshots.stats.spill_failures == 0
    eng.snapshots.lower_tiers[0].spill.close()
    return adopted


def run_writer(folder, *extra, kill: tuple[int, float] | None = None):
    """The writer process; returns (what it printed, its exit code). `kill` = (k, f): SIGKILL it a
    fraction f of a prompt's serving time (the last one's, measured) after it printed "served k"."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.disk_tier_writer", str(folder), *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    lines = []
    if kill is not None:
        k, fraction = kill
        last = time.perf_counter()
        lines.append(proc.stdout.readline().strip())  # "ready": the model is built
        while True:
            lines.append(proc.stdout.readline().strip())
            now = time.perf_counter()
            took, last = now - last, now
            if lines[-1] in (f"served {k}", ""):
                break
        time.sleep(fraction * took)
        proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    lines += out.split("\n")
    return " ".join(lines), proc.returncode


def served_count(output: str) -> int:
    return output.count("served")


def test_a_writer_killed_at_random_times(model, tmp_path, cold_logits):
    """SIGKILL at a seeded random time: after a random prompt, a random fraction of a prompt's time."""
    rng = random.Random(340)
    for run in range(KILL_RUNS):
        folder = tmp_path / f"run{run}"
        out, code = run_writer(folder, kill=(rng.randrange(1, 10), rng.random()))
        assert code == -signal.SIGKILL, out
        served = served_count(out) + 1  # one more may have spilled before the kill
        adopted = check_after_kill(model, folder, cold_logits, min(served, 12))
        print(f"killed at random time: rc {code}, served {served - 1}, restored {adopted}")


def test_a_writer_killed_inside_a_file_operation(model, tmp_path, cold_logits):
    """SIGKILL at a seeded random file operation of the writer (its open's included), halfway through it."""
    rng = random.Random(341)
    for run in range(KILL_RUNS):
        folder = tmp_path / f"run{run}"
        at, fraction = rng.randrange(3, 40), rng.random()
        out, code = run_writer(folder, "--kill-at-op", str(at), "--fraction", f"{fraction:.3f}")
        assert code == -signal.SIGKILL, out
        adopted = check_after_kill(model, folder, cold_logits, min(served_count(out) + 1, 12))
        print(f"killed at file op {at} ({fraction:.2f} of it): served {served_count(out)}, restored {adopted}")
