"""Shadow-best eviction and its gate (`planner/evictions/shadow_best.py`), pinned by scripted traffic.

Expected values come from the module's rules: a gated candidate never evicts for a speculative or
chunk-end snapshot; each shadow store is the candidate run alone on the real store's saves and
lookups; a shadow's score is its restored positions, decayed by 0.5 ** (1 / half_life) per lookup
before the lookup's own restore is added; the leader changes only to a score more than the switch
margin (5%) above its own (ties stay with the earlier candidate); the real store's victims and
admissions are the leader's.

States are tiny fakes (only `.nbytes` is read); prompts are token lists in blocks of `BS` tokens.
"""

import dataclasses
import random

import pytest

from planner.block_pool import hash_full_blocks
from planner.evictions import shadow_best
from planner.evictions.base import EvictionPolicy
from planner.evictions.learned_value import LearnedValueEviction
from planner.evictions.lru import LRUEviction
from planner.evictions.registry import get_eviction
from planner.evictions.shadow_best import CANDIDATES, GatedEviction, ShadowBestEviction
from planner.snapshot_store import SnapshotStore

BS = 4


@dataclasses.dataclass
class Blob:
    nbytes: int = 100


def prompt(seed: int, n: int = 32) -> tuple[list[int], list]:
    tokens = [seed * 1000 + i for i in range(n)]
    return tokens, hash_full_blocks(tokens, BS)


def test_gate_keeps_speculative_and_chunk_captures_out_of_a_full_store():
    store = SnapshotStore(BS, byte_budget=200, eviction=GatedEviction(LRUEviction()))
    t, h = prompt(1)
    assert store.save(t, 4, Blob(), h, origin="speculative")  # free memory: taken
    assert store.save(t, 8, Blob(), h, origin="mark")
    assert not store.save(t, 12, Blob(), h, origin="speculative")  # full: declined, nothing evicted
    assert not store.save(t, 16, Blob(), h, origin="chunk")
    assert store.positions() == [4, 8] and store.stats.declined == 2 and store.stats.evicted == 0
    assert store.save(t, 20, Blob(), h, origin="decode")  # any other origin: the base's victim (LRU: 4)
    assert store.positions() == [8, 20]


def test_gate_defers_to_the_base_admission_for_other_origins():
    # learned value admits a new snapshot only if its credit beats the lowest held: with the same
    # origin and level, a new one sparing fewer FLOPs per byte is declined
    store = SnapshotStore(BS, byte_budget=100, eviction=GatedEviction(LearnedValueEviction()))
    t, h = prompt(2)
    assert store.save(t, 16, Blob(), h, flops_saved=1e6, origin="mark")
    assert not store.save(t, 8, Blob(), h, flops_saved=1e3, origin="mark")
    assert store.save(t, 20, Blob(), h, flops_saved=1e7, origin="mark")
    assert store.positions() == [20]


def traffic(seed: int, steps: int = 300):
    """Seeded saves (every origin, a few prompts sharing prefixes) and lookups."""
    rng = random.Random(seed)
    prompts = [prompt(s, 48) for s in range(6)]
    for _ in range(steps):
        t, h = prompts[rng.randrange(len(prompts))]
        if rng.random() < 0.4:
            yield ("lookup", t, rng.randrange(1, len(t) + 1), h)
        else:
            pos = rng.randrange(1, len(t) + 1)
            origin = rng.choice(("chunk", "mark", "speculative", "decode"))
            yield ("save", t, pos, h, float(pos) ** 2, origin)


def replay(store: SnapshotStore, events) -> float:
    """Feed `events` to `store`; the restored positions summed."""
    restored = 0.0
    for e in events:
        if e[0] == "lookup":
            snap = store.lookup(e[1], e[2], e[3])
            if snap is not None:
                store.mark_restored(snap)
                restored += snap.position
        else:
            store.save(e[1], e[2], Blob(), e[3], flops_saved=e[4], origin=e[5])
    return restored


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_shadow_is_its_candidate_run_alone(seed):
    events = list(traffic(seed))
    policy = ShadowBestEviction(half_life=float("inf"))  # no decay: the score is the restored positions
    replay(SnapshotStore(BS, byte_budget=300, eviction=policy), events)
    for i, name in enumerate(policy.names):
        alone = SnapshotStore(BS, byte_budget=300, eviction=CANDIDATES[name]())
        restored = replay(alone, events)
        shadow = policy.shadows[name]
        assert shadow.positions() == alone.positions(), name
        assert shadow.stats.restored == alone.stats.restored and shadow.stats.declined == alone.stats.declined, name
        assert policy.scores[i] == pytest.approx(restored, rel=1e-6), name
    # the candidates differ on this traffic (else the comparison above proves little)
    assert len({(tuple(s.positions()), s.stats.restored, s.stats.declined) for s in policy.shadows.values()}) > 1


def test_every_decider_follows_the_real_store():
    policy = ShadowBestEviction()
    store = SnapshotStore(BS, byte_budget=300, eviction=policy)
    replay(store, list(traffic(3)))
    held = {s.key for s in store._lru.values()}
    assert set(policy.deciders["seglen+gate"].base._held) == held  # seglen's ancestry covers what is held
    assert set(policy.deciders["learned_value"]._credit) == held


class KeepShallow(EvictionPolicy):
    """A toy candidate: evict the deepest held snapshot."""

    name = "keep_shallow"

    def choose_victim(self, snapshots, now):
        return max(snapshots, key=lambda s: s.position)


def three_marks(monkeypatch, candidates: dict, switch_margin: float):
    """shadow_best over `candidates` (no decay) on a store with room for two snapshots, offered marks
    at 8, 16 and 24 of three prompts (the third needs an eviction); the policy, store and prompts."""
    monkeypatch.setattr(shadow_best, "CANDIDATES", candidates)
    policy = ShadowBestEviction(half_life=float("inf"), switch_margin=switch_margin)
    store = SnapshotStore(BS, byte_budget=200, eviction=policy)
    prompts = prompt(1), prompt(2), prompt(3)
    for (tokens, hashes), position in zip(prompts, (8, 16, 24)):
        store.save(tokens, position, Blob(), hashes, origin="mark")
    return policy, store, prompts


def test_the_leader_changes_on_a_strictly_higher_score_and_decides_for_the_real_store(monkeypatch):
    policy, store, ((p, hp), (q, hq), _) = three_marks(monkeypatch, {"lru": LRUEviction, "keep_shallow": KeepShallow}, 0.0)
    assert store.positions() == [16, 24]  # the leader (lru, the first) evicted p's 8 for the third
    assert policy.shadows["lru"].positions() == [16, 24] and policy.shadows["keep_shallow"].positions() == [8, 24]
    assert store.lookup(q, 32, hq).position == 16  # only lru holds q's 16: lru leads on
    assert policy.leader_name == "lru" and policy.scores == pytest.approx([16, 0])
    store.lookup(p, 32, hp)  # keep_shallow restores p's 8: 16 vs 8, lru still leads
    assert policy.leader_name == "lru"
    store.lookup(p, 32, hp)  # 16 vs 16: a tie stays with the leader
    assert policy.leader_name == "lru"
    store.lookup(p, 32, hp)  # 16 vs 24: keep_shallow leads, and evicts the deepest for the real store
    assert policy.leader_name == "keep_shallow"
    store.save(p, 4, Blob(), hp, origin="mark")
    assert store.positions() == [4, 16]
    assert policy.lookups_led == [3, 1]


def test_a_tie_with_an_earlier_candidate_keeps_the_leader(monkeypatch):
    policy, store, ((p, hp), (q, hq), _) = three_marks(monkeypatch, {"keep_shallow": KeepShallow, "lru": LRUEviction}, 0.0)
    assert policy.shadows["keep_shallow"].positions() == [8, 24] and policy.shadows["lru"].positions() == [16, 24]
    store.lookup(q, 32, hq)  # lru 16, keep_shallow 0: lru leads
    store.lookup(p, 32, hp)
    store.lookup(p, 32, hp)  # keep_shallow 16: a tie, and keep_shallow is the earlier candidate
    assert policy.scores == pytest.approx([16, 16]) and policy.leader_name == "lru"


def test_a_challenger_takes_over_only_beyond_the_switch_margin(monkeypatch):
    policy, store, ((p, hp), (q, hq), _) = three_marks(monkeypatch, {"lru": LRUEviction, "keep_shallow": KeepShallow}, 0.5)
    store.lookup(q, 32, hq)  # lru 16 (only its shadow holds q's 16)
    for _ in range(3):  # keep_shallow 8, 16, 24: 24 is not above 16 x 1.5
        store.lookup(p, 32, hp)
        assert policy.leader_name == "lru"
    store.lookup(p, 32, hp)  # 32 > 24: over the margin
    assert policy.scores == pytest.approx([16, 32]) and policy.leader_name == "keep_shallow"


def test_the_default_switch_margin_is_five_percent(monkeypatch):
    monkeypatch.setattr(shadow_best, "CANDIDATES", {"lru": LRUEviction, "keep_shallow": KeepShallow})
    policy = ShadowBestEviction(half_life=float("inf"))
    policy.scores = [100.0, 104.9]
    policy.looked_up([], 0, [])  # no shadows bound: the scores only decay (not at all: no half-life)
    assert policy.leader_name == "lru"
    policy.scores = [100.0, 105.1]
    policy.looked_up([], 0, [])
    assert policy.leader_name == "keep_shallow"


def test_scores_decay_by_half_every_half_life_lookups(monkeypatch):
    monkeypatch.setattr(shadow_best, "CANDIDATES", {"lru": LRUEviction})
    policy = ShadowBestEviction(half_life=2)
    store = SnapshotStore(BS, byte_budget=200, eviction=policy)
    t, h = prompt(1)
    store.save(t, 16, Blob(), h, origin="mark")
    store.lookup(t, 32, h)
    assert policy.scores == pytest.approx([16.0])  # decayed first (from 0), then the restore added
    other, oh = prompt(9)
    store.lookup(other, 32, oh)
    store.lookup(other, 32, oh)
    assert policy.scores == pytest.approx([8.0])


def test_a_refresh_of_a_held_prefix_is_offered_to_the_shadows(monkeypatch):
    monkeypatch.setattr(shadow_best, "CANDIDATES", {"lru": LRUEviction, "keep_shallow": KeepShallow})
    policy = ShadowBestEviction()
    store = SnapshotStore(BS, byte_budget=200, eviction=policy)
    (p, hp), (q, hq), (r, hr) = prompt(1), prompt(2), prompt(3)
    store.save(p, 4, Blob(), hp, origin="decode")
    store.save(q, 8, Blob(), hq, origin="decode")
    store.save(r, 12, Blob(), hr, origin="decode")  # lru (leading) evicts 4, keep_shallow's shadow 8
    assert store.positions() == [8, 12] and policy.shadows["keep_shallow"].positions() == [4, 12]
    assert store.refresh(q, 8, hq) is not None  # held by the real store: offered to the shadows as a save
    assert policy.shadows["keep_shallow"].positions() == [4, 8]  # saved there, evicting its deepest (12)
    assert policy.shadows["lru"].stats.duplicates == 1


def test_unbounded_store_has_no_shadows_and_a_store_binds_once():
    policy = ShadowBestEviction()
    store = SnapshotStore(BS, byte_budget=None, eviction=policy)
    replay(store, list(traffic(4, 50)))
    assert policy.shadows == {} and policy.leader_name == "learned_value"
    with pytest.raises(ValueError, match="store"):
        SnapshotStore(BS, byte_budget=100, eviction=policy)
    with pytest.raises(ValueError, match="half_life"):
        ShadowBestEviction(half_life=0)
    with pytest.raises(ValueError, match=r"^switch_margin: must be >= 0, got -0.1"):
        ShadowBestEviction(switch_margin=-0.1)
    assert isinstance(get_eviction("shadow_best"), ShadowBestEviction)
