"""Adaptive: AIMD that remembers where the engine saturated, adds gently below it, and probes above it.

(Over 400 lines: the production default's rules, each with the scenario that earned it; the small rebuild is
policies/core.py.)

The lab measured the production AIMD on an idle engine (``ramp``) oscillating 222 ↔ 277 around the engine's
256 sequences: after every cut a +25 % step overshoots again, so the engine queues every other poll and the p99
queue time is several times the oracle's; and with four clients its growth in proportion to the target, like its
cut to the served share, preserves whatever split the clients happen to have (Jain 0.46). TCP met both problems:
slow start until the first loss, a remembered ``W_max`` (CUBIC), and additive increase for fairness (Chiu & Jain:
only equal absolute steps plus proportional cuts converge to equal shares). The engine tells us more than a TCP
sender learns, so the rules are, per poll:

* **capacity change**: the summed KV block count (``vllm:cache_config_info`` over engines, ``kv_num_blocks``)
  changed by more than ``rescale_threshold``: engines were added or lost. Scale the target, ``W_max`` and the
  engine-capacity estimate by that factor at once (the data-parallel case: every engine has the same
  ``max_num_seqs`` and KV cache). This is what lets a GPU added be used within one poll.
* **saturated** (capacity-waiting): ``W_max ← S`` (the served share, what the engine runs for us), record the
  server-wide ``running`` as an engine-capacity sample, ``T' = min(T, decrease_factor × S)``: never a raise.
* **application-limited** (``inflight < near_full × T``): hold, as every growing policy here.
* **first ramp** (no goal yet): the KV cache bounds the engine before it has been driven anywhere.
  ``vllm:cache_config_info`` gives the block count ``N``; KV usage ``u`` over ``running`` gives the blocks a
  sequence holds, ``b = u × N / R``; the cache holds ``kv_high × N / b`` such sequences, and our bound is our
  in-flight plus our share of what is left after ``running``. Alone on the engine (share ``>= jump_share``) the
  target jumps once ``jump_fraction`` of the way to that bound (never less than doubling, never past the bound);
  the first saturated poll cuts to the served share (the rule above), and a poll without saturation makes the
  jump ``W_max``, from which the probes go on. On a shared engine, or without the figures (older vLLM), it
  doubles as TCP's slow start does, still capped by the bound when it is known.
* **slow start**: ``goal = max(W_max, s × C)`` with ``s`` our share of the engine's load and ``C`` the windowed
  maximum of server-wide ``running`` on saturated polls (our share of the engine, which rises when a neighbour
  leaves). Under ``slow_start_below × goal`` (after a metrics outage dropped us to the floor, after a neighbour
  left): ``×slow_start_factor`` a poll, capped at ``decrease_factor × goal``.
* **additive increase**: under the goal, ``+increase_step`` a poll: the same absolute step for every client, so
  unequal clients converge to equal shares, and the overshoot that ends a cycle is one step, not 25 %.
* **probe**: at or above the goal, ``+increase_step × probe_growth^j`` (``j`` = probing polls so far without
  saturation; a step never more than doubles the target): a capacity that has not moved is overshot by a
  request or two, a capacity that grew without a KV-block signal is found in a few polls. Sharing the engine
  (share under ``jump_share``) the probe does not accelerate: the other clients probe too.
* **many clients**: on an engine running more than ``full_step_running`` (1,024) the step shrinks with the square
  root of its size, the same for every client, so that 1,000 clients do not add 1,000 requests a poll to a fleet
  together (``_common.fleet_step``).
* a long idle (``inflight == 0`` for ``idle_s``) forgets what was learnt and restarts slow start.

Second round (docs/results.md, each for a measured miss): preemptions, KV usage ``>= kv_high`` and server-wide
``running`` back at the capacity estimate also count as saturated; every growth is capped where KV usage would
reach ``kv_high``; the first ramp also ends when the engine's ``running`` grew by less than half of our own
increase (the engine is full, we only displace other clients); a probe on a full engine is capped by our share
of its free slots; far below the goal (after the fail-safe's floor) it returns at once to
``restore_fraction × goal`` (beside peers, not from where its own cuts left it: a jump in proportion to each
client's own goal keeps any split). Third (issue 22's generator): a saturated poll is a capacity sample only at the
most sequences the engine has run; a queue below that waits for tokens, not for a sequence slot. Rules and
parameters in full: docs/policies.md.

The cost: a first ramp that may overshoot the engine's sequence limit for one poll (it is invisible until the
engine saturates; only the KV bound caps the jump), cut at once to the served share; and a
cycle of ``(1 − decrease_factor) × S / increase_step`` polls between saturations, below the capacity by at most
``1 − decrease_factor``: on the engines of the lab the knee lies lower still.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from model_concurrency.observation import Observation
from model_concurrency.policies._common import (
    CompletionShare,
    IdleClock,
    app_limited,
    fleet_step,
    one_step_engine,
    own_share,
    pipelined_share,
    sustainable,
)
from model_concurrency.policies.token_budget import TokenBudget, TokenSide

__all__ = ["Adaptive", "KvEstimate"]

# Beside a peer on a one-step engine, the restore to 0.9 x goal runs only under this fraction of our share of the
# knee (``Adaptive._one_step_knee``): the cut that follows a queue lands at 0.9 x the served share, and a restore
# from there went straight back to the queue every other poll (``embed-shared``: 27 % saturated).
KNEE_RESTORE = 0.75


@dataclass(frozen=True, slots=True)
class KvEstimate:
    """The engine's room as its KV cache tells it, on one poll (``Adaptive.kv_estimate``).

    ``blocks_per_sequence``: ``kv_usage × num_gpu_blocks / running``; ``sequences``: how many such sequences fill
    the cache to ``kv_high``; ``bound``: the most our in-flight may grow to, ``inflight + s × (sequences −
    running)`` with ``s`` our share of the engine's load. The share makes N clients that start together add up
    to the engine's room, not N times it."""

    blocks_per_sequence: float
    sequences: float
    bound: float


@dataclass(slots=True)
class Adaptive:
    """Slow start, cut to the served share, add a fixed step back up, probe above it; rescale on KV-block changes.

    Parameters:
        slow_start_factor: growth factor per poll far below the goal (default 2, > 1).
        slow_start_below: slow start while ``target < slow_start_below × goal`` (default 0.85, in [0, 1]; below
            the cut's 0.9, so a cut is followed by the additive climb, not by doubling).
        startup_exit: the first ramp stops doubling when a doubling raised the completion rate by less than this
            factor (default 1.15; 1 disables the test).
        decrease_factor: a saturated poll cuts to ``decrease_factor ×`` the served share (default 0.9, in (0, 1)).
        increase_step: the additive increase, in requests per poll (default 1, > 0); also the first probe step.
        probe_growth: each probing poll without saturation multiplies the probe step by this (default 2, >= 1).
        near_full: grow only when ``inflight ≥ near_full × target`` (default 0.8).
        rescale_threshold: relative change of the summed KV block count treated as engines added or lost
            (default 0.1; ``inf`` disables the rescale).
        window_polls: saturated polls kept as engine-capacity samples (default 10).
        window_s: seconds a capacity sample stays valid (default 600). ``W_max`` does not expire: it moves with
            every saturation and every KV-block rescale, and forgetting it would send a settled client back to
            doubling from its current level, the one overshoot the startup test cannot see coming.
        idle_s: seconds of ``inflight == 0`` after which everything learnt is forgotten (default 120).
        kv_jump: on the first ramp, jump toward the KV bound when alone on the engine (default True).
        jump_share: "alone" means our share of the engine's load is at least this (default 0.9, in [0, 1]): with
            clients that start together, whoever polled first would take the engine (Jain 0.96 -> 0.71 measured).
        jump_fraction: how far toward the KV bound one jump goes (default 0.5, in (0, 1]): the bound is above
            the sequence limit on most engines, and a whole poll spent above that limit queues a poll's worth of
            requests (docs/policies.md, first ramp).
        jump_max_factor: one jump multiplies the target by at most this (default 8, >= ``slow_start_factor``);
            a jump it cut short is followed by another on the next poll. The KV bound says nothing where a
            sequence holds one block (an embedding model: ``bge-m3`` measured a bound of 25,000 on an engine of
            64 sequences, and the jump went to the ceiling).
        step_exponent, full_step_running: on an engine (or fleet) running more than ``full_step_running``
            sequences (default 1,024, > 0) the steady-state step (additive increase and probe) is ``increase_step
            × (full_step_running / running) ** step_exponent`` (default 0.5, in [0, 1]; 0 switches it off),
            unless we are alone on it (share ``>= jump_share``).
            Every client reads the same ``running``, so the steps stay equal (fairness); 1,000 clients on a
            16,384-sequence fleet then add 250 a poll interval together, not 1,000, which had kept it saturated
            31 % of the time (``_common.fleet_step``, docs/scale-out.md).
        fleet_decrease_factor: sharing an engine (or fleet) running more than ``full_step_running``, a saturated
            poll cuts to this × the served share (default 0.93, in (0, 1)), and the steady-state step is scaled by
            ``(1 − fleet_decrease_factor) / (1 − decrease_factor)`` (0.7) so that the fleet saturates as often as
            before. A fleet's saturation is seen only by the clients whose poll falls in it, so each client's target
            is a lottery of cuts; a smaller cut, more of them, spreads the targets less. ``fleet-1000`` on three seeds:
            saturated 11.0 / 11.2 / 10.1 -> 9.2 / 10.0 / 8.2 %, Jain 0.949 / 0.948 / 0.952 -> 0.948 / 0.940 / 0.953
            (0.9: the previous rule; docs/scale-out.md, "The steady state's lottery").
        accelerate_shared: let probes accelerate (``probe_growth``) below ``jump_share`` of the engine too
            (default False). Every client sharing an engine probes; N of them stepping by +1, +2, +4 together
            overshoot it by N times that, and the equal step is what makes clients converge to equal shares.
        one_step_queue: on an engine that completes requests in one step (a pooling model: the last poll
            completed requests and generated no token), a capacity-waiting gauge of up to this many batches
            (``max(running, C)``) does not count as saturated (default 0, >= 0). The pipelined batch itself does
            not show there: vLLM reads ``waiting`` after the step was scheduled, so a batch that arrived during
            the previous step has already been admitted (docs/policies.md, "One-step engines": 0, 0.25 and 1
            measured 6, 18 and 36 % saturated at the same goodput). On such engines the inferred rule
            (``running`` back at ``C``) is off, the cut keeps one batch queued, and the goal and the probes'
            headroom count a second batch.
        one_step_pipeline: apply those rules on one-step engines at all (default True; False: as on a decoder).
        turnover_ramp: pace the first ramp by the turnover of our own calls (default True; False: the rules before
            issue 22's generator, the ``adaptive-v1`` preset). Alone on the engine a poll grows ``slow_start_factor``
            per round trip its interval held (``_ramp_factor``); the completion-rate exit judges a window only over
            a round trip of it (``_turned_over``); and the engine-full exit ignores a ``running`` that fell by more
            than we added (others left). With ``admission_hold``, fuzz seed 22 draws 0-39 (tuned on): goodput
            median 0.973 -> 0.976, p10 0.625 -> 0.651, Jain >= 0.9 on 53 -> 56 % of multi-client draws; seed 31
            draws 0-39 (held out): 0.970 -> 0.974, p10 0.833 -> 0.851, Jain 72 -> 84 % (docs/policies.md).
        admission_hold: on the first ramp, a queue the engine is still taking in (``running`` rose since our
            previous poll by at least what waits) is held, not cut, and ends the ramp (default True; ``_absorbing``).
        felt_queue: cut on capacity-waiting only where it is a wall (default False; the ``adaptive-felt`` preset;
            ``_felt``): the interval's requests waited over ``1 − decrease_factor`` of our round trip, or more than
            that share of ``running`` waits, or ``running`` stands at the most the engine ran (since the last queue,
            or ever), less one step's completions. A request or two waiting a step for prefill tokens while the
            engine runs more with every poll is not cut. Not the default: it buys the generator's goodput p10 and
            costs its p99 share, fairness and ``fleet-1000``'s saturated time (docs/results.md, session 14). False:
            any capacity-waiting request is a saturation; so are pages without the queue-time histogram.
        shared_restore: beside peers (share under ``jump_share``), jump back to ``restore_fraction × goal`` after our
            own cuts too (default False: the additive step from there, ``_own_band``; True: the rule before session
            13).
        shared_fast_ramp: ask for the controller's fast first-ramp polls beside peers too, and grow there once our
            completions since the last growth add up to the window it set (default False; the
            ``adaptive-fast-ramp`` preset: a better worst case, a less fair split, docs/policies.md).
        jump_geometric: the KV jump bisects in log space (default False; the ``adaptive-bisect`` preset): it lands at
            ``T × (B / T) ** jump_fraction`` (the geometric mean of the target and the KV bound at 0.5) instead of
            ``jump_fraction`` of the way, and a jump that ran a poll without a queue is followed by another from
            there while one could still overshoot by more than ``jump_overshoot`` (``_bisecting``). The sequence
            limit lies somewhere between a level that ran clean and the bound, and is not on the page; a jump to
            ``x`` overshoots it by at most ``x / T``, and the geometric mean makes that worst case, ``sqrt(B / T)``,
            the smallest (the arithmetic half-way point's is about ``B / 2T``). ``replica-lost``: 256 -> 829 on a
            knee of 512 before, 194 -> 513 with it (docs/policies.md, "The first ramp's overshoot").
        jump_overshoot: with ``jump_geometric``, the bisection stops (``W_max``, then the probes) once the next
            jump could overshoot the sequence limit by no more than this factor, ``(B / T) ** jump_fraction <=
            jump_overshoot`` (default 1.1, > 1: issue 22's "never more than 10 % past the knee").
    """

    slow_start_factor: float = 2.0
    slow_start_below: float = 0.85
    startup_exit: float = 1.15
    decrease_factor: float = 0.9
    increase_step: float = 1.0
    probe_growth: float = 2.0
    near_full: float = 0.8
    rescale_threshold: float = 0.1
    window_polls: int = 10
    window_s: float = 600.0
    idle_s: float = 120.0
    restore_fraction: float = 0.9
    kv_high: float = 0.92
    cut_on_preemption: bool = True
    probe_headroom: bool = True
    engine_full_exit: bool = True
    full_is_saturated: bool = True
    kv_jump: bool = True
    jump_share: float = 0.9
    jump_fraction: float = 0.5
    token_budget: bool = True  # also answer a token budget (policies/token_budget.py); False: requests only
    token_overcommit: float = 1.0
    tokens: TokenSide = field(init=False, repr=False)
    jump_max_factor: float = 8.0
    step_exponent: float = 0.5
    full_step_running: float = 1024.0
    fleet_decrease_factor: float = 0.93
    accelerate_shared: bool = False
    one_step_queue: float = 0.0
    one_step_pipeline: bool = True
    turnover_ramp: bool = True
    shared_fast_ramp: bool = False
    jump_geometric: bool = False
    jump_overshoot: float = 1.1
    ramp_calls: float = field(default=0.0, init=False)
    ramp_window: float = field(default=0.0, init=False)
    admission_hold: bool = True
    felt_queue: bool = False
    shared_restore: bool = False
    cut_goal: float = field(default=0.0, init=False)
    running_peak: float = field(default=0.0, init=False)
    peak_before: float = field(default=-1.0, init=False)
    queue_peak: float = field(default=-1.0, init=False)
    last_running: float | None = field(default=None, init=False)
    one_step: bool = field(default=False, init=False)
    ramp_grown_at: float | None = field(default=None, init=False)
    w_max: float | None = field(default=None, init=False)
    w_max_time: float = field(default=0.0, init=False)
    probes: int = field(default=0, init=False)
    blocks: float | None = field(default=None, init=False)
    idle: IdleClock = field(default_factory=IdleClock, init=False)
    jump_to: float | None = field(default=None, init=False)
    held: bool = field(default=False, init=False)
    ramp_sample: bool = field(default=False, init=False)
    alone: bool = field(default=True, init=False)
    completions: CompletionShare = field(default_factory=CompletionShare, init=False)
    cut_to: float = field(default=0.0, init=False)
    last_time: float | None = field(default=None, init=False)
    startup_rate: float | None = field(default=None, init=False)
    startup_load: tuple[float, float] | None = field(default=None, init=False)
    samples: deque[tuple[float, float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.slow_start_factor > 1:
            raise ValueError(f"slow_start_factor must be > 1, got {self.slow_start_factor}")
        if not 0 <= self.slow_start_below <= 1:
            raise ValueError(f"slow_start_below must be in [0, 1], got {self.slow_start_below}")
        if not self.startup_exit >= 1:
            raise ValueError(f"startup_exit must be >= 1, got {self.startup_exit}")
        if not 0 < self.decrease_factor < 1:
            raise ValueError(f"decrease_factor must be in (0, 1), got {self.decrease_factor}")
        if not (self.increase_step > 0 and math.isfinite(self.increase_step)):
            raise ValueError(f"increase_step must be > 0, got {self.increase_step}")
        if not self.probe_growth >= 1:
            raise ValueError(f"probe_growth must be >= 1, got {self.probe_growth}")
        if not 0 <= self.near_full <= 1:
            raise ValueError(f"near_full must be in [0, 1], got {self.near_full}")
        if not self.rescale_threshold > 0:
            raise ValueError(f"rescale_threshold must be > 0, got {self.rescale_threshold}")
        if not (isinstance(self.window_polls, int) and self.window_polls >= 1):
            raise ValueError(f"window_polls must be an int >= 1, got {self.window_polls!r}")
        if not (self.window_s > 0 and self.idle_s >= 0):
            raise ValueError("window_s must be > 0 and idle_s >= 0")
        if not 0 <= self.restore_fraction <= 1:
            raise ValueError(f"restore_fraction must be in [0, 1], got {self.restore_fraction}")
        if not 0 < self.kv_high <= 1:
            raise ValueError(f"kv_high must be in (0, 1], got {self.kv_high}")
        if not 0 <= self.jump_share <= 1:
            raise ValueError(f"jump_share must be in [0, 1], got {self.jump_share}")
        if not 0 < self.jump_fraction <= 1:
            raise ValueError(f"jump_fraction must be in (0, 1], got {self.jump_fraction}")
        if not self.jump_max_factor >= self.slow_start_factor:
            raise ValueError(
                f"jump_max_factor must be >= slow_start_factor ({self.slow_start_factor}), got {self.jump_max_factor}"
            )
        if not 0 <= self.step_exponent <= 1:
            raise ValueError(f"step_exponent must be in [0, 1], got {self.step_exponent}")
        if not self.full_step_running > 0:
            raise ValueError(f"full_step_running must be > 0, got {self.full_step_running}")
        if not 0 < self.fleet_decrease_factor < 1:
            raise ValueError(f"fleet_decrease_factor must be in (0, 1), got {self.fleet_decrease_factor}")
        if not self.jump_overshoot > 1:
            raise ValueError(f"jump_overshoot must be > 1, got {self.jump_overshoot}")
        if not self.one_step_queue >= 0:
            raise ValueError(f"one_step_queue must be >= 0, got {self.one_step_queue}")
        self.samples = deque(maxlen=self.window_polls)
        self.tokens = TokenSide(TokenBudget(self.kv_high, self.token_overcommit), self.near_full)

    # -- what has been learnt ---------------------------------------------------------------------------------
    def capacity(self, now: float) -> float | None:
        """The engine's concurrency capacity (server-wide running while saturated), windowed maximum."""
        while len(self.samples) > 1 and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()
        return max(r for _, r in self.samples) if self.samples else None

    def goal(self, obs: Observation) -> float | None:
        """Where the engine last ran out for us: ``W_max``, or our share of the engine's capacity if larger."""
        capacity = self.capacity(obs.time)
        share = self._share(obs) * self._batches() * capacity if capacity is not None else None
        known = [v for v in (self.w_max, share) if v is not None and v > 0]
        return max(known) if known else None

    def _track_idle(self, obs: Observation) -> None:
        if self.idle.idle_past(obs, self.idle_s):
            self.w_max, self.probes, self.held, self.cut_to, self.ramp_grown_at = None, 0, False, 0.0, None
            self.samples.clear()
            self.running_peak, self.queue_peak = 0.0, -1.0

    def _rescale(self, obs: Observation) -> float | None:
        """The factor by which the summed KV block count changed since the last poll that reported it."""
        blocks = obs.kv_num_blocks
        if not blocks or blocks <= 0:
            return None
        before, self.blocks = self.blocks, float(blocks)
        if before is None:
            return None
        factor = blocks / before
        return factor if abs(math.log(factor)) > math.log1p(self.rescale_threshold) else None

    def _saturated(self, obs: Observation, capacity: float | None) -> str | None:
        """Why this poll counts as saturated, or None.

        ``"engine"``: capacity-waiting, or (KV-bound engines) preemptions since the last poll or KV usage at
        ``kv_high``, the engine's own word. ``"inferred"``: ``running`` is back at ``capacity``, learnt earlier.
        On a one-step engine a queue of up to ``one_step_queue`` batches is no overload, and a full batch is the
        aim, so the inferred rule does not apply."""
        pipelining = self.pipelining
        tolerated = self.one_step_queue * self._batch(obs, capacity) if pipelining else 0.0
        if self.cut_on_preemption and obs.preemptions > 0:
            return "engine"
        if obs.waiting_capacity > tolerated and (pipelining or self._felt(obs)):
            return "engine"
        kv = obs.kv_cache_usage
        if self.kv_high < 1 and kv is not None and kv >= self.kv_high:
            return "engine"
        if pipelining:
            return None
        if self.full_is_saturated and capacity is not None and obs.running > 0 and abs(obs.running - capacity) <= 0.5:
            # Only from a sample of the window: the newest never expires as a bound on the goal, but a reading that
            # has not been seen again for ``window_s`` (an hour's wedged page, whose first poll recorded it at the
            # peak) is no wall to cut at.
            fresh = obs.time - self.samples[-1][0] <= self.window_s
            return "inferred" if fresh else None
        return None

    def _felt(self, obs: Observation) -> bool:
        """With ``felt_queue``, the queue is a wall, not a wait for prefill tokens: it cost the interval's requests a
        wait worth a cut (the mean queue time of those that started over ``1 − decrease_factor`` of our round trip,
        as in ``_ramp_factor``), or it is over that share of ``running`` (a wall whose waiters have not started, so
        their wait is not in the histogram yet), or ``running`` stands at the most the engine ran, less one step's
        completions (pinned at a sequence limit: ever, or since the previous queue within ``1 − decrease_factor``
        of it, as a fleet's engines each free a slot or two between steps). Or nothing says (no figures).

        One long prompt waiting a step for prefill tokens shows on the gauge at every poll of a prefill-heavy
        engine while the engine still runs more with every request added: cut on it, ``fuzz-43-0027`` (2 clients,
        19 % of prompts 8,400 tokens long) sat at 30 running of a knee of 224 (0.66 of the oracle). Generator, 200
        draws of seeds 41 and 43 against the default: goodput p10 0.921 -> 0.941 and 0.925 -> 0.944, 50 draws gain
        over a point and 1 loses one; the p99 share 80 -> 76 % and 83 -> 78 %, Jain 84 -> 79 % and 73 -> 72 %: first
        ramps that double past a limit they reach for the first time. Hence a preset, not the default
        (docs/results.md, session 14). Not on a one-step engine: there the queue is the pipelined batch, and
        ``one_step_queue`` says how much of it is tolerated."""
        if not self.felt_queue:
            return True
        waited = self._waited(obs)
        if waited is None or not obs.started:
            return True
        share = 1 - self.decrease_factor
        slack = self._step_slack(obs)
        since, self.queue_peak = self.queue_peak, self.running_peak
        if waited or obs.waiting_capacity > share * obs.running:
            return True
        if self.peak_before >= 0 and self.peak_before - slack <= obs.running <= self.peak_before + 0.5:
            return True
        return since >= 0 and self.running_peak <= since + slack and obs.running >= self.decrease_factor * since

    def _waited(self, obs: Observation) -> bool | None:
        """The interval's requests waited a queue worth a cut: their mean queue time over ``1 − decrease_factor`` of
        our mean round trip (the share a cut takes off). None when either figure is missing."""
        latency, queued = obs.client_latency_mean_s, obs.queue_time_mean_s
        if latency is None or queued is None:
            return None
        return queued > (1 - self.decrease_factor) * latency

    @staticmethod
    def _step_slack(obs: Observation) -> float:
        """How far under its most a full engine's ``running`` may read: the sequences one step finishes (a page is
        read between steps, before their slots are filled again), ``running × completed / generation_tokens`` over
        the interval (one completion per its mean output length), and at least half a sequence (rounding)."""
        completed, tokens = obs.completed, obs.generation_tokens
        if completed is None or tokens is None or not tokens > 0 or not completed >= 0:
            return 0.5
        return max(0.5, obs.running * completed / tokens)

    @property
    def pipelining(self) -> bool:
        """The engine completes requests in one step (learnt from its counters) and the one-step rules are on.

        Alone or beside a peer: the goal and the probes' headroom are our share of two batches, and the share is
        read from the engine's completions (``_share``), so N clients' goals add up to the engine's two batches.
        Read from the in-flight share, as until session 6, it was about 1 beside a peer (a batch on the wire),
        each client kept its own second batch queued, and ``scale_out.py`` was saturated 56 % of the time; with
        the decoder's rules there instead (no pipelining beside a peer) the run was 1.2x the best static."""
        return self.one_step_pipeline and self.one_step

    def _share(self, obs: Observation) -> float:
        """Our share of the engine: of its completions on a one-step engine (``CompletionShare``: there the
        in-flight share reads about 1 beside a peer), else of its load (``own_share``)."""
        completed = self.completions.share
        if self.one_step and completed is not None:
            return completed
        return own_share(obs)

    def _one_step_knee(self, obs: Observation) -> float | None:
        """Beside a peer, our share of a one-step engine's knee, two batches of ``C``, once ``C`` is known; else None.

        ``C`` is the engine's ``max_num_seqs`` (``running`` on a saturated poll), and throughput is flat from
        about one batch and a half up to two. A probe past our share only queues, and every client beside us
        probes too. A raised limit shows as ``running`` above ``C``, which clears the samples, and the probes
        resume. Alone (share ``>= jump_share``) the probes stay: a client alone is what finds a raised limit
        fastest, and the single-client figures (``embed-batch``, ``live_peers.py``) are kept as they were."""
        capacity = self.capacity(obs.time)
        share = self._share(obs)
        if not self.pipelining or capacity is None or share >= self.jump_share:
            return None
        return share * 2.0 * capacity

    def _batches(self) -> float:
        """Batches the engine holds at its knee: 2 on a one-step engine (one running, one queued), else 1."""
        return 2.0 if self.pipelining else 1.0

    @staticmethod
    def _batch(obs: Observation, capacity: float | None) -> float:
        """One engine step's batch: the capacity estimate when known (``running`` may catch a part-empty step)."""
        return max(obs.running, capacity or 0.0)

    def _absorbing(self, obs: Observation, risen: float | None) -> bool:
        """On the first ramp, a queue the engine is still taking in: hold, do not cut (``admission_hold``).

        The engine's ``running`` rose since our previous poll by at least what now waits, with no preemption and
        the KV cache below ``kv_high``: a burst being admitted over several steps (its per-step token budget), most
        often another client's ramp step, not a wall. Cut to the served share there, the clients that happened to
        poll during a peer's admission shrank while the peer, polling between bursts, grew on: ``fuzz-22-0013``
        (4 clients, 2 x 507 sequences) cut one client 16 -> 12 -> 7 at ``running`` 147 and 347 of a knee near
        800, and the split ended 696 / 72 / 41 / 6. The hold ends the ramp all the same (``_requests``): a client
        left ramping doubled again on the next poll that caught no queue (``multi-client``: 64 -> 128 -> 256 on
        256 sequences, Jain 0.77). Only while ramping: held in the steady state too, a client kept its share
        while its peers cut on the same queue (``multi-client-32`` Jain 0.93 -> 0.89). At a wall ``running``
        stops rising, and the next poll cuts. Not on a one-step engine, whose queue is a pipelined batch."""
        if not self.admission_hold or not self.ramping or risen is None or self.pipelining or obs.preemptions > 0:
            return False
        kv = obs.kv_cache_usage
        if kv is not None and kv >= self.kv_high:
            return False
        return 0 < obs.waiting_capacity <= risen

    def _admitting(self, obs: Observation) -> bool:
        """The first ramp's step found the engine still taking it in: hold the target for one more poll.

        An engine admits a burst over several steps (its per-step token budget), so a fast poll soon after a
        jump can see capacity-waiting while ``running`` is still climbing toward the limit. Cutting to that
        ``running`` would record a capacity the engine does not have (measured on ``ramp``: a 2 s poll saw 203 of
        256 running, and the target settled at 0.77x the knee). If ``running`` rose by at least half of our
        growth since the previous poll, the engine was absorbing it: wait one poll. A full engine shows a flat
        ``running`` then, and the saturated rule cuts as usual. At most once per first ramp, and only on the
        jump's path (``wants_fast_polls``), where the next poll comes soon; a doubling ramp shared with other
        clients cuts at once."""
        load = self.startup_load
        if not self.wants_fast_polls or load is None or self.held:
            return False
        self.held = True  # one hold per first ramp at most
        self.startup_load = (float(obs.inflight), obs.running)
        grew = obs.inflight - load[0]
        return grew > 0 and obs.running - load[1] >= 0.5 * grew

    def _rate(self, obs: Observation) -> float | None:
        """Our own completions per second since the previous poll, or None on the first poll."""
        before, self.last_time = self.last_time, obs.time
        if before is None or obs.time <= before:
            return None
        return obs.client_calls / (obs.time - before)

    # -- the first ramp ---------------------------------------------------------------------------------------
    @property
    def ramping(self) -> bool:
        """In the first ramp: nothing learnt yet about where the engine runs out (no ``W_max``, no capacity sample).

        A controller that polls sooner while its policy ramps reads this; it turns False at the first saturated
        poll or full-pipe exit, and True again after a long idle forgets what was learnt."""
        return self.w_max is None and not self.samples

    @property
    def wants_fast_polls(self) -> bool:
        """The controller's faster first-ramp polls (``MODEL_CONCURRENCY_RAMP_POLL_DIVISOR``) help here.

        Only on the jump's path: ramping, alone on the engine (last poll's share ``>= jump_share``) and with the
        KV block count seen. Sharing an engine, the ramp is doubling, which leaves clients that start together
        equal only while they grow at the same cadence (2 s polls measured ``multi-client`` p99 queue 0.099 ->
        0.525 s, ``multi-client-32`` Jain 0.90 -> 0.78); and without the figures the doubling's rate test
        would compare 2 s windows, shorter than a request."""
        return self.ramping and self.kv_jump and (self.alone or self.shared_fast_ramp) and self.blocks is not None

    def kv_estimate(self, obs: Observation) -> KvEstimate | None:
        """What the KV cache says about the engine's room, or None without the figures (then: doubling).

        Needs the block count (``vllm:cache_config_info``: a fixed, known pool), a KV usage above zero and
        sequences running. Usage is the most loaded engine's, running is summed: on several engines the
        blocks per sequence come out high and the estimate low, the safe side."""
        blocks, kv = obs.kv_num_blocks, obs.kv_cache_usage
        if not blocks or blocks <= 0 or kv is None or not 0 < kv <= 1 or not 0 < obs.running < math.inf:
            return None
        if obs.inflight <= 0:
            return None
        # A running sequence holds at least one block: less means gauges read at different instants (or a
        # usage of 1e-308), and the cache cannot hold more sequences than it has blocks.
        per_sequence = max(1.0, kv * blocks / obs.running)
        sequences = self.kv_high * blocks / per_sequence
        bound = obs.inflight + own_share(obs) * max(0.0, sequences - obs.running)
        return KvEstimate(blocks_per_sequence=per_sequence, sequences=sequences, bound=bound)

    def _first_ramp(self, target: float, obs: Observation, rate: float | None) -> float:
        """Alone on the engine, jump once toward the KV bound; otherwise, or without the figures, double.

        The full-pipe exits of ``_startup`` still run first: a ramp they end becomes ``W_max + increase_step``.
        A jump that ran a poll without saturating becomes ``W_max`` and the probes take over (a second jump or a
        doubling from there would overshoot the sequence limit, which lies somewhere below the KV bound, for a
        whole poll). With an estimate no answer exceeds ``max(target, bound)``; the first saturated poll cuts
        to the served share (the saturated rule)."""
        if self._blind(obs):
            return target
        answer = self._ramp_step(target, obs, rate)
        if answer > target:
            self.ramp_grown_at, self.ramp_calls, self.ramp_window = obs.time, 0.0, answer
        return answer

    def _blind(self, obs: Observation) -> bool:
        """Our last first-ramp growth cannot have shown on the engine yet: hold. On a one-step engine, or one
        that generated no token since the previous poll (whose kind is still unknown: nothing completed yet).

        A one-step engine's clients poll about once a request's round trip (12.5 ms in ``scale_out.py``), and
        the controller's faster first-ramp polls come sooner still. A doubling decided before the previous one
        came back doubles blind: on ``embed-shared-start`` (5 ms on the wire) one client went 32 -> 64 -> 128 on
        three polls 2 ms apart, on an engine of 32, while its peer held 8 (72 waiting, Jain 0.58 over the first
        second). So grow only once our calls completed since the last growth and their mean round trip has
        passed since it. A decoder's requests outlast the ramp's polls by design (seconds of decode), and its
        jump and doubling are judged by the KV cache instead: unchanged there, as on a page without the token
        counter (``one_step_pipeline`` False switches this off too)."""
        grown_at = self.ramp_grown_at
        if grown_at is not None and self.shared_fast_ramp and not self.alone and not self.one_step:
            # Beside peers on the fast polls: grow once our calls since the last growth add up to the window it
            # set (one round trip of it: the engine took it), as TCP's slow start doubles once a round trip.
            return self.ramp_calls < self.ramp_window
        if grown_at is None or not self.one_step_pipeline or not (self.one_step or obs.generation_tokens == 0):
            return False
        latency = obs.client_latency_mean_s
        return obs.client_calls <= 0 or (latency is not None and obs.time - grown_at < latency)

    def _ramp_step(self, target: float, obs: Observation, rate: float | None) -> float:
        grown = self._startup(target, obs, rate)
        estimate, (jumped, self.jump_to) = self.kv_estimate(obs), (self.jump_to, None)
        if estimate is None:
            return grown
        if self.ramping and jumped is not None and target >= jumped - 1 and not self._bisecting(target, estimate):
            # We still stand at the jump (within the controller's rounding) and it ran a poll without
            # saturating: a floor under the capacity. The rest is unknown (the sequence limit is not on the
            # page), so probe above it instead of doubling past it. A target moved since (a cut, the
            # fail-safe's floor, the ceiling) proves nothing, and the ramp goes on as if no jump had happened.
            self.w_max, self.w_max_time, self.probes = target, obs.time, 0
            self.startup_rate = self.startup_load = None
            return min(target + self.increase_step, max(target, estimate.bound))
        if self.ramping and self.kv_jump and own_share(obs) >= self.jump_share and not self.one_step:
            # Not on a one-step engine: a pooling model's sequence holds one block, so the KV bound (25,000 on a
            # bge-m3 of 64 sequences) says nothing about its sequence limit, and a jump lands 8x past it.
            jump = self._jump(target, estimate)
            step = min(jump, self.jump_max_factor * target)
            # Bisecting, the jump is also the most the ramp may take: a doubling (or the turnover's 2^k) past the
            # geometric point would overshoot by more than the bisection promises.
            if step > grown or (self.jump_geometric and step > target):
                grown = step
                if step >= jump:  # landed where the bound said: the next poll judges the jump
                    self.jump_to = min(grown, max(target, estimate.bound))
        return min(grown, max(target, estimate.bound))

    def _jump(self, target: float, estimate: KvEstimate) -> float:
        """Where the KV jump lands: ``jump_fraction`` of the way to the bound ``B``, or with ``jump_geometric`` that
        fraction of the way in log space, ``T × (B / T) ** jump_fraction`` (never below ``T``).

        The sequence limit lies anywhere between the level that ran clean and the bound, and shows only when it is
        passed; a jump to ``x`` overshoots it by at most ``x / T``. The half-way point's worst case is about
        ``B / 2T`` (``replica-lost``: 256 -> 829 on a knee of 512, ``fuzz-22-0032``: 24 -> 192 on 124); the
        geometric mean's, ``sqrt(B / T)``, is the smallest any single landing point can promise."""
        bound = estimate.bound
        if not self.jump_geometric:
            return target + self.jump_fraction * (bound - target)
        if not (target > 0 and bound > target):
            return target
        return target * math.pow(bound / target, self.jump_fraction)

    def _bisecting(self, target: float, estimate: KvEstimate) -> bool:
        """With ``jump_geometric``, a jump that ran a poll without a queue is followed by another: the level it
        reached is the new floor of the interval the limit lies in, and the next jump halves it again (in log
        space). Only while that jump could overshoot by more than ``jump_overshoot``; then the probes take over.

        One arithmetic jump and then the probes was the rule before: a second half-way jump from a clean level
        overshot a limit lying between it and the bound for a whole poll (a 384-sequence ``ramp``: p99 queue 10.8x
        the oracle's). Geometric jumps land nearer, so ending the ramp after the first left the probes to climb
        from far below (``fuzz-22-0044``: 2 -> 15, then +1, +2, +4 toward a limit of 684: 0.18 of the oracle)."""
        if not self.jump_geometric or not target > 0:
            return False
        return math.pow(estimate.bound / target, self.jump_fraction) > self.jump_overshoot

    def _startup(self, target: float, obs: Observation, rate: float | None) -> float:
        """The first ramp: double, unless the last doubling bought too little (the pipe is full).

        Two full-pipe tests: our completion rate rose by less than ``startup_exit`` (alone on the engine), or the
        engine's ``running`` rose by less than half of our own increase in flight (the engine is full and our
        growth only displaced other clients, whose own rates fall while ours rises)."""
        previous, self.startup_rate = self.startup_rate, rate
        load, self.startup_load = self.startup_load, (float(obs.inflight), obs.running)
        if (
            previous is not None
            and rate is not None
            and previous > 0
            and rate < self.startup_exit * previous
            and self._turned_over(obs, load)
        ):
            self.w_max, self.w_max_time, self.probes = target, obs.time, 0
            self.startup_rate = self.startup_load = None
            return target + self.increase_step
        if self.engine_full_exit and load is not None and not self.pipelining:
            grew = obs.inflight - load[0]
            risen = obs.running - load[1]
            # A running that fell by more than we added is others leaving (or capacity changing), not a full
            # engine displacing them: the test says nothing then (fuzz-22-0015: a tenant left, running 41 -> 12,
            # and the ramp ended at 2 where the knee was 60).
            if grew > 0 and risen < 0.5 * grew and not (self.turnover_ramp and risen < -grew):
                before = max(target / self.slow_start_factor, target - grew + max(0.0, obs.running - load[1]))
                self.w_max, self.w_max_time, self.probes = before, obs.time, 0
                self.startup_rate = self.startup_load = None
                return before + self.increase_step
        return max(target * self._ramp_factor(obs), target + self.increase_step)

    def _turned_over(self, obs: Observation, load: tuple[float, float] | None) -> bool:
        """The interval's completions add up to at least the window we held at the previous poll (``load``): one
        round trip of it, so the completion rate says what that window buys (``turnover_ramp``; always True with
        it off, or when the previous window is unknown).

        Over a poll shorter than a call, the rate test compared the handful of completions that happened to fall
        in each interval: ``fuzz-22-0033`` (5 s polls, calls of ~8 s) ended three of six clients' ramps at 20 on
        4 completions against 6, and the split stayed 111 / 27 / 25 / 26 / 15 / 8 for the rest of the run."""
        if not self.turnover_ramp or load is None:
            return True
        return obs.client_calls >= load[0]

    def _ramp_factor(self, obs: Observation) -> float:
        """The first ramp's growth this poll alone on the engine: ``slow_start_factor`` per round trip of our calls.

        TCP's slow start doubles per round trip, clocked by its acknowledgements; a poll is not a round trip. A
        poll every 36 s over calls of 3 s doubled once where TCP would have doubled twelve times, and a run of a
        few polls ended below the knee (fuzz seed 22: draws with polls >= 25 s and floors <= 4 had a median of
        0.754 of the oracle's goodput). So the ramp counts the round trips the interval held, ``k = calls /
        inflight_mean`` (how many times our window turned over), and grows ``slow_start_factor ** k``, at most
        ``jump_max_factor`` in one poll (the bound on one blind jump), never less than one factor. Only over an
        interval the engine took without queueing us (the mean queue time under ``1 − decrease_factor`` of our
        round trip: a queue worth a cut), and only alone on the engine (share ``>= jump_share``): beside peers
        whoever polled first multiplied by 8 while the others still sat at their floors, and took the engine
        (fuzz seed 22, draws 0-39: Jain >= 0.9 on 62 % of multi-client draws with one factor a poll there, 44 %
        with up to 4, 44 % with up to 8). ``turnover_ramp`` False: one factor a poll."""
        if not self.turnover_ramp or own_share(obs) < self.jump_share:
            return self.slow_start_factor
        window = self._window(obs)
        if window <= 0 or obs.client_calls <= 0:
            return self.slow_start_factor
        if self._waited(obs):
            return self.slow_start_factor
        rounds = min(obs.client_calls / window, math.log(self.jump_max_factor, self.slow_start_factor))
        return max(self.slow_start_factor, math.pow(self.slow_start_factor, rounds))

    @staticmethod
    def _window(obs: Observation) -> float:
        """Our mean window over the interval (the in-flight count at the poll when nobody measured the mean)."""
        return obs.inflight_mean if obs.inflight_mean is not None else float(obs.inflight)

    # -- the rule --------------------------------------------------------------------------------------------
    def next_target(self, target: float, obs: Observation) -> float:
        """The request target (the rules above), with the token budget riding along (weighted calls obey it)."""
        if not self.token_budget:
            return self._requests(target, obs)
        return self.tokens.answer(self._requests(target, self.tokens.view(obs)), obs)

    def _requests(self, target: float, obs: Observation) -> float:
        self._track_idle(obs)
        one_step = one_step_engine(obs)
        if one_step is not None:
            self.one_step = one_step
        completed = self.completions.update(obs, self._batch(obs, self.capacity(obs.time)))
        if self.one_step and completed is not None:
            self.alone = completed >= self.jump_share
        elif obs.inflight > 0:
            self.alone = own_share(obs) >= self.jump_share
        ramp_sample, self.ramp_sample = self.ramp_sample, False
        rate = self._rate(obs)
        self.ramp_calls += obs.client_calls
        before, self.last_running = self.last_running, obs.running
        risen = obs.running - before if before is not None else None
        factor = self._rescale(obs)
        if factor is not None:
            if self.w_max is not None:
                self.w_max *= factor
            self.samples = deque(((t, r * factor) for t, r in self.samples), maxlen=self.window_polls)
            self.running_peak *= factor
            self.queue_peak = -1.0
            self.probes = 0
            if factor < 1 or not app_limited(obs, target, self.near_full):
                return target * factor
        capacity = self.capacity(obs.time)
        if capacity is not None and obs.running > capacity + 0.5:
            # The engine runs more than it ever did while saturated: its limit rose without a KV-block change (a
            # raised max_num_seqs), or a sample caught it mid-admission. Either way the samples are stale, and the
            # engine-full rule must not cut where the engine used to stop.
            self.samples.clear()
            if ramp_sample and obs.running > 2 * capacity:
                # The sample was the cut that ended our first ramp, on the previous poll, on a shared engine, and
                # the engine now runs twice that without it: a read taken while the engine was still admitting a
                # burst, and the served share read with it is as wrong. 1,000 clients starting together put 4,000
                # prompts on the fleet at once; a client polling while the fleet admitted them recorded 1,875
                # running of 16,384 and a share of 3 under its floor of 4, and then climbed from the floor at the
                # fleet's quarter step while the others doubled (docs/scale-out.md, "Where the fleet's unfairness
                # was made"). The ramp goes on. Twice, not any rise: a fleet's running wanders by a few sequences
                # a poll, and a ramp restarted on that doubled into the fleet again (saturated 9.7 -> 12.5 %).
                self.w_max, self.probes = None, 0
            capacity = None
            if self.pipelining and self.w_max is not None and self.w_max > target:
                # W_max too was where the old limit stopped us: probe up from here, or the additive step's one
                # request a poll would climb to it first (live: 40 polls at ~100 on an engine raised to 256).
                self.w_max, self.w_max_time, self.probes = target, obs.time, 0
        self.peak_before = self.running_peak
        self.running_peak = max(self.running_peak, obs.running)
        why = self._saturated(obs, capacity)
        if why is not None:
            if self._admitting(obs):
                # Held where the step took us: if the next poll finds it unsaturated, that is a jump that ran a poll
                # (W_max, then probes), not a ramp to go on doubling. Left to the completion-rate test, whether a
                # 2 s window held more completions than the previous one, it doubled past the engine on half of
                # the jittered schedules (``ramp``: p99 queue 0.1 -> 2.0 s; docs/scale-out.md, jitter).
                self.jump_to = target
                return target
            if self._absorbing(obs, risen):
                if self.ramping:
                    # Not a wall we can see, but not room to double into either: the ramp ends here (W_max, then
                    # the additive climb), as it would have ended on a cut, without the cut. Left ramping, a held
                    # client doubled again on the next poll that caught no queue: on ``multi-client`` (4 clients,
                    # 256 sequences) one went 64 -> 128 -> 256 and the split fell to Jain 0.77.
                    self.w_max, self.w_max_time, self.probes = target, obs.time, 0
                    self.startup_rate = self.startup_load = None
                return target
            served = pipelined_share(obs, self._batch(obs, capacity)) if self.pipelining else sustainable(obs)
            ramping = self.ramping
            if why == "engine" and obs.running >= self.running_peak - 0.5:
                # Only the engine's own word is a capacity sample. A cut inferred from an earlier sample must not
                # re-record it: one sample taken while the engine was still admitting a burst would then keep
                # the target under the true limit for as long as the window lasts.
                # And only at the most sequences the engine has run (since the last idle or KV-block change): a
                # queue below that is a wait for prefill tokens or KV blocks, not for a sequence slot. Recorded as
                # the capacity, it made every return to that level an inferred saturation: on ``fuzz-41-0187``
                # (3,400-token prompts, knee 35) one long prompt waiting a step at 12 running held the target at
                # 10-12 for the whole run (0.75 of the oracle; 0.85 without such samples). Generator, 200 draws of
                # seeds 41 and 43: 29 draws gain over a point of goodput, 10 lose one, no p99 share lost; Jain moved
                # both ways (74 -> 81 % and 76 -> 74 % of multi-client draws), noise (docs/results.md, session 12).
                self.samples.append((obs.time, obs.running))
            self.probes, self.startup_rate, self.startup_load = 0, None, None
            if served is None:  # none of the queue is ours
                return target
            self.w_max, self.w_max_time = served, obs.time
            self.ramp_sample = ramping and why == "engine" and not self.alone
            self.cut_to = min(target, self._decrease(obs) * served)
            self.cut_goal = self.goal(obs) or 0.0
            return self.cut_to
        if app_limited(obs, target, self.near_full):
            self.startup_rate = self.startup_load = None  # an application-limited poll says nothing
            return target
        return min(self._grow(target, obs, rate), max(target, self._kv_cap(obs)))

    def _own_band(self, target: float, goal: float) -> bool:
        """Beside peers, our own cuts put us under the slow-start band and no room appeared since (the goal rose by
        less than the band, ``1 / slow_start_below``): climb by the additive step, not back to ``restore_fraction ×
        goal`` at once (``shared_restore`` False).

        That jump is proportional to our own goal, and the goal holds our share of the engine, ``s × C``: after the
        same queue cut every client, each jumped back to 0.9 of its own share, and the split the first ramp made was
        kept for the run (Chiu & Jain: only equal absolute steps converge). ``fuzz-41-0166`` (7 clients) Jain 0.35 ->
        0.91, ``fuzz-41-0107`` (6) 0.41 -> 0.80. Over both generator seeds' 400 draws, 22 multi-client draws gain
        more than 0.05 of Jain and 6 lose it, 16 lose more than a point of goodput and 1 gains one, with the median
        and p10 unchanged (docs/results.md, session 13). Alone on the engine there is no split to keep, and the jump
        recovers from cuts on waits for prefill tokens (without it, ``fuzz-41-0135`` 0.92 -> 0.74). Below where our
        own cut left us (the fail-safe's floor, an outage), or when room appeared (a neighbour left, engines added),
        the restore applies as before. Not on a one-step engine, whose knee rule restores from under 3/4 of the knee
        by design (``_grow``): there the bundled ``embed-shared-start`` went 0.970 -> 0.965 of the oracle (Jain 0.64
        -> 0.85), under the bundled goal of 0.97."""
        if self.shared_restore or self.cut_to <= 0 or self.alone or self.pipelining:
            return False
        return target >= self.cut_to - 0.5 and goal * self.slow_start_below <= self.cut_goal

    def _kv_cap(self, obs: Observation) -> float:
        """The most our in-flight count may grow to before KV usage (proportional to load) reaches ``kv_high``."""
        kv = obs.kv_cache_usage
        if self.kv_high >= 1 or kv is None or not kv > 0:
            return math.inf
        return obs.inflight * self.kv_high / kv

    def _increase(self, obs: Observation) -> float:
        """The steady-state step: ``increase_step``, less on an engine running more than ``full_step_running``
        that we share (alone on it, share ``>= jump_share``, nobody steps with us)."""
        if self._share(obs) >= self.jump_share:
            return self.increase_step
        step = fleet_step(self.increase_step, obs, self.full_step_running, self.step_exponent)
        if self._in_fleet(obs):
            step *= (1 - self.fleet_decrease_factor) / (1 - self.decrease_factor)
        return step

    def _in_fleet(self, obs: Observation) -> bool:
        """Sharing an engine (or fleet) running more than ``full_step_running``: the gentler cut and step apply."""
        return self._share(obs) < self.jump_share and obs.running > self.full_step_running

    def _decrease(self, obs: Observation) -> float:
        """The cut's factor: ``fleet_decrease_factor`` on a big shared fleet, else ``decrease_factor``.

        With many clients each saturation is cut by the few whose poll falls in it: over a run a client's target
        is the sum of the cuts it drew, and the spread of that sum grows with the size of each cut (``1 − β``) at
        a given saturation frequency. A smaller cut with a step smaller in proportion (``_increase``) keeps the
        frequency and narrows the spread (docs/scale-out.md)."""
        return self.fleet_decrease_factor if self._in_fleet(obs) else self.decrease_factor

    def _grow(self, target: float, obs: Observation, rate: float | None) -> float:
        goal = self.goal(obs)
        if goal is None:
            return self._first_ramp(target, obs, rate)
        knee = self._one_step_knee(obs)
        if knee is not None and target >= max(self.cut_to, KNEE_RESTORE * knee):
            # A one-step engine whose knee is known: no probe past our share of it (it only queues), and at it a
            # cut as on saturation, before a queue shows. Every client beside us reads the same total there (its
            # in-flight over its share), so the cuts come together and stay proportional, and the equal steps
            # converge the shares (Chiu & Jain). The restore to 0.9 x goal only from far below (a cut on a queue
            # that showed under the knee is the engine's word, the knee only an estimate), or when something
            # other than our own cut put us there (the fail-safe's floor).
            self.probes = 0
            if target >= knee:
                self.cut_to = self.decrease_factor * target
                return self.cut_to
            return min(target + self._increase(obs), knee)
        if target < self.slow_start_below * goal and not self._own_band(target, goal):
            self.probes = 0
            grown = max(target * self.slow_start_factor, target + self.increase_step, self.restore_fraction * goal)
            return min(grown, max(self.decrease_factor * goal, target + self.increase_step))
        # The steady-state step: the same for every client on the engine, and smaller on a big one, so that the
        # many clients a big fleet serves do not overshoot it together every poll (fleet_step, docs/scale-out.md).
        increase = self._increase(obs)
        if target + increase <= goal:
            self.probes = 0
            return target + increase
        # Beside a peer on a one-step engine a probe runs only while the knee is unknown (a raised limit cleared
        # it): the raise is room for every client, and +1 a poll would take most of a short run to find it.
        accelerate = self.accelerate_shared or self.pipelining or self._share(obs) >= self.jump_share
        growth = self.probe_growth if accelerate else 1.0
        step = min(increase * growth**self.probes, target)
        capacity = self.capacity(obs.time)
        if self.probe_headroom and capacity is not None and obs.running <= capacity:
            room = max(increase, self._share(obs) * (self._batches() * capacity - obs.running - obs.waiting))
            if room < step:
                return target + room  # the engine is full: a probe would only displace other clients
        self.probes += 1
        return target + step
