"""A reference model of a table's budget, eviction and admission (csrc/store/table_policy.h), in plain
Python: given the same requests, it predicts the rows held, the victims in order and the rows admitted.
It follows the design notes of table_policy.h, not the C++ code."""

from __future__ import annotations

import math

MASK = (1 << 64) - 1
SKETCH_SEEDS = (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89)
AGING_FACTOR = 1
# auto_sketch_width (table_policy.h): the sketch's width when the policy does not give one.
MIN_AUTO_WIDTH, MAX_AUTO_WIDTH, NO_BUDGET_WIDTH = 1 << 10, 1 << 22, 1 << 14


def auto_sketch_width(max_rows):
    """The power of two at or above twice the budget, within [2^10, 2^22]; 2^14 without a budget."""
    if max_rows is None:
        return NO_BUDGET_WIDTH
    width = MIN_AUTO_WIDTH
    while width < MAX_AUTO_WIDTH and width // 2 < max_rows:
        width *= 2
    return width


def mix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def count_limit(admit_after: int) -> int:
    """Counters take the fewest of 2, 4, 8 or 16 bits that count to admit_after, and saturate there."""
    return next((1 << bits) - 1 for bits in (2, 4, 8, 16) if admit_after <= (1 << bits) - 1)


class Sketch:
    def __init__(self, width: int, admit_after: int):
        self.width = width
        self.limit = count_limit(admit_after)
        self.counters = [[0] * width for _ in SKETCH_SEEDS]
        self.since_aging = 0

    def increment(self, row_id: int) -> int:
        count = self.limit
        for row, seed in enumerate(SKETCH_SEEDS):
            column = mix64(row_id ^ seed) & (self.width - 1)
            self.counters[row][column] = min(self.counters[row][column] + 1, self.limit)
            count = min(count, self.counters[row][column])
        return count

    def note_increments(self, increments: int) -> None:
        self.since_aging += increments
        if self.since_aging >= self.width * AGING_FACTOR:
            self.counters = [[c >> 1 for c in row] for row in self.counters]
            self.since_aging = 0


class PolicyModel:
    """evict: None, "lru", "lfu" or "ttl" (ttl in steps)."""

    def __init__(self, max_rows=None, evict=None, half_life=1000.0, ttl=None, admit_after=1, sketch_width=None):
        self.max_rows = max_rows
        self.evict = evict
        self.half_life = float(half_life)
        self.ttl = ttl
        self.admit_after = admit_after
        self.sketch = Sketch(sketch_width or auto_sketch_width(max_rows), admit_after) if admit_after > 1 else None
        self.rows = {}  # id -> (tick, step, score)
        self.tick = 0
        self.step = 0
        self.evicted = []  # every victim, in order
        self.admitted = []  # every admitted row, in order
        self.pending = 0

    def _score(self, old):
        if self.evict != "lfu":
            return 0.0
        now = self.step / self.half_life
        if old is None:
            return now
        return math.log2(math.pow(2.0, old - now) + 1.0) + now

    def _expired(self, row_id):
        return self.evict == "ttl" and self.step - self.rows[row_id][1] > self.ttl

    def _order(self):
        return sorted(self.rows, key=lambda r: (self.rows[r][2], self.rows[r][0]))

    def request(self, ids, kind):
        """kind: "lookup", "update" or "write". Returns the ids whose rows are stored."""
        if kind == "update":
            self.step += 1
        distinct = list(dict.fromkeys(int(i) for i in ids))
        status = {}
        for row_id in distinct:
            if row_id in self.rows and not self._expired(row_id):
                status[row_id] = "resident"
            elif self.admit_after <= 1 or kind == "write":
                status[row_id] = "admit"
            elif kind == "lookup":
                status[row_id] = "admit" if self.sketch.increment(row_id) >= self.admit_after else "pending"
            else:
                status[row_id] = "pending"
        for row_id in self._order():
            if not self._expired(row_id):
                break
            self.evicted.append(row_id)
            del self.rows[row_id]
        admitted = []
        for row_id in distinct:
            if status[row_id] == "resident":
                self.tick += 1
                self.rows[row_id] = (self.tick, self.step, self._score(self.rows[row_id][2]))
            elif status[row_id] == "admit":
                self.tick += 1
                admitted.append((row_id, self.tick))
            else:
                self.pending += 1
        if self.max_rows is not None and len(self.rows) + len(admitted) > self.max_rows:
            excess = len(self.rows) + len(admitted) - self.max_rows
            victims = [r for r in self._order() if r not in status][:excess]
            for row_id in victims:
                del self.rows[row_id]
            self.evicted.extend(victims)
        for row_id, tick in admitted:
            self.rows[row_id] = (tick, self.step, self._score(None))
            self.admitted.append(row_id)
        if self.sketch is not None:
            self.sketch.note_increments(sum(1 for r in distinct if kind == "lookup" and status[r] != "resident"))
        return {r for r in distinct if status[r] != "pending"}
