"""A reconcile fenced by leader election (a write refused while the Lease is overdue for renewal)
keeps its key queued: if the replica's late renewal then succeeds it leads on, and the object must
still be reconciled. Found by benchmarks/operator/chaos.py: a DraftTraining whose last stage's
completion was fenced during an API server restart stayed Running, with no further pass, resyncs
included."""

from __future__ import annotations

import threading

from eagle3_operator.kube import NotLeader
from eagle3_operator.reconciler import ControllerSettings, Reconciler


def test_a_fenced_reconcile_is_tried_again_once_the_replica_holds_the_lease():
    reconciler = Reconciler(kube=None, settings=ControllerSettings(workers=1, backoff_base=0.01))  # type: ignore[arg-type]
    passes: list[str] = []
    done = threading.Event()

    def process(item):
        passes.append("fenced" if not passes else "reconciled")
        if len(passes) == 1:
            raise NotLeader("PATCH .../status: this replica does not hold the leader Lease")
        done.set()
        return None

    reconciler._process = (
        process  # the reconcile itself needs an API server: only the worker loop is under test
    )
    reconciler.leading.set()
    reconciler.start()
    try:
        reconciler.queue.add(("DraftTraining", "ml", "llama"))
        assert done.wait(5), f"the fenced key was dropped: {passes}"
    finally:
        reconciler.stop()
    assert passes == ["fenced", "reconciled"]
