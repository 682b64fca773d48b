"""Hidden states streamed from a vLLM extraction server to the trainer: nothing is written to disk.

The server's connector PUSHes one message per request (eagle3_runtime/connectors/hidden_states.py)
on the port it names in each response; `StreamingHiddenStates` sends the prefill requests from a
background thread, connects a PULL socket to that port on the server's host once the first
answer names it, and yields `HiddenStateSample`s in input order. At most `buffer_size` samples are
requested but not yet consumed, so a slow trainer throttles the server instead of filling memory.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

import torch

from eagle3_runtime.connectors.hidden_states import decode_message
from eagle3_runtime.extract.server import request_hidden_states, served_model
from eagle3_runtime.hidden_states import HiddenStateSample
from eagle3_runtime.vllm_client import open_session

_DONE = object()


class StreamingHiddenStates:
    """Iterable of samples for `(input_ids, loss_mask)` pairs, states computed by a running server."""

    def __init__(
        self,
        server_url: str,
        records: Iterable[tuple[torch.Tensor, torch.Tensor]],
        *,
        layer_ids: list[int] | None = None,
        model: str | None = None,
        buffer_size: int = 16,
        concurrency: int = 4,
        receive_timeout_s: float = 600.0,
    ):
        if buffer_size < 1:
            raise ValueError("buffer_size must be at least 1")
        self.server_url, self.model, self.layer_ids = server_url.rstrip("/"), model, layer_ids
        self.records = records
        self.buffer_size, self.concurrency = buffer_size, min(concurrency, buffer_size)
        self.receive_timeout_s = receive_timeout_s

    def __iter__(self) -> Iterator[HiddenStateSample]:
        import zmq

        context = zmq.Context.instance()
        pull = context.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVHWM, self.buffer_size)
        connected = False
        slots = threading.Semaphore(self.buffer_size)  # requested but not yet consumed
        ordered: queue.Queue = queue.Queue()  # (index, input_ids, loss_mask, key) in request order
        stop = threading.Event()
        failure: list[BaseException] = []
        sender = threading.Thread(
            target=self._send_all,
            args=(slots, ordered, stop, failure),
            name="hidden-state-requests",
            daemon=True,
        )
        sender.start()
        arrived: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        poller = zmq.Poller()
        poller.register(pull, zmq.POLLIN)
        try:
            while True:
                item = ordered.get()
                if item is _DONE:
                    if failure:
                        raise failure[0]
                    return
                input_ids, loss_mask, params = item
                key = params["hidden_states_key"]
                if not connected:
                    self._check_layers(params)
                    endpoint = f"tcp://{urlsplit(self.server_url).hostname}:{params['hidden_states_port']}"
                    pull.connect(endpoint)
                    connected = True
                while key not in arrived:
                    if not poller.poll(timeout=self.receive_timeout_s * 1000):
                        raise TimeoutError(
                            f"no hidden states from {endpoint} within {self.receive_timeout_s:.0f} s"
                        )
                    got_key, token_ids, hidden = decode_message(pull.recv_multipart())
                    arrived[got_key] = (token_ids, hidden)
                token_ids, hidden = arrived.pop(key)
                if not torch.equal(token_ids, input_ids):
                    raise RuntimeError(f"streamed states for {key} belong to other tokens")
                slots.release()
                yield HiddenStateSample(input_ids=input_ids, loss_mask=loss_mask, hidden_states=hidden)
        finally:
            stop.set()
            # Unblock a sender waiting for a slot so the thread ends.
            for _ in range(self.buffer_size):
                slots.release()
            pull.close(linger=0)

    def _check_layers(self, params: dict) -> None:
        served = params.get("hidden_states_layer_ids")
        if "hidden_states_port" not in params:
            raise RuntimeError(f"{self.server_url} is not a streaming extraction server (transport zmq)")
        if self.layer_ids is not None and served[:-1] != list(self.layer_ids):
            raise ValueError(
                f"{self.server_url} captures layers {served[:-1]}, the draft needs {self.layer_ids}"
            )

    def _send_all(self, slots, ordered, stop, failure) -> None:
        try:
            asyncio.run(self._send_async(slots, ordered, stop))
        except BaseException as exc:  # noqa: BLE001 - handed to the consuming thread
            failure.append(exc)
        finally:
            ordered.put(_DONE)

    async def _send_async(self, slots, ordered, stop) -> None:
        in_flight = asyncio.Semaphore(self.concurrency)
        loop = asyncio.get_running_loop()
        async with open_session(self.server_url, self.concurrency) as session:
            model = self.model or await served_model(session)
            previous: asyncio.Future | None = None

            async def one(input_ids, loss_mask, wait_for):
                async with in_flight:
                    params = await request_hidden_states(session, model, input_ids.tolist(), "zmq")
                if wait_for is not None:
                    await wait_for  # hand results over in input order
                ordered.put((input_ids, loss_mask, params))

            tasks = []
            for input_ids, loss_mask in self.records:
                await loop.run_in_executor(None, slots.acquire)
                if stop.is_set():
                    break
                previous = asyncio.ensure_future(one(input_ids, loss_mask, previous))
                tasks.append(previous)
                tasks = [t for t in tasks if not t.done() or t.exception()]
                for task in tasks:
                    if task.done() and task.exception():
                        raise task.exception()
            await asyncio.gather(*tasks)


def stream_samples(
    server_url: str,
    records: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    layer_ids: list[int] | None = None,
    buffer_size: int = 16,
) -> StreamingHiddenStates:
    """The trainer's `--hidden-states streaming` source: one pass over `records`."""
    return StreamingHiddenStates(server_url, records, layer_ids=layer_ids, buffer_size=buffer_size)
