"""An independent reference simulator for small traces (issue 23, deliverable 5).

Deliberately simple and slow: one request at a time (each finishes before the next arrives),
everything recomputed from scratch per request with plain lists, tuples and dicts. It shares no
code with the planner, engine, scheduler, prefix cache, snapshot store, eviction or cost model;
the only things it imports are the placement policy's public rule functions
(`get_policy(name).chunk_len / saves_snapshot / last_captures / marks / speculative_marks /
mark_mode` and `PlanContext`). Its settings are plain data: the flat dict
`SimConfig.engine_settings` returns, the snapshot size, and the FLOPs the engine stamps on a
snapshot at each position (`ShapeCost.snapshot_flops`, a list; the cost model's own formula is
pinned by tests/test_cost_rules.py, and passing the numbers keeps FLOP-aware ties, decided in the
last bit, identical).

The rules it re-expresses, each from the docstring or code that states it:

* KV match (planner/prefix_cache.py): the longest run of whole KV blocks of the prompt whose
  token prefix an earlier sequence had computed (prompt + reply without its last token: the last
  sampled token is never fed back), backed off one block when it would cover the whole prompt.
  Nothing is evicted from KV (the caller sizes the pool to hold every trace).
* Restore point (planner/scheduler.py `_admit`, snapshot_store.py `lookup`): only with a KV match
  > 0; the held snapshot of the deepest position <= the match whose token prefix equals the
  prompt's (token tuples compared, no hashes). Restoring refreshes its recency.
* Marks (`_admit`): the policy's own marks and the request's oracle marks strictly inside
  (restore, total); speculative marks strictly inside, minus those two.
* Chunks (planner/prefill_plan.py `plan_chunk`, scheduler tick budget): a request's first chunk
  gets prefill_budget + max_batch_size tokens (no slot is held at that tick), later chunks one less
  (its own decode reservation). The policy's chunk_len, then the first mark strictly inside stops the
  chunk (mark_mode "stop") or is captured in it ("capture"). A non-last chunk end saves when the
  policy's saves_snapshot says so or it is a mark; a last chunk captures the policy's
  last_captures plus its inside marks. Saves in position order, the chunk end last.
* Oracle marks at the prompt end or in the reply (experiments/traces/oracle.py docstring,
  model/engine/engine.py `_save_snapshots` / `_save_marked_decode_state`): the state after the
  last chunk when the prompt end is a mark (after the chunk's own saves), and after each decode
  row whose end is a mark (positions total + 1 .. total + reply - 1), saved as the row runs.
* Decode-time states (model/engine/engine.py `_track_boundary_states` / `_save_boundary_state`):
  with decode snapshots on, the state after the last row (the last prefill chunk or a decode
  token) whose end is a multiple of the decode grid (0 = the KV block) is saved at finish, after
  any oracle save (the same position twice is a duplicate, listed twice for the request).
* Origin (`PlacementPolicy` docstring: speculative marks are the ones no request asked for): an
  oracle mark, else an admission mark, else "speculative" if only a speculative mark asked for it
  (not the policy's own chunk rule: ours-plus's tail capture can land on its 2048 grid), else
  chunk; decode states "decode".
* Store (planner/snapshot_store.py `save`): a key already held is refreshed (counted a duplicate,
  reported as saved by the request); larger than the budget: rejected; when it does not fit, the
  eviction's `admits` decides (LRU has none: a speculative snapshot is declined), then victims
  are evicted until it fits.
* Evictions (planner/evictions/ docstrings): LRU; flop_aware = lowest min-max-normalized
  recency + alpha x FLOPs-per-byte, ties LRU first; learned_value = GreedyDual over
  p(origin, restores) x FLOPs per byte with a Beta(1, 9) prior and a 4096-key ghost history;
  seglen = lowest recency + 0.85 x replay length to the nearest held ancestor; shadow_best
  (planner/evictions/shadow_best.py) = the leader's decision among four candidates, each also run alone
  on a shadow store fed every save and lookup (RefShadowBest).
"""

from __future__ import annotations

import dataclasses

from planner.policies.base import PlanContext
from planner.policies.registry import get_policy

LEARNED_PRIOR = (1.0, 9.0)  # Beta(prior_hits, prior_misses), planner/evictions/ LearnedValueEviction defaults
LEARNED_HISTORY = 4096  # restore counts kept for this many evicted keys
FLOP_AWARE_ALPHA = 1.0
SEGLEN_WEIGHT = 0.85  # SGLang PR #22172's example weight, planner/evictions/ SeglenEviction's default


@dataclasses.dataclass
class RefRecord:
    """What the reference keeps of one request (the same fields as the simulator's record)."""

    kv_match: int
    restore_at: int
    replayed: int
    forwards: int
    chunk_ends: list
    snapshot_positions: list


@dataclasses.dataclass
class Held:
    """One held snapshot: the exact token prefix it stands for and what eviction reads."""

    tokens: tuple
    origin: str
    flops: float
    last_used: int

    @property
    def position(self) -> int:
        return len(self.tokens)


# ------------------------------------------------------------------ KV match and restore point
def common_prefix(a: list, b: list) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def kv_match(prompt: list, computed: list, block: int, unit: int = 0) -> int:
    """Whole blocks of `prompt` some earlier computed sequence covers, backed off when whole; with a
    match unit under the block (planner/prefix_cache.py's docstring): the longest covered prefix
    capped at len(prompt) - 1 (one token must run), floored to the unit."""
    longest = max((common_prefix(prompt, seq) for seq in computed), default=0)
    if unit and unit < block:
        return min(longest, len(prompt) - 1) // unit * unit
    blocks = longest // block
    if blocks and blocks * block >= len(prompt):
        blocks -= 1
    return blocks * block


# ------------------------------------------------------------------ evictions
class RefLRU:
    name = "lru"
    has_admits = False

    def victim(self, held: list) -> Held:
        return held[0]


def min_max(values: list) -> list:
    lo, hi = min(values), max(values)
    return [0.0] * len(values) if hi == lo else [(v - lo) / (hi - lo) for v in values]


def first_lowest(held: list, utility: list) -> Held:
    """The held snapshot of lowest utility, scanning in recency order: of equals, the least recently used."""
    best = 0
    for i in range(1, len(held)):
        if utility[i] < utility[best]:  # strict: the least recently used of equals stays the victim
            best = i
    return held[best]


class RefFlopAware:
    name = "flop_aware"
    has_admits = False

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def victim(self, held: list) -> Held:
        recency = min_max([float(h.last_used) for h in held])
        efficiency = min_max([h.flops / max(self.nbytes, 1) for h in held])
        utility = [r + FLOP_AWARE_ALPHA * e for r, e in zip(recency, efficiency)]
        return first_lowest(held, utility)


class RefLearnedValue:
    name = "learned_value"
    has_admits = True

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.inflation = 0.0
        self.credit: dict = {}
        self.level: dict = {}
        self.ghost: list = []  # [key, level] pairs, oldest eviction first
        self.outcomes: dict = {}  # (origin, min(level, 3)) -> [restored again, evicted first]

    def _counts(self, origin: str, level: int) -> list:
        return self.outcomes.setdefault((origin, min(level, 3)), [0, 0])

    def _ghost_level(self, key: tuple) -> int:
        for k, level in self.ghost:
            if k == key:
                return level
        return 0

    def _score(self, h: Held, level: int) -> float:
        again, evicted = self._counts(h.origin, level)
        hits, misses = LEARNED_PRIOR
        p = (again + hits) / (again + evicted + hits + misses)
        return self.inflation + p * h.flops / max(self.nbytes, 1)

    def saved(self, h: Held) -> None:
        level = self._ghost_level(h.tokens)
        self.ghost = [pair for pair in self.ghost if pair[0] != h.tokens]
        self.level[h.tokens] = level
        self.credit[h.tokens] = self._score(h, level)

    def restored(self, h: Held) -> None:
        level = self.level.get(h.tokens, 0)
        self._counts(h.origin, level)[0] += 1
        self.level[h.tokens] = level + 1
        self.credit[h.tokens] = self._score(h, level + 1)

    def evicted(self, h: Held) -> None:
        level = self.level.pop(h.tokens, 0)
        self.credit.pop(h.tokens, None)
        self._counts(h.origin, level)[1] += 1
        self.ghost = [pair for pair in self.ghost if pair[0] != h.tokens] + [[h.tokens, level]]
        self.ghost = self.ghost[-LEARNED_HISTORY:]

    def victim(self, held: list) -> Held:
        best = held[0]
        for h in held[1:]:
            if self.credit[h.tokens] < self.credit[best.tokens]:  # first of equals: LRU order
                best = h
        self.inflation = max(self.inflation, self.credit[best.tokens])
        return best

    def admits(self, candidate: Held, held: list) -> bool:
        mine = self._score(candidate, self._ghost_level(candidate.tokens))
        return not held or mine > min(self.credit[h.tokens] for h in held)


class RefSeglen:
    """recency + weight * (replay to the nearest held snapshot on the same prefix), both min-max
    normalized. A held g lies on h's prefix when it is shallower and h's tokens begin with g's,
    re-read over the whole held set at every victim choice (no links kept)."""

    name = "seglen"
    has_admits = False

    def __init__(self, nbytes: int):  # every rule is built from the snapshot size; seglen needs none
        pass

    def is_ancestor(self, g: Held, h: Held) -> bool:
        return g.position < h.position and h.tokens[:g.position] == g.tokens

    def seglen(self, h: Held, held: list) -> int:
        return h.position - max((g.position for g in held if self.is_ancestor(g, h)), default=0)

    def victim(self, held: list) -> Held:
        recency = min_max([float(h.last_used) for h in held])
        seglen = min_max([float(self.seglen(h, held)) for h in held])
        utility = [r + SEGLEN_WEIGHT * g for r, g in zip(recency, seglen)]
        return first_lowest(held, utility)


class RefGated:
    """A candidate of shadow_best whose speculative and chunk-end snapshots go into free memory only."""

    has_admits = True

    def __init__(self, base):
        self.base = base

    def victim(self, held: list) -> Held:
        return self.base.victim(held)

    def admits(self, candidate: Held, held: list) -> bool:
        if candidate.origin in ("speculative", "chunk"):
            return False
        return self.base.admits(candidate, held) if self.base.has_admits else candidate.origin != "speculative"

    def __getattr__(self, name):  # saved / restored / evicted: the base's, if it has them
        return getattr(self.base, name)


class RefShadowBest:
    """shadow_best: each candidate also runs alone on a shadow store fed every save and every
    lookup; a shadow's score decays by 0.5 ** (1 / 1024) per lookup before its restore (the position)
    is added; the leader moves to the first highest score only when it is more than 5% above its
    own; the leader's copy of its rule, kept up with the real store's events, decides for the real
    store."""

    CANDIDATES = {"learned_value": lambda n: RefLearnedValue(n), "learned_value+gate": lambda n: RefGated(RefLearnedValue(n)),
                  "seglen+gate": lambda n: RefGated(RefSeglen(n)), "lru+gate": lambda n: RefGated(RefLRU())}
    DECAY = 0.5 ** (1 / 1024)
    MARGIN = 1.05

    def __init__(self, nbytes: int):
        self.deciders = [make(nbytes) for make in self.CANDIDATES.values()]
        self.shadows: list = []
        self.scores = [0.0] * len(self.deciders)
        self.leader = 0

    def bind(self, budget: int | None, nbytes: int) -> None:
        if budget is not None:
            self.shadows = [RefStore(budget, nbytes, make(nbytes)) for make in self.CANDIDATES.values()]

    has_admits = True

    def offered(self, tokens: tuple, origin: str, flops: float) -> None:
        for shadow in self.shadows:
            shadow.save(tokens, origin, flops)

    def looked_up(self, prompt: list, limit: int) -> None:
        for i, shadow in enumerate(self.shadows):
            self.scores[i] *= self.DECAY
            h = shadow.deepest(prompt, limit)
            if h is not None:
                shadow.restore(h)
                self.scores[i] += h.position
        top = max(self.scores)
        if top > self.MARGIN * self.scores[self.leader]:  # the first of the highest takes over
            self.leader = self.scores.index(top)

    def victim(self, held: list) -> Held:
        return self.deciders[self.leader].victim(held)

    def admits(self, candidate: Held, held: list) -> bool:
        decider = self.deciders[self.leader]
        return decider.admits(candidate, held) if decider.has_admits else candidate.origin != "speculative"

    def _all(self, event: str, h: Held) -> None:
        for decider in self.deciders:
            observer = getattr(decider, event, None)
            if observer is not None:
                observer(h)

    def saved(self, h: Held) -> None:
        self._all("saved", h)

    def restored(self, h: Held) -> None:
        self._all("restored", h)

    def evicted(self, h: Held) -> None:
        self._all("evicted", h)


EVICTIONS = {"lru": lambda nbytes: RefLRU(), "flop_aware": RefFlopAware, "learned_value": RefLearnedValue,
             "seglen": RefSeglen, "shadow_best": RefShadowBest}


# ------------------------------------------------------------------ the snapshot store
class RefStore:
    """Held snapshots in recency order (least recently used first), with the store's counters."""

    def __init__(self, budget: int | None, nbytes: int, eviction):
        self.budget, self.nbytes = budget, nbytes
        self.eviction = EVICTIONS[eviction](nbytes) if isinstance(eviction, str) else eviction
        if hasattr(self.eviction, "bind"):
            self.eviction.bind(budget, nbytes)
        self.held: list = []
        self.clock = 0
        self.counts = {"saved": 0, "evicted": 0, "restored": 0, "rejected": 0, "declined": 0, "duplicates": 0}
        self.saved_by_origin: dict = {}
        self.restored_tokens_by_origin: dict = {}

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _tell(self, event: str, h: Held) -> None:
        observer = getattr(self.eviction, event, None)
        if observer is not None:
            observer(h)

    def find(self, tokens: tuple) -> Held | None:
        for h in self.held:
            if h.tokens == tokens:
                return h
        return None

    def deepest(self, prompt: list, limit: int) -> Held | None:
        """The held snapshot of the deepest position in (0, limit] that is a prefix of `prompt`."""
        if hasattr(type(self.eviction), "looked_up"):
            self.eviction.looked_up(prompt, limit)
        best = None
        for h in self.held:
            if 0 < h.position <= min(limit, len(prompt)) and tuple(prompt[:h.position]) == h.tokens:
                if best is None or h.position > best.position:
                    best = h
        return best

    def restore(self, h: Held) -> None:
        h.last_used = self._tick()
        self.held.remove(h)
        self.held.append(h)
        self.counts["restored"] += 1
        self.restored_tokens_by_origin[h.origin] = self.restored_tokens_by_origin.get(h.origin, 0) + h.position
        self._tell("restored", h)

    def _fits(self) -> bool:
        return self.budget is None or (len(self.held) + 1) * self.nbytes <= self.budget

    def save(self, tokens: tuple, origin: str, flops: float) -> bool:
        if hasattr(type(self.eviction), "offered"):
            self.eviction.offered(tokens, origin, flops)
        now = self._tick()
        existing = self.find(tokens)
        if existing is not None:
            existing.last_used = now
            self.held.remove(existing)
            self.held.append(existing)
            self.counts["duplicates"] += 1
            return True
        if self.budget is not None and self.nbytes > self.budget:
            self.counts["rejected"] += 1
            return False
        new = Held(tokens, origin, flops, now)
        if not self._fits():
            keep_new = self.eviction.admits(new, list(self.held)) if self.eviction.has_admits \
                else origin != "speculative"
            if not keep_new:
                self.counts["declined"] += 1
                return False
        while not self._fits():
            victim = self.eviction.victim(list(self.held))
            self.held.remove(victim)
            self.counts["evicted"] += 1
            self._tell("evicted", victim)
        self.held.append(new)
        self.counts["saved"] += 1
        self.saved_by_origin[origin] = self.saved_by_origin.get(origin, 0) + 1
        self._tell("saved", new)
        return True


# ------------------------------------------------------------------ one request
@dataclasses.dataclass
class Chunk:
    end: int
    saves: list  # absolute positions, ascending
    by_rule: set  # those the policy's own chunk rules ask for (never speculative)


def plan_chunks(policy, ctx: PlanContext, start: int, total: int, marks: set, first_budget: int,
                later_budget: int) -> list:
    """Every chunk of one prefill from `start`, with the positions each leaves a snapshot at."""
    chunks, offset = [], start
    while offset < total:
        budget = first_budget if not chunks else later_budget
        length = policy.chunk_len(offset, total, min(budget, total - offset), ctx)
        inside = sorted(m for m in marks if offset < m < offset + length)
        if inside and policy.mark_mode == "stop":
            length, inside = inside[0] - offset, []
        end = offset + length
        if end < total:
            by_rule = {end} if policy.saves_snapshot(end, total, ctx) else set()
            saves = inside + ([end] if by_rule or end in marks else [])
        else:
            by_rule = {offset + o for o in policy.last_captures(offset, length, total, ctx)}
            saves = sorted(by_rule | set(inside))
        chunks.append(Chunk(end, saves, by_rule))
        offset = end
    return chunks


def decode_state_position(total: int, reply_len: int, grid: int) -> int | None:
    """The end of the last row (last prefill chunk at `total`, decode rows up to total + reply - 1)
    that lands on the grid."""
    for end in range(total + reply_len - 1, total - 1, -1):
        if end % grid == 0:
            return end
    return None


# ------------------------------------------------------------------ the oracle's marks
def oracle_marks(trace: list, block: int) -> dict:
    """experiments/traces/oracle.py's docstring rule, re-expressed: request j matches the longest
    prefix of its prompt, in whole blocks and capped to leave one token, that an earlier request
    computed (prompt + reply without its last token); the first request that computed that
    prefix marks the position, wherever it lies in its prompt or reply."""
    marks: dict = {}
    sequences = [prompt + reply[:-1] for prompt, reply in trace]
    for j, (prompt, _) in enumerate(trace):
        usable = (len(prompt) - 1) // block
        longest = max((common_prefix(prompt, sequences[i]) for i in range(j)), default=0)
        matched = min(usable, longest // block) * block
        if not matched:
            continue
        owner = min(i for i in range(j) if common_prefix(prompt, sequences[i]) >= matched)
        marks.setdefault(owner, set()).add(matched)
    return {i: sorted(m) for i, m in marks.items()}


# ------------------------------------------------------------------ the run
@dataclasses.dataclass
class RefResult:
    records: list
    store: RefStore

    @property
    def held_positions(self) -> list:
        return sorted(h.position for h in self.store.held)

    @property
    def held_tokens(self) -> list:
        return [h.tokens for h in self.store.held]


def simulate_reference(trace: list, settings: dict, snapshot_nbytes: int, eviction: str, flops: list,
                       snapshot_marks: dict | None = None) -> RefResult:
    """Run `trace` (a list of (prompt, reply) token lists, served one at a time) under the policy
    `settings["policy"]` with the engine settings `settings` (SimConfig.engine_settings' dict);
    `flops[p]`: the FLOPs stamped on a snapshot at position p; `snapshot_marks`: request index ->
    positions it must capture (the optimum's oracle marks)."""
    policy = get_policy(settings["policy"])
    block = settings["block_size"]
    unit = settings.get("prefix_match_unit", 0)
    ctx = PlanContext(block, 0, settings["state_block"], settings["kernel_chunk"], unit,
                      snapshot_memory_bounded=settings["snapshot_byte_budget"] is not None)
    first_budget = settings["prefill_budget"] + settings["max_batch_size"]
    later_budget = first_budget - 1
    grid = (settings["decode_snapshot_grid"] or block) if settings["decode_snapshots"] else None
    store = RefStore(settings["snapshot_byte_budget"], snapshot_nbytes, eviction)
    computed: list = []
    records = []
    for index, (prompt, reply) in enumerate(trace):
        total = len(prompt)
        kv = kv_match(prompt, computed, block, unit)
        restored = store.deepest(prompt, kv) if kv else None
        start = restored.position if restored is not None else 0
        if restored is not None:
            store.restore(restored)
        own = {m for m in policy.marks(kv, start, total, ctx) if start < m < total}
        requested = set((snapshot_marks or {}).get(index, ()))
        oracle = {m for m in requested if start < m < total}
        speculative = {m for m in policy.speculative_marks(kv, start, total, ctx) if start < m < total} - own - oracle
        chunks = plan_chunks(policy, ctx, start, total, own | oracle | speculative, first_budget, later_budget)
        positions = []

        def save(tokens: list, position: int, origin: str) -> None:
            if store.save(tuple(tokens[:position]), origin, flops[position]):
                positions.append(position)

        for chunk in chunks:
            for p in chunk.saves:
                origin = ("oracle" if p in oracle else "mark" if p in own
                          else "speculative" if p in speculative and p not in chunk.by_rule else "chunk")
                save(prompt, p, origin)
        for m in sorted(m for m in requested if total <= m < total + len(reply)):  # prompt end, decode rows
            save(prompt + reply, m, "oracle")
        if grid is not None:
            at = decode_state_position(total, len(reply), grid)
            if at is not None:
                save(prompt + reply, at, "decode")
        computed.append(prompt + reply[:-1])  # the last reply token is sampled, never computed
        records.append(RefRecord(kv, start, total - start, len(chunks), [c.end for c in chunks], positions))
    return RefResult(records, store)
