"""Adaptive on one-step (pooling) engines: learnt from the generation-token counter, a queue kept for pipelining.

An embedding request finishes in the step that reads its prompt, so the engine's knee lies above
``max_num_seqs``: one batch queued behind the running one keeps every step full (docs/policies.md, "One-step
engines"). The rules must apply only where the engine's counters say so, and leave decoders bit for bit as
they were. Figures are chosen to give whole numbers: an engine of 64 sequences, 100 of our calls in flight.
"""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from engine_helpers import tiny_preset
from model_concurrency import Observation
from model_concurrency.engine import Request, Server
from model_concurrency.observation import EngineSnapshot, observe
from model_concurrency.policies import Adaptive
from model_concurrency.policies._common import CompletionShare, one_step_engine, pipelined_share
from model_concurrency.signals.prometheus_api import PrometheusSource, _snapshot
from model_concurrency.signals.vllm import parse_vllm_metrics

MODEL = "BAAI/bge-m3"


def poll(
    inflight: int,
    running: float,
    waiting: float = 0.0,
    *,
    generated: float | None = 0.0,
    completed: float | None = 50.0,
    calls: int | None = None,
    time: float = 0.0,
) -> Observation:
    """One poll of a client alone on the engine unless ``calls`` says otherwise: every completion was ours."""
    return Observation(
        running=running,
        waiting=waiting,
        waiting_capacity=waiting,
        inflight=inflight,
        generation_tokens=generated,
        completed=completed,
        client_calls=int(completed or 0) if calls is None else calls,
        time=time,
    )


def saturated_at_64(policy: Adaptive, *, generated: float | None) -> float:
    """One poll the engine calls saturated under any rule (a queue of two batches): C = 64 recorded."""
    return policy.next_target(200.0, poll(200, 64, 136, generated=generated, time=0.0))


# -- the signal ---------------------------------------------------------------------------------------------
def page(generated: float, succeeded: float, *, ray: bool = False) -> str:
    """A vLLM page rendered by prometheus_client, in vLLM's spelling or a Ray metrics agent's."""
    registry = CollectorRegistry()
    prefix = "ray_vllm_" if ray else "vllm:"
    labels = ["engine", "model_name"]
    Gauge(f"{prefix}num_requests_running", "Running", labels, registry=registry).labels("0", MODEL).set(64)
    tokens = Counter(f"{prefix}generation_tokens", "Generated tokens", labels, registry=registry)
    tokens.labels("0", MODEL).inc(generated)
    success = Counter(f"{prefix}request_success", "Finished", [*labels, "finished_reason"], registry=registry)
    success.labels("0", MODEL, "stop").inc(succeeded)
    return generate_latest(registry).decode()


def test_a_page_without_generated_tokens_reads_as_a_one_step_engine() -> None:
    before, after = parse_vllm_metrics(page(0, 100), MODEL), parse_vllm_metrics(page(0, 164), MODEL)
    assert (after.generation_tokens_total, after.success_total) == (0.0, 164.0)
    obs = observe(after, before, inflight=100, time=1.0)
    assert (obs.generation_tokens, obs.completed) == (0.0, 64.0)
    assert one_step_engine(obs) is True


def test_a_decoder_page_and_the_ray_form() -> None:
    before = parse_vllm_metrics(page(1000, 10, ray=True), MODEL)
    after = parse_vllm_metrics(page(1480, 14, ray=True), MODEL)
    obs = observe(after, before, inflight=8, time=1.0)
    assert (obs.generation_tokens, obs.completed) == (480.0, 4.0)
    assert one_step_engine(obs) is False


def test_the_engine_model_exports_no_generated_tokens_for_embeddings() -> None:
    env = simpy.Environment()
    server = Server(env, tiny_preset(embedding=True, chunked_prefill=False), num_engines=1)
    for _ in range(6):
        server.submit(Request(8, 0, embedding=True))
    env.run()
    snapshot = parse_vllm_metrics(server.render_metrics(), "org/tiny-model-1.0")
    assert snapshot == server.snapshot()
    assert (snapshot.generation_tokens_total, snapshot.success_total) == (0.0, 6.0)


def test_the_prometheus_source_asks_for_and_sums_the_counter() -> None:
    source = PrometheusSource("http://127.0.0.1:9/", MODEL)
    assert "generation_tokens_total" in source.queries()[0]
    summed = [
        ({"__name__": "vllm:num_requests_running"}, 64.0),
        ({"__name__": "vllm:generation_tokens_total"}, 0.0),
        ({"__name__": "vllm:request_success_total"}, 300.0),
    ]
    snapshot = _snapshot(summed, [])
    assert (snapshot.generation_tokens_total, snapshot.success_total) == (0.0, 300.0)


def test_polls_that_cannot_tell() -> None:
    assert one_step_engine(poll(1, 1, generated=None)) is None  # an older page without the counter
    assert one_step_engine(poll(1, 1, completed=0.0)) is None  # nothing finished: nothing learnt
    assert one_step_engine(poll(1, 1, completed=None)) is None  # the first poll has no deltas
    assert one_step_engine(poll(1, 1, generated=3.0, completed=0.0)) is False
    assert one_step_engine(Observation(ok=False)) is None


# -- the rules ----------------------------------------------------------------------------------------------
def test_the_pipelined_share_keeps_one_batch_queued() -> None:
    # 200 of ours; 64 running, 136 waiting, a batch of 64: 200 × 128 / 264, not 200 × 64 / 200.
    assert pipelined_share(poll(200, 64, 136), 64) == 200 * 128 / 264
    assert pipelined_share(poll(100, 64, 0), 64) == 100  # nothing visible queued: all of it
    assert pipelined_share(poll(0, 64, 10), 64) is None


def test_a_full_batch_is_no_saturation_on_a_one_step_engine() -> None:
    policy = Adaptive()
    cut = saturated_at_64(policy, generated=0.0)
    assert cut == 0.9 * (200 * 128 / 264)  # cut to the pipelined share, and C = 64 recorded
    assert policy.capacity(0.0) == 64
    # Back at a full batch of 64, near-full, nothing waiting: a decoder would cut (the inferred rule); here the
    # goal counts a second batch (2 × 64 = 128), so the target climbs toward it by the step...
    assert policy.next_target(120.0, poll(120, 64, 0, time=12.0)) == 121.0
    # ...and far below it returns at once to 0.9 × 128.
    assert policy.next_target(100.0, poll(100, 64, 0, time=24.0)) == 0.9 * 128


def test_a_decoder_at_its_learnt_capacity_still_cuts() -> None:
    policy = Adaptive()
    assert saturated_at_64(policy, generated=500.0) == 0.9 * (200 * 64 / 200)
    assert policy.next_target(100.0, poll(100, 64, 0, generated=500.0, time=12.0)) == 0.9 * 100


def test_no_visible_queue_is_tolerated() -> None:
    # Any capacity-waiting after a step was scheduled is more than the pipelined batch: cut to the pipelined share.
    policy = Adaptive()
    saturated_at_64(policy, generated=0.0)
    assert policy.next_target(128.0, poll(128, 64, 1, time=12.0)) == 0.9 * (128 * 128 / 129)


def test_without_the_one_step_rules_a_pooling_engine_is_read_as_a_decoder() -> None:
    # The cut to the served share 64 (not the pipelined 97); then back at the sampled 64 running with nothing
    # waiting, the inferred saturation cuts to 0.9 × the 100 in flight, as on a decoder, where the rules climb
    # toward two batches (0.9 × 128).
    off = Adaptive(without=("one-step",))
    assert saturated_at_64(off, generated=0.0) == 0.9 * 64
    decoder = Adaptive()
    assert saturated_at_64(decoder, generated=500.0) == 0.9 * 64
    assert off.next_target(100.0, poll(100, 64, 0, time=12.0)) == 0.9 * 100
    assert decoder.next_target(100.0, poll(100, 64, 0, generated=500.0, time=12.0)) == 0.9 * 100
    on = Adaptive()
    saturated_at_64(on, generated=0.0)
    assert on.next_target(100.0, poll(100, 64, 0, time=12.0)) == 0.9 * 128


def test_the_one_step_verdict_survives_polls_that_cannot_tell() -> None:
    policy = Adaptive()
    saturated_at_64(policy, generated=0.0)
    assert policy.pipelining
    policy.next_target(100.0, poll(100, 64, 0, completed=0.0, time=12.0))
    assert policy.pipelining
    policy.next_target(100.0, poll(100, 64, 0, generated=7.0, time=24.0))
    assert not policy.pipelining


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 400),  # inflight
            st.integers(0, 300),  # running
            st.integers(0, 300),  # waiting
            st.one_of(st.none(), st.integers(1, 5000)),  # generated tokens: a decoder's, or no counter
            st.one_of(st.none(), st.integers(0, 300)),  # completed
            st.one_of(st.none(), st.floats(0.0, 1.0)),  # KV usage
        ),
        min_size=1,
        max_size=30,
    )
)
def test_decoders_see_exactly_the_rules_they_had(
    polls: list[tuple[int, int, int, int | None, int | None, float | None]],
) -> None:
    """Without a poll that shows a one-step engine, every answer equals the rules with the one-step part off."""
    on, off = Adaptive(), Adaptive(without=("one-step",))
    target_on = target_off = 4.0
    for i, (inflight, running, waiting, generated, completed, kv) in enumerate(polls):
        obs = Observation(
            running=float(running),
            waiting=float(waiting),
            waiting_capacity=float(waiting),
            inflight=inflight,
            generation_tokens=None if generated is None else float(generated),
            completed=None if completed is None else float(completed),
            kv_cache_usage=kv,
            kv_num_blocks=10_000,
            time=12.0 * i,
        )
        target_on = on.next_target(target_on, obs)
        target_off = off.next_target(target_off, obs)
        assert target_on == target_off
        target_on = target_off = max(1.0, min(512.0, round(target_on)))


def test_snapshots_without_the_counter_leave_it_unknown() -> None:
    obs = observe(EngineSnapshot(running=3.0, success_total=9.0), EngineSnapshot(success_total=1.0), inflight=3, time=1)
    assert obs.generation_tokens is None and one_step_engine(obs) is None


def test_the_lab_holds_an_embedding_engine_above_its_sequence_limit() -> None:
    """``embed-batch`` (an engine of 64 sequences), 60 simulated seconds: with the one-step rules the target settles
    between one and two batches after the first ramp and the client completes more than without them."""
    from model_concurrency.lab.run import simulate
    from model_concurrency.lab.scenario import find_scenario, load_scenario

    scenario = load_scenario(find_scenario("embed-batch")).scaled(0.1)
    limit = scenario.fleet.engine["max_num_seqs"]
    without = {True: (), False: ("one-step",)}
    runs = {on: simulate(scenario, policy_factory=lambda on=on: Adaptive(without=without[on])) for on in (True, False)}
    settled = {on: run.clients[0].poll_targets[run.clients[0].poll_times >= 20.0] for on, run in runs.items()}
    assert len(settled[True]) > 0
    assert all(limit < t <= 2 * limit + 2 for t in settled[True])
    assert all(t <= 2 * limit for t in settled[False])
    assert runs[True].clients[0].completions[-1] > runs[False].clients[0].completions[-1]


def test_the_lab_splits_a_shared_embedding_engine_two_batches_between_its_clients() -> None:
    """``embed-shared`` (two clients, an engine of 32 sequences, polls about a step apart), 6 simulated seconds.

    Before, each client read an in-flight share of 1 (a batch on the wire) and one of them aimed at both batches
    (targets to 61, the other 4-12; waiting on 39 % of the samples). Beside a peer each aims at its completion
    share of the two batches."""
    from model_concurrency.lab.run import simulate
    from model_concurrency.lab.scenario import find_scenario, load_scenario

    scenario = load_scenario(find_scenario("embed-shared")).scaled(0.2)
    limit = scenario.fleet.engine["max_num_seqs"]
    run = simulate(scenario, policy_factory=Adaptive)
    settled = [c.poll_targets[c.poll_times >= 2.0] for c in run.clients]
    assert all(len(t) > 0 and max(t) <= limit + 8 for t in settled)  # half of two batches, plus the share's noise
    done = [c.completions[-1] for c in run.clients]
    assert min(done) >= 0.75 * max(done)
    assert (run.waiting_capacity[run.time >= 2.0] > 0).mean() < 0.2


# -- the first ramp, a raised limit and the guard on one-step engines (docs/policies.md) -------------------------
def test_the_first_ramp_doubles_instead_of_jumping_on_a_one_step_engine() -> None:
    # 32 in flight, 31 running, KV 0.11 % of 10,000 blocks: one block a sequence, a KV bound of ~9,200. A decoder
    # would jump 8x (32 -> 256, past an engine of 64); a one-step engine doubles (on fast polls, still ramping).
    def first_polls(generated: float) -> tuple[float, bool]:
        policy = Adaptive()
        policy.next_target(4.0, Observation(inflight=4, running=1, kv_num_blocks=10_000, time=0.0))
        ramp = Observation(
            running=31, inflight=32, inflight_peak=32, kv_cache_usage=0.0031, kv_num_blocks=10_000,
            generation_tokens=generated, completed=1.0, client_calls=1, time=0.5,
        )  # fmt: skip
        return policy.next_target(32.0, ramp), policy.wants_fast_polls

    assert first_polls(generated=0.0) == (64.0, True)
    assert first_polls(generated=40.0) == (256.0, True)


def test_a_raised_sequence_limit_drops_the_stale_w_max_and_probes_from_here() -> None:
    policy = Adaptive()
    saturated_at_64(policy, generated=0.0)  # C = 64, W_max = 200 × 128 / 264
    assert policy.w_max == 200 * 128 / 264
    # 66 running: more than the engine ever ran while saturated, its limit rose. W_max becomes the target (96),
    # so the next answer is a probe (+1, then +2, +4...), not the additive climb to the old W_max.
    assert policy.next_target(96.0, poll(96, 66, 0, time=12.0)) == 97.0
    assert policy.w_max == 96.0 and policy.capacity(12.0) is None
    assert policy.next_target(97.0, poll(97, 40, 0, time=24.0)) == 99.0
    assert policy.next_target(99.0, poll(99, 66, 0, time=36.0)) == 103.0


def test_a_raised_limit_on_a_decoder_keeps_w_max() -> None:
    policy = Adaptive()
    saturated_at_64(policy, generated=500.0)  # W_max = 64, C = 64
    assert policy.next_target(60.0, poll(60, 66, 0, generated=500.0, time=12.0)) == 61.0
    assert policy.w_max == 64.0


def test_beside_a_peer_the_completions_say_shared_where_the_gauges_read_alone() -> None:
    # scale_out's case: 100 of our calls in flight, the engine shows 64 running and nothing queued (our in-flight
    # share reads 1: a batch is on the wire), but we finished 32 of its 64 completions.
    shared, alone = Adaptive(), Adaptive()
    shared.next_target(100.0, poll(100, 64, 0, completed=64, calls=32, time=0.0))
    alone.next_target(100.0, poll(100, 64, 0, completed=64, calls=64, time=0.0))
    assert (shared.alone, shared.completions.share, shared.pipelining) == (False, 0.5, True)
    assert (alone.alone, alone.completions.share, alone.pipelining) == (True, 1.0, True)


def test_beside_a_peer_a_one_step_client_holds_its_share_of_two_batches() -> None:
    # Half of the engine's completions are ours (32 of 64 a poll). Saturated once: C = 64, the cut to the pipelined
    # share 0.9 × 100 × 128 / 264. Our share of the knee is then 1/2 × 2 × 64 = 64.
    policy = Adaptive()
    cut = policy.next_target(100.0, poll(100, 64, 136, completed=64, calls=32, time=0.0))
    assert cut == policy.cut_to == 0.9 * (100 * 128 / 264)  # 43.6
    assert policy.capacity(0.0) == 64 and policy.goal(poll(44, 40, completed=64, calls=32, time=1.0)) == 64.0
    # 44 is under 3/4 of the knee (48): far below it, slow start (a doubling to 88) capped at 0.9 × 64.
    assert policy.next_target(44.0, poll(44, 40, completed=64, calls=32, time=1.0)) == 0.9 * 64
    # Near it, +1 a poll; at it, a cut before any queue shows (no probe past it), then +1 from there.
    assert policy.next_target(58.0, poll(58, 50, completed=64, calls=32, time=2.0)) == 59.0
    assert policy.next_target(64.0, poll(64, 64, completed=64, calls=32, time=3.0)) == 0.9 * 64
    assert policy.next_target(58.0, poll(58, 50, completed=64, calls=32, time=4.0)) == 59.0
    # One step short of the knee, the step is whole: 63.5 → 64.5, not held at 64. A client whose share of the
    # knee is small reaches its next whole call this way, where a cap at the knee would hold it where it is.
    assert policy.next_target(63.5, poll(63, 50, completed=64, calls=32, time=5.0)) == 64.5
    # Alone (every completion ours) the same engine's knee is two whole batches, and 64 is far below it.
    alone = Adaptive()
    alone.next_target(100.0, poll(100, 64, 136, completed=64, time=0.0))
    assert alone.goal(poll(64, 64, completed=64, time=1.0)) == 128.0
    assert alone.next_target(64.0, poll(64, 64, completed=64, time=1.0)) == 0.9 * 128


def test_beside_a_peer_the_fail_safes_floor_slow_starts_back_to_the_knee() -> None:
    # Below where our own cut left us (the controller's floor after an outage): slow start, not the additive step
    # of our own band, doubling up to 0.9 × our share of the knee (64), then +1 toward the knee.
    policy = Adaptive()
    policy.next_target(100.0, poll(100, 64, 136, completed=64, calls=32, time=0.0))
    policy.next_target(64.0, poll(64, 64, completed=64, calls=32, time=1.0))  # cut at the knee: 57.6
    targets = [4.0]
    for i in range(5):
        obs = poll(int(targets[-1]), 40, completed=64, calls=32, time=2.0 + i)
        targets.append(policy.next_target(targets[-1], obs))
    assert targets == [4.0, 8.0, 16.0, 32.0, 0.9 * 64, 0.9 * 64 + 1]


def test_the_completion_share_sums_over_a_few_batches() -> None:
    share = CompletionShare(batches=4.0)
    assert share.share is None
    seen = [
        share.update(Observation(completed=20.0, client_calls=10, inflight=1), batch=10.0),  # 10 / 20
        share.update(Observation(completed=20.0, client_calls=20, inflight=1), batch=10.0),  # 30 / 40
        share.update(Observation(completed=20.0, client_calls=20, inflight=1), batch=10.0),  # first poll out: 40 / 40
        share.update(Observation(ok=False, inflight=1), batch=10.0),  # a failed poll changes nothing
        share.update(Observation(completed=None, client_calls=5, inflight=1), batch=10.0),  # nor one without a counter
        share.update(Observation(completed=40.0, client_calls=0, inflight=1), batch=10.0),  # one poll holds 4 batches
        share.update(Observation(completed=40.0, client_calls=50, inflight=1), batch=10.0),  # answers late: capped
    ]
    assert seen == [0.5, 0.75, 1.0, 1.0, 1.0, 0.0, 1.0]


@given(st.lists(st.tuples(st.integers(0, 500), st.floats(0, 500)), max_size=30), st.floats(0, 200))
@settings(max_examples=200, deadline=None)
def test_the_completion_share_is_a_share(polls: list[tuple[int, float]], batch: float) -> None:
    share = CompletionShare()
    for calls, completed in polls:
        value = share.update(Observation(completed=completed, client_calls=calls, inflight=1), batch=batch)
        assert value is None or 0.0 <= value <= 1.0
        # The window is the shortest run of recent polls holding ``batches`` batches (or all there are).
        done = [c for _, c in share.window]
        assert len(done) <= 1 or sum(done[1:]) < share.batches * batch


# -- the first ramp grows only once its last growth came back (docs/policies.md) ------------------------------
def ramp_poll(target: float, time: float, *, calls: int, latency: float | None, generated: float = 0.0) -> Observation:
    """A first-ramp poll without KV figures (the ramp doubles): the window full and running, nothing waiting."""
    return Observation(
        running=target, inflight=int(target), inflight_peak=int(target), generation_tokens=generated, completed=20.0,
        client_calls=calls, client_latency_mean_s=latency, time=time,
    )  # fmt: skip


def test_a_one_step_ramp_holds_until_its_growth_came_back() -> None:
    # Doubled 8 -> 16 at t = 0; our calls take 15 ms. A poll 2 ms later cannot have seen the doubling: hold. Nor
    # can one without a completion of ours. One 20 ms after it doubles again.
    policy = Adaptive()
    assert policy.next_target(8.0, ramp_poll(8, 0.0, calls=4, latency=0.015)) == 16.0
    assert policy.next_target(16.0, ramp_poll(16, 0.002, calls=4, latency=0.015)) == 16.0
    assert policy.next_target(16.0, ramp_poll(16, 0.010, calls=0, latency=None)) == 16.0
    assert policy.next_target(16.0, ramp_poll(16, 0.020, calls=16, latency=0.015)) == 32.0
    assert policy.ramping


def test_a_decoder_ramp_does_not_wait_for_its_round_trip() -> None:
    # The same polls on an engine that generated tokens: the doubling goes on 2 ms later, as before; and with the
    # one-step rules off, an engine that generated nothing is treated as a decoder too.
    decoder = Adaptive()
    assert decoder.next_target(8.0, ramp_poll(8, 0.0, calls=4, latency=0.015, generated=100.0)) == 16.0
    assert decoder.next_target(16.0, ramp_poll(16, 0.002, calls=4, latency=0.015, generated=100.0)) == 32.0
    off = Adaptive(without=("one-step",))
    assert off.next_target(8.0, ramp_poll(8, 0.0, calls=4, latency=0.015)) == 16.0
    assert off.next_target(16.0, ramp_poll(16, 0.002, calls=4, latency=0.015)) == 32.0
