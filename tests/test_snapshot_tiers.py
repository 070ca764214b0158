"""Snapshot memory as tiers (planner/snapshot_tiers.py, planner/snapshot_store.py): the device's
victim moves one tier down instead of leaving, the last tier's victim leaves the store, a restore
from a lower tier costs that tier's transfer and promotes the snapshot back to the device. Every
expected figure follows from those rules by hand; snapshots are 1 byte, so a budget of k bytes
holds k of them, and a tier of 1e-9 GB/s moves 1 byte per second."""

import pytest

from planner.block_pool import hash_full_blocks
from planner.evictions.base import EvictionPolicy
from planner.evictions.registry import get_eviction
from planner.snapshot_store import SnapshotStore
from planner.snapshot_tiers import (DISK_GB_PER_S, DISK_LATENCY_S, HOST_GB_PER_S, HOST_LATENCY_S, Tier, disk_tier,
                                    host_tier)

BS = 4


class State:
    nbytes = 1


class Recorder(EvictionPolicy):
    """LRU that records what the store tells it."""

    name = "lru"

    def __init__(self):
        self.events = []

    def choose_victim(self, snapshots, now):
        return snapshots[0]

    def evicted(self, snap):
        self.events.append(("evicted", snap.position))

    def demoted(self, snap):
        self.events.append(("demoted", snap.position))


def prompt(i):
    return list(range(1000 * i, 1000 * i + 16))


def save(st, i, position=8):
    tokens = prompt(i)
    assert st.save(tokens, position, State(), hash_full_blocks(tokens, BS))


def find(st, i, position=8):
    tokens = prompt(i)
    return st.lookup(tokens, position, hash_full_blocks(tokens, BS))


def slow_tier(name, budget, latency=0.5):
    return Tier(name, budget, gb_per_s=1e-9, latency_s=latency)


def test_the_bandwidths_are_stated_once():
    assert (HOST_GB_PER_S, DISK_GB_PER_S) == (50.0, 7.0)
    # a 62.3 MB Bamba-9B snapshot from host: 10 us + 62.3e6 / 50e9 s = 1.256 ms (the brief's ~1.3 ms)
    assert host_tier(256).transfer_s(62_300_000) == pytest.approx(HOST_LATENCY_S + 1.246e-3)
    assert disk_tier(1).transfer_s(7_000_000) == pytest.approx(DISK_LATENCY_S + 1e-3)
    assert host_tier(256).byte_budget == 256 * 10**9


def test_device_victims_move_down_and_the_last_tiers_leave():
    rec = Recorder()
    st = SnapshotStore(BS, byte_budget=2, eviction=rec, lower_tiers=[slow_tier("host", 2)])
    for i in (1, 2, 3):  # the third save pushes 1 (LRU) down to the host
        save(st, i)
    assert st.tier_bytes() == {"device": 2, "host": 1} and st.bytes_held == 2
    assert st.tier_name(find(st, 1)) == "host" and rec.events == [("demoted", 8)]
    save(st, 4)  # device victim 2 -> host (1, 2)
    save(st, 5)  # device victim 3 -> host is full: its victim 1 leaves the store, then 3 moves in
    assert find(st, 1) is None and st.tier_name(find(st, 3)) == "host"
    assert st.stats.demoted["host"] == 3 and st.stats.evicted == 1
    assert rec.events[-2:] == [("evicted", 8), ("demoted", 8)]
    assert len(st) == 4 and st.tier_bytes() == {"device": 2, "host": 2}


def test_restore_from_a_lower_tier_costs_its_transfer_and_promotes():
    st = SnapshotStore(BS, byte_budget=2, lower_tiers=[slow_tier("host", 2)])
    for i in (1, 2, 3):
        save(st, i)
    snap = find(st, 1)
    assert st.mark_restored(snap) == pytest.approx(0.5 + 1.0)  # latency + 1 byte at 1 byte/s
    # promoted to the device; the device's LRU (2) went down to make room
    assert st.tier_name(snap) == "device" and st.tier_name(find(st, 2)) == "host"
    assert st.stats.promoted["host"] == 1 and st.stats.promoted_bytes["host"] == 1
    assert st.stats.restore_transfer_s == pytest.approx(1.5)
    assert st.mark_restored(find(st, 3)) == 0.0  # on the device: free
    assert st.tier_bytes() == {"device": 2, "host": 1}


def test_three_tiers_chain_down_to_disk():
    st = SnapshotStore(BS, byte_budget=1, lower_tiers=[slow_tier("host", 1), slow_tier("disk", 1, latency=2.0)])
    save(st, 1)
    save(st, 2)  # 1 -> host
    save(st, 3)  # 2 -> host, whose 1 -> disk
    assert [st.tier_name(find(st, i)) for i in (1, 2, 3)] == ["disk", "host", "device"]
    save(st, 4)  # 3 -> host, 2 -> disk, 1 leaves
    assert find(st, 1) is None and st.stats.evicted == 1
    assert dict(st.stats.demoted) == {"host": 3, "disk": 2}
    assert st.mark_restored(find(st, 2)) == pytest.approx(2.0 + 1.0)
    # 2 promoted; device's 4 -> host, whose 3 -> disk (now empty): nothing leaves
    assert [st.tier_name(find(st, i)) for i in (2, 3, 4)] == ["device", "disk", "host"]
    assert st.stats.evicted == 1


def test_a_duplicate_save_of_a_demoted_prefix_keeps_it_on_the_device_without_a_transfer():
    st = SnapshotStore(BS, byte_budget=1, lower_tiers=[slow_tier("host", 4)])
    save(st, 1)
    save(st, 2)
    save(st, 1)  # the state is in hand again
    assert st.stats.duplicates == 1 and st.tier_name(find(st, 1)) == "device"
    assert st.tier_name(find(st, 2)) == "host" and not st.stats.promoted


def test_a_snapshot_larger_than_a_lower_tier_leaves_instead():
    st = SnapshotStore(BS, byte_budget=1, lower_tiers=[slow_tier("host", 0)])
    save(st, 1)
    save(st, 2)
    assert find(st, 1) is None and st.stats.evicted == 1 and not st.stats.demoted


def test_every_eviction_policy_runs_over_tiers():
    for name in ("lru", "flop_aware", "learned_value", "seglen"):
        st = SnapshotStore(BS, byte_budget=2, eviction=get_eviction(name), lower_tiers=[slow_tier("host", 2)])
        for i in range(1, 8):
            tokens = prompt(i)
            st.save(tokens, 8, State(), hash_full_blocks(tokens, BS), flops_saved=float(i))  # may be declined
            if i % 3 == 0 and len(st):
                st.mark_restored(next(iter(st._lru.values())))
        held = st.tier_bytes()
        assert held["device"] <= 2 and held["host"] <= 2 and sum(held.values()) == len(st), name
        assert st.stats.saved == len(st) + st.stats.evicted, name  # nothing lost or counted twice


def test_bad_tiers_are_refused():
    with pytest.raises(ValueError, match="^lower_tiers: an unbounded device never demotes"):
        SnapshotStore(BS, byte_budget=None, lower_tiers=[host_tier(1)])
    with pytest.raises(ValueError, match="^lower_tiers: tier names must differ"):
        SnapshotStore(BS, byte_budget=1, lower_tiers=[host_tier(1), host_tier(2)])
    with pytest.raises(ValueError, match="^name: a lower tier needs its own name"):
        Tier("device", 1, 1.0)
    with pytest.raises(ValueError, match="^gb_per_s: must be > 0"):
        Tier("host", 1, 0.0)
    with pytest.raises(ValueError, match="^host_gb: must be >= 0"):
        host_tier(-1)


# ---- through the engine and the simulator ------------------------------------------------------
from model.engine import Engine  # noqa: E402
from model.engine.placeholder_runner import PlaceholderRunner  # noqa: E402


class ChargedRunner(PlaceholderRunner):
    """The placeholder, recording what the engine charges for lower-tier transfers."""

    def __init__(self, *args):
        super().__init__(*args)
        self.charged = []

    def charge_transfer(self, seconds):
        self.charged.append(seconds)


def test_the_engine_charges_the_transfer_the_queue_wait_did_not_hide():
    now = [0.0]
    tier = Tier("host", 10**6, gb_per_s=1e-9, latency_s=0.5)  # 1 byte/s: a 3-byte state takes 3.5 s

    def make(config):
        s = config.scheduler
        return ChargedRunner(s.max_batch_size, s.num_kv_blocks, s.block_size, 64, 3)

    eng = Engine.for_runner(make, None, clock=lambda: now[0], block_size=16, prefill_budget=4096, max_batch_size=1,
                            num_kv_blocks=64, policy="aligned", snapshot_byte_budget=3, snapshot_lower_tiers=(tier,))
    a, b = list(range(100, 200)), list(range(300, 400))
    for prompt in (a, b):  # aligned saves 99//16*16 - 16 = 80 for each; b's pushes a's to the host
        eng.add_request(prompt, max_new_tokens=1)
        eng.run_until_done()
    assert eng.snapshots.tier_bytes() == {"device": 3, "host": 3}
    now[0] = 10.0
    warm = eng.add_request(a, max_new_tokens=1, arrival_s=9.0)  # waited 1 s of the 3.5 s transfer
    eng.run_until_done()
    assert warm.metrics.restore_at == 80 and warm.metrics.restore_transfer_s == pytest.approx(3.5)
    assert eng.runner.charged == [pytest.approx(2.5)]
    eng.add_request(b, max_new_tokens=1, arrival_s=0.0)  # b's snapshot went down; waited 10 s: all hidden
    eng.run_until_done()
    assert eng.runner.charged == [pytest.approx(2.5)] and eng.snapshots.stats.promoted["host"] == 2


def test_the_simulator_with_a_host_tier(tmp_path):
    from test_traces import _scaled_trace

    from experiments.traces.cost import ShapeCost
    from experiments.traces.simulate import SimConfig, simulate
    from experiments.workloads.mooncake import MooncakeTrace

    requests = list(MooncakeTrace(_scaled_trace(tmp_path), "chains").requests())
    base = dict(budget_gb=0.13, prefill_budget=256, max_batch_size=4, kv_pool_gb=0.05)  # 2 Bamba-9B snapshots
    flat = simulate(requests, SimConfig("ours-plus", **base))["metrics"]
    tiered = simulate(requests, SimConfig("ours-plus", host_gb=100.0, **base))["metrics"]
    assert flat["snapshots_evicted"] > 0 and not flat["snapshots_demoted"]
    assert tiered["snapshots_demoted"]["host"] > 0 and tiered["snapshots_evicted"] == 0  # 100 GB holds them all
    assert tiered["ssm_hit_tokens"] >= flat["ssm_hit_tokens"]
    promoted = tiered["snapshots_promoted"].get("host", 0)
    state = ShapeCost.from_preset("bamba-9b").state_bytes
    assert tiered["snapshot_bytes_promoted"].get("host", 0) == promoted * state
    assert tiered["restore_transfer_s"] == pytest.approx(promoted * (HOST_LATENCY_S + state / (HOST_GB_PER_S * 1e9)))
    with pytest.raises(ValueError, match="^host_gb: a lower tier needs a device budget"):
        SimConfig("ours-plus", host_gb=1.0)


class Declines(Recorder):
    """LRU whose admission keeps what the device holds: every new snapshot is declined when it is full."""

    def admits(self, candidate, snapshots):
        return False


def test_a_snapshot_declined_by_a_full_device_goes_straight_to_the_host():
    flat = SnapshotStore(BS, byte_budget=1, eviction=Declines())
    save(flat, 1)
    tokens = prompt(2)
    assert not flat.save(tokens, 8, State(), hash_full_blocks(tokens, BS)) and flat.stats.declined == 1
    rec = Declines()
    st = SnapshotStore(BS, byte_budget=1, eviction=rec, lower_tiers=[slow_tier("host", 1)])
    save(st, 1)
    save(st, 2)  # declined by the device: to the host; 1 stays on the device
    assert [st.tier_name(find(st, i)) for i in (1, 2)] == ["device", "host"]
    assert st.stats.declined == 0 and st.stats.demoted["host"] == 1 and rec.events == [("demoted", 8)]
    save(st, 3)  # the host is full too: its LRU (2) leaves, 3 moves in
    assert find(st, 2) is None and st.tier_name(find(st, 3)) == "host" and st.stats.evicted == 1
    speculative = SnapshotStore(BS, byte_budget=1, lower_tiers=[slow_tier("host", 1)])
    save(speculative, 1)
    tokens = prompt(2)
    assert speculative.save(tokens, 8, State(), hash_full_blocks(tokens, BS), origin="speculative")
    assert speculative.tier_name(find(speculative, 2)) == "host"  # no admits: a speculative one is not pushed in


def test_each_tiers_residents_are_its_snapshots_in_lru_order():
    """The store keeps each tier's members apart (no scan of every held snapshot); what it hands the
    eviction must still be exactly that tier's snapshots, least recently used first."""
    import random

    rng = random.Random(0)
    store = SnapshotStore(BS, byte_budget=3, eviction=get_eviction("learned_value"),
                          lower_tiers=(Tier("host", 4, 1.0), Tier("disk", 5, 1.0)))
    prompts = [(prompt(i), hash_full_blocks(prompt(i), BS)) for i in range(6)]
    for step in range(400):
        tokens, hashes = prompts[rng.randrange(6)]
        if rng.random() < 0.4:
            snap = store.lookup(tokens, rng.randrange(1, 17), hashes)
            if snap is not None:
                store.mark_restored(snap)
        else:
            store.save(tokens, rng.randrange(1, 17), State(), hashes, flops_saved=rng.random(),
                       origin=rng.choice(("mark", "decode", "speculative")))
        for tier in range(3):
            expected = [s for s in store._lru.values() if s.tier == tier]
            assert store._residents(tier) == expected, (step, tier)
    assert store.stats.demoted["disk"] > 0 and store.stats.evicted > 0 and store.stats.promoted["disk"] > 0
