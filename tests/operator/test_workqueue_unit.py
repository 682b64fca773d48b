"""The reconcile work queue (client-go's semantics), without a cluster."""

from __future__ import annotations

import threading
import time

from eagle3_operator.reconciler import Reconciler
from eagle3_operator.workqueue import WorkQueue


def test_events_during_a_reconcile_fold_into_one_more_pass():
    queue = WorkQueue()
    queue.add("a")
    assert queue.get() == "a"
    for _ in range(10):  # a burst of events while a worker holds "a"
        queue.add("a")
    queue.add("b")
    assert queue.get() == "b", "a key being worked on is not handed to a second worker"
    queue.done("b")
    queue.done("a")
    assert queue.get() == "a", "the burst costs one more pass"
    queue.done("a")
    assert len(queue) == 0


def test_delayed_keys_keep_their_earliest_time_and_wake_a_waiting_worker():
    queue = WorkQueue()
    queue.add_after("a", 30)
    queue.add_after("a", 0.2)  # earlier: wins
    queue.add_after("a", 60)  # later: ignored
    got: list[tuple[str, float]] = []
    start = time.monotonic()
    worker = threading.Thread(target=lambda: got.append((queue.get(), time.monotonic() - start)))
    worker.start()
    worker.join(5)
    assert got and got[0][0] == "a" and 0.15 <= got[0][1] < 2, got
    queue.done("a")
    assert len(queue) == 0, "the superseded times are not handed out again"
    queue.add_after("b", 60)
    queue.add("b")  # an event now overrides a scheduled pass
    assert queue.get() == "b"


def test_failures_back_off_exponentially_per_key_until_forgotten():
    queue = WorkQueue(base_delay=1.0, max_delay=5.0)
    delays = [queue.add_rate_limited("a") for _ in range(5)]
    assert [round(d) for d in delays[:3]] == [1, 2, 4] and 5.0 <= delays[4] <= 5.5, delays
    assert 1.0 <= queue.add_rate_limited("b") <= 1.1, "another key has its own backoff"
    queue.forget("a")
    assert 1.0 <= queue.add_rate_limited("a") <= 1.1


def test_shut_down_releases_waiting_workers():
    queue = WorkQueue()
    got = []
    worker = threading.Thread(target=lambda: got.append(queue.get()))
    worker.start()
    queue.shut_down()
    worker.join(5)
    assert got == [None] and queue.closed


def test_the_wait_of_each_key_is_observed_from_when_it_became_ready():
    waits: list[float] = []
    queue = WorkQueue(observe_wait=waits.append)
    queue.add("a")
    queue.add_after("b", 0.1)
    time.sleep(0.2)
    assert queue.get() == "a"
    assert queue.get() == "b"
    assert 0.2 <= waits[0] < 1, waits
    assert 0.05 <= waits[1] < waits[0] - 0.05, "b waited from its due time (not its add, nor the get)"


def test_keys_added_first_are_served_before_the_other_lane():
    queue = WorkQueue()
    for key in ("re-check-1", "re-check-2"):
        queue.add(key)
    queue.add("new", first=True)
    queue.add("re-check-2", first=True)  # waiting in the other lane: moves up, behind "new"
    assert [queue.get() for _ in range(3)] == ["new", "re-check-2", "re-check-1"]
    for key in ("new", "re-check-2", "re-check-1"):
        queue.done(key)
    assert len(queue) == 0


def test_the_first_lane_says_whether_keys_wait_in_it():
    queue = WorkQueue()
    queue.add("re-check")
    assert not queue.first_lane_waiting()
    queue.add("new", first=True)
    assert queue.first_lane_waiting()
    assert queue.get() == "new"
    assert not queue.first_lane_waiting(), "a key a worker has is no longer waiting"
    queue.done("new")


def test_a_key_marked_first_while_a_worker_has_it_comes_back_in_the_first_lane():
    queue = WorkQueue()
    queue.add("edited")
    assert queue.get() == "edited"
    queue.add("other")
    queue.add("edited", first=True)  # the spec changed during its pass
    queue.done("edited")
    assert queue.get() == "edited", "its next pass goes ahead of the other lane"
    queue.done("edited")
    assert queue.get() == "other"
    queue.done("other")
    queue.add("edited")
    assert queue.get() == "edited"  # plain again once handed out
    queue.done("edited")
    assert len(queue) == 0


def test_the_reconciler_serves_objects_whose_spec_it_has_not_acted_on_first():
    reconciler = Reconciler(kube=None)  # type: ignore[arg-type]  # no worker runs: only the queueing
    acted = {"generation": 1, "status": {"observedGeneration": 1}}
    new = {"generation": 1, "status": None}
    edited = {"generation": 2, "status": {"observedGeneration": 1}}
    for name, state in (("acted", acted), ("new", new), ("edited", edited)):
        body = {
            "apiVersion": "eagle3.ai/v1alpha1",
            "kind": "DraftTraining",
            "metadata": {"namespace": "ml", "name": name, "uid": name, "generation": state["generation"]},
            "spec": {},
            "status": state["status"],
        }
        reconciler.observe("DraftTraining", body["apiVersion"], body)
        reconciler.on_event("DraftTraining", body, deleted=False)
    order = [reconciler.queue.get()[2] for _ in range(3)]
    assert order == ["new", "edited", "acted"]
