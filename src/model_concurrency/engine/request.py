"""One request as the engine model sees it: sizes, progress counters and the timestamps the lab reads.

A request is a plain ``__slots__`` object because a saturated simulated hour creates hundreds of thousands of them;
the engine never runs a process per request. Completion is signalled once, either by the SimPy event returned from
``submit`` (``request.done``) or by a plain callback, and ``finished_reason`` says how it ended.

Progress of a *decoding* request is not updated every step (that would make a step cost O(batch)): the engine
stores ``computed``/``generated`` as of the step ``tick_base`` at which decoding began and derives the current values
from its step counter, materialising them only when the request is preempted, aborted or finished. Read
``generated`` after the request has finished, or use :meth:`Engine.progress` while it runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

__all__ = ["ABORT", "LENGTH", "STOP", "Request", "RequestState"]

STOP = "stop"
LENGTH = "length"
ABORT = "abort"

_ids = itertools.count()


class RequestState:
    """Where a request is; small ints so the hot loop compares cheaply."""

    NEW = 0
    FRONTEND = 1  # tokenising / queued in the API server, not yet visible to the engine
    WAITING = 2
    PREFILL = 3  # running, prompt (or recompute) not fully computed yet
    DECODE = 4
    FINISHED = 5


# The states as module globals for the engine's hot loops (a global read, not a class attribute's, on every
# comparison); engine, bookkeeping, scheduler and topology import them from here.
_NEW = RequestState.NEW
_FRONTEND = RequestState.FRONTEND
_WAITING = RequestState.WAITING
_PREFILL = RequestState.PREFILL
_DECODE = RequestState.DECODE
_FINISHED = RequestState.FINISHED


class Request:
    """A chat completion (``output_tokens`` ≥ 1) or an embedding (``embedding=True``, prefill only).

    ``priority`` is vLLM's request field (an engine run with ``scheduling_policy="priority"`` serves lower values
    first); ``request_class`` names a class whose TTFT and inter-token latency the engine keeps apart
    (:attr:`EngineStats.classes`), e.g. an interactive tenant beside a batch job.

    Timestamps are simulated seconds, ``None`` until reached:

    * ``arrival_time``: submitted to the server (vLLM's TTFT and e2e latency start here);
    * ``queued_time``: entered the engine's waiting queue (after the front-end);
    * ``first_scheduled_time``: first admitted to the running batch (queue time = this − ``queued_time``);
    * ``first_token_time``: the step that completed the prompt ended (for embeddings, the result);
    * ``finish_time``: finished, for whatever ``finished_reason``.
    """

    __slots__ = (
        "arrival_time",
        "blocks",
        "chunk",
        "computed",
        "done",
        "embedding",
        "engine",
        "finish_time",
        "finished_reason",
        "first_scheduled_time",
        "first_token_time",
        "generated",
        "id",
        "last_token_time",
        "num_preemptions",
        "on_finish",
        "output_tokens",
        "prefill_target",
        "priority",
        "prompt_tokens",
        "queued_time",
        "request_class",
        "seq",
        "state",
        "stop_reason",
        "tag",
        "tick_base",
    )

    def __init__(
        self,
        prompt_tokens: int,
        output_tokens: int = 1,
        *,
        embedding: bool = False,
        stop_reason: str = STOP,
        tag: Any = None,
        priority: int = 0,
        request_class: str | None = None,
    ) -> None:
        if prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
        if not embedding and output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1 for a generative request, got {output_tokens}")
        self.id = next(_ids)
        # int() only for what is not already an int (numpy integers, floats): a request is built per call.
        self.prompt_tokens = prompt_tokens if type(prompt_tokens) is int else int(prompt_tokens)
        # An embedding produces no tokens; 0 keeps token counters honest.
        self.output_tokens = 0 if embedding else output_tokens if type(output_tokens) is int else int(output_tokens)
        self.embedding = embedding
        # "stop" (the model ended the answer) or "length" (hit max_tokens): what request_success_total records.
        self.stop_reason = stop_reason
        self.tag = tag  # free for the caller (client id, item index...)
        # vLLM's per-request ``priority`` (lower runs first); only a "priority" engine reads it.
        self.priority = priority
        # A class the engine keeps TTFT and inter-token latency for (EngineStats.classes); None: not tracked.
        self.request_class = request_class
        self.state = _NEW
        self.computed = 0  # tokens whose KV is in the cache
        self.generated = 0  # output tokens sampled so far (kept across preemptions)
        self.prefill_target = self.prompt_tokens  # tokens to (re)compute before the next token is sampled
        self.blocks = 0  # KV blocks held while prefilling (derived from ``computed`` while decoding)
        self.chunk = 0  # tokens scheduled in the current step (prefill only)
        self.tick_base = 0
        self.seq = 0  # admission order in the engine's running list
        self.num_preemptions = 0
        self.engine: Any = None  # the Engine that served it (set on admission to a waiting queue)
        self.done: Any = None  # simpy.Event, created by submit()
        self.on_finish: Callable[[Request], None] | None = None
        self.arrival_time: float | None = None
        self.queued_time: float | None = None
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finish_time: float | None = None
        self.finished_reason: str | None = None

    @property
    def ok(self) -> bool:
        """Finished with a result (not aborted)."""
        return self.finished_reason is not None and self.finished_reason != ABORT

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None or self.queued_time is None:
            return None
        return self.first_scheduled_time - self.queued_time

    @property
    def latency(self) -> float | None:
        """End-to-end latency as the client sees it (arrival at the server to finish)."""
        if self.finish_time is None or self.arrival_time is None:
            return None
        return self.finish_time - self.arrival_time

    def __repr__(self) -> str:
        kind = "embed" if self.embedding else f"out={self.output_tokens}"
        return f"Request(id={self.id}, prompt={self.prompt_tokens}, {kind}, state={self.state})"
