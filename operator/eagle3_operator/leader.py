"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules.

One replica holds the Lease and reconciles; the others watch and keep their caches warm, and take
over once the holder has not renewed it for `lease_duration` (measured on their own clock, from
when they last saw the Lease change, so clock skew between nodes does not matter). The holder
renews every `retry_period`; when it cannot renew within `renew_deadline` (shorter than the lease
duration, so it stops before anyone else may start) it stops leading and the process exits, as
Kubernetes' own controllers do. Writes are fenced: the Kube client refuses them unless this
replica holds a Lease renewed within `renew_deadline`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from eagle3_operator import metrics
from eagle3_operator.kube import ApiError, Conflict, Kube

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        # The Lease holds whole seconds.
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration or self.lease_duration < 1:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration (>= 1 s), got "
                f"{self.retry_period} s, {self.renew_deadline} s, {self.lease_duration} s"
            )


def micro_time(at: datetime) -> str:
    """A Kubernetes MicroTime."""
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self, kube: Kube, settings: LeaseSettings, on_started: Callable[[], None], on_lost: Callable[[], None]
    ):
        self.kube = kube
        self.settings = settings
        self.on_started = on_started
        self.on_lost = on_lost
        self.leading = threading.Event()
        self._renewed_at = 0.0  # monotonic time of our last successful acquire or renew
        self._observed: tuple[Any, ...] | None = None  # the Lease record as last seen
        self._observed_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holds(self) -> bool:
        """True while this replica leads on a Lease it renewed within the renew deadline."""
        return self.leading.is_set() and time.monotonic() - self._renewed_at < self.settings.renew_deadline

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        s = self.settings
        log.info("leader election: %s waits for Lease %s/%s", s.identity, s.namespace, s.name)
        while not self._stop.is_set():
            try:
                renewed = self._try_acquire_or_renew()
            except Exception as error:  # noqa: BLE001 - API server unreachable or refusing: next period
                log.warning("leader election: cannot read or write the Lease: %s", error)
                renewed = False
            if renewed:
                self._renewed_at = time.monotonic()
                if not self.leading.is_set():
                    log.info("leader election: %s now leads (Lease %s/%s)", s.identity, s.namespace, s.name)
                    metrics.LEADER.set(1)
                    self.leading.set()
                    self.on_started()
            elif self.leading.is_set() and time.monotonic() - self._renewed_at >= s.renew_deadline:
                log.error(
                    "leader election: %s lost the Lease (not renewed in %s s)", s.identity, s.renew_deadline
                )
                self.leading.clear()
                metrics.LEADER.set(0)
                self.on_lost()
                return
            # Candidates spread their attempts (client-go's jitter); the leader renews on the beat.
            jitter = 0.0 if self.leading.is_set() else random.uniform(0, 1.2 * s.retry_period)
            self._stop.wait(s.retry_period + jitter)

    def _try_acquire_or_renew(self) -> bool:
        s = self.settings
        now = datetime.now(UTC)
        lease = self.kube.get_lease(s.namespace, s.name)
        ours = {
            "holderIdentity": s.identity,
            "leaseDurationSeconds": round(s.lease_duration),
            "acquireTime": micro_time(now),
            "renewTime": micro_time(now),
            "leaseTransitions": 0,
        }
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": s.name, "namespace": s.namespace},
                "spec": ours,
            }
            try:
                self.kube.create_lease(body)
            except Conflict:  # another replica created it first
                return False
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("acquireTime"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        duration = spec.get("leaseDurationSeconds") or s.lease_duration
        if holder and holder != s.identity and time.monotonic() < self._observed_at + duration:
            return False  # held by another replica that renewed it recently
        transitions = spec.get("leaseTransitions") or 0
        if holder == s.identity:
            ours["acquireTime"] = spec.get("acquireTime") or ours["acquireTime"]
            ours["leaseTransitions"] = transitions
        else:
            ours["leaseTransitions"] = transitions + 1
            log.info("leader election: taking over the Lease from %r", holder or "nobody")
        lease["spec"] = ours
        try:
            self.kube.update_lease(lease)
        except Conflict:  # someone else wrote it since we read it
            return False
        return True

    def release(self) -> None:
        """Give the Lease up at shutdown so another replica takes over at once (client-go's
        ReleaseOnCancel): no holder, a one-second duration."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=self.settings.retry_period + 5)
        if not self.leading.is_set():
            return
        self.leading.clear()
        metrics.LEADER.set(0)
        s = self.settings
        try:
            lease = self.kube.get_lease(s.namespace, s.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == s.identity:
                now = micro_time(datetime.now(UTC))
                lease["spec"] |= {
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "renewTime": now,
                    "acquireTime": now,
                }
                self.kube.update_lease(lease)
                log.info("leader election: released the Lease %s/%s", s.namespace, s.name)
        except ApiError as error:
            log.warning("leader election: could not release the Lease: %s", error.detail)
