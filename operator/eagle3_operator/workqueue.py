"""A rate-limited, delaying work queue with client-go's semantics.

- A key is handed to one worker at a time; a key added while a worker has it is handed out again
  once that worker calls `done` (so a burst of events folds into one more pass, never two at once).
- A key waiting in the queue is there once, however often it is added.
- `add_after` keeps the earliest of the times a key was asked for.
- `add_rate_limited` delays a key by its own exponential backoff (failures in a row), reset by `forget`.
- `add(key, first=True)` puts a key in a lane served before the others: objects whose spec has not
  been acted on yet (new or edited) get their children before objects that are only being
  re-checked after their children's events, so a burst of new objects is not queued behind the
  follow-up passes of the ones before it.
- `observe_wait` (optional) is told how long each key handed out waited, from when it became ready
  (added, or due) until a worker took it (client-go's workqueue_queue_duration_seconds).
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable


class WorkQueue:
    def __init__(
        self,
        base_delay: float = 0.5,
        max_delay: float = 300.0,
        observe_wait: Callable[[float], None] | None = None,
    ):
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.observe_wait = observe_wait
        self._cond = threading.Condition()
        self._ready: deque[Hashable] = deque()
        self._first: deque[Hashable] = deque()  # the lane served before _ready
        self._first_keys: set[Hashable] = set()  # dirty keys that belong in _first
        self._dirty: set[Hashable] = set()  # keys to hand out (in a lane, or after their worker's done)
        self._processing: set[Hashable] = set()
        self._ready_since: dict[Hashable, float] = {}  # dirty key -> monotonic time it became ready
        self._due: dict[Hashable, float] = {}  # delayed key -> monotonic time it becomes ready
        self._heap: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()
        self._failures: dict[Hashable, int] = {}
        self._shut_down = False

    def add(self, key: Hashable, first: bool = False) -> None:
        with self._cond:
            self._add(key, first=first)

    def _add(self, key: Hashable, ready_since: float | None = None, first: bool = False) -> None:
        self._due.pop(key, None)
        if self._shut_down:
            return
        if key in self._dirty:
            if first and key not in self._first_keys:
                self._first_keys.add(key)
                if key not in self._processing:  # waiting in the other lane: move it up
                    self._ready.remove(key)
                    self._first.append(key)
            return
        self._dirty.add(key)
        self._ready_since[key] = ready_since or time.monotonic()
        if first:
            self._first_keys.add(key)
        if key not in self._processing:
            self._enqueue(key)

    def _enqueue(self, key: Hashable) -> None:
        (self._first if key in self._first_keys else self._ready).append(key)
        self._cond.notify()

    def add_after(self, key: Hashable, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shut_down or key in self._dirty:
                return
            due = time.monotonic() + delay
            if key in self._due and self._due[key] <= due:
                return
            self._due[key] = due
            heapq.heappush(self._heap, (due, next(self._seq), key))
            self._cond.notify()

    def add_rate_limited(self, key: Hashable) -> float:
        """Add after this key's backoff: base * 2^failures (capped), with up to 10 % jitter."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = min(self.base_delay * 2**failures, self.max_delay) * random.uniform(1.0, 1.1)
        self.add_after(key, delay)
        return delay

    def first_lane_waiting(self) -> bool:
        """Whether keys wait in the lane served first."""
        with self._cond:
            return bool(self._first)

    def forget(self, key: Hashable) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def get(self) -> Hashable | None:
        """The next ready key, waiting for one; None once the queue is shut down."""
        with self._cond:
            while True:
                if self._shut_down:
                    return None
                self._promote_due()
                if self._first or self._ready:
                    key = (self._first or self._ready).popleft()
                    self._dirty.discard(key)
                    self._first_keys.discard(key)
                    self._processing.add(key)
                    waited = time.monotonic() - self._ready_since.pop(key)
                    if self.observe_wait is not None:
                        self.observe_wait(waited)
                    return key
                timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                self._cond.wait(timeout)

    def _promote_due(self) -> None:
        now = time.monotonic()
        while self._heap and self._heap[0][0] <= now:
            due, _, key = heapq.heappop(self._heap)
            if self._due.get(key) == due:  # else superseded by an earlier time or an add
                self._add(key, ready_since=due)  # promoted late when every worker was busy

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._enqueue(key)

    def shut_down(self) -> None:
        with self._cond:
            self._shut_down = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._shut_down

    def __len__(self) -> int:
        """Keys ready or being worked on, and keys waiting for their time."""
        with self._cond:
            return len(self._dirty | self._processing) + len(self._due)
