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
from model_concurrency.policies._common import one_step_engine, pipelined_share
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


def test_a_queue_up_to_one_batch_is_pipelining_and_more_is_overload() -> None:
    policy = Adaptive(one_step_queue=1.0)
    saturated_at_64(policy, generated=0.0)
    # 64 waiting behind 64 running (one batch): no cut, no capacity sample, the probe goes on.
    assert policy.next_target(128.0, poll(128, 64, 64, time=12.0)) == 129.0
    assert [r for _, r in policy.samples] == [64]
    # 65 waiting: more than a batch. Cut to 0.9 × 129 × 128 / 193, and record the sample.
    assert policy.next_target(129.0, poll(129, 64, 65, time=24.0)) == 0.9 * (129 * 128 / 193)
    assert [r for _, r in policy.samples] == [64, 64]


def test_the_default_tolerates_no_visible_queue() -> None:
    # The default (0): any capacity-waiting after a step was scheduled is more than the pipelined batch.
    policy = Adaptive()
    saturated_at_64(policy, generated=0.0)
    assert policy.next_target(128.0, poll(128, 64, 1, time=12.0)) == 0.9 * (128 * 128 / 129)
    off = Adaptive(one_step_pipeline=False)
    saturated_at_64(off, generated=0.0)
    assert off.next_target(100.0, poll(100, 64, 0, time=12.0)) == 0.9 * 100  # as on a decoder


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
    on, off = Adaptive(), Adaptive(one_step_pipeline=False)
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
    runs = {on: simulate(scenario, policy_factory=lambda on=on: Adaptive(one_step_pipeline=on)) for on in (True, False)}
    settled = {on: run.clients[0].poll_targets[run.clients[0].poll_times >= 20.0] for on, run in runs.items()}
    assert len(settled[True]) > 0
    assert all(limit < t <= 2 * limit + 2 for t in settled[True])
    assert all(t <= 2 * limit for t in settled[False])
    assert runs[True].clients[0].completions[-1] > runs[False].clients[0].completions[-1]


# -- session 6: the first ramp, a raised limit and the guard on one-step engines (live trace, docs/policies.md) --
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


def test_a_shared_one_step_engine_gets_the_decoders_rules() -> None:
    # Half of the engine's load and half of its completions are ours: another client shares it. Each keeping its
    # own second batch queued would queue a batch per client, so the answers are a decoder's, poll for poll.
    polls = [(100, 64, 136), (40, 64, 16), (32, 64, 0), (35, 64, 6), (20, 40, 0)]  # in flight: half of R + W
    one_step, decoder = Adaptive(), Adaptive()
    for i, (inflight, running, waiting) in enumerate(polls):
        target = float(inflight)
        answer = one_step.next_target(target, poll(inflight, running, waiting, calls=25, time=12.0 * i))
        assert answer == decoder.next_target(target, poll(inflight, running, waiting, generated=500.0, time=12.0 * i))
    assert one_step.one_step and not one_step.pipelining


def test_beside_a_peer_the_completions_say_shared_where_the_gauges_read_alone() -> None:
    # scale_out's case: 100 of our calls in flight, the engine shows 64 running and 16 waiting (our in-flight share
    # reads 1: a batch is on the wire), but we finished 32 of its 64 completions. Shared: the decoder's cut,
    # 0.9 × 100 × 64 / 80 = 72, not the pipelined 0.9 × 100 × min(1, 128 / 144) = 80 of a client alone.
    def cut(calls: int) -> tuple[float, bool]:
        policy = Adaptive()
        policy.next_target(100.0, poll(100, 64, 0, completed=64, calls=calls, time=0.0))  # learns: one step
        return policy.next_target(100.0, poll(100, 64, 16, completed=64, calls=calls, time=1.0)), policy.alone

    assert cut(calls=32) == (72.0, False)
    assert cut(calls=64) == (80.0, True)
    # The goal's share too. Saturated once (C = 64, W_max = 100 × 64 / 264), then 100 in flight, 64 running: the
    # in-flight share reads 1 (a goal of the whole batch, 64), the completions say half of it: 32.
    shared = Adaptive()
    shared.next_target(100.0, poll(100, 64, 200, completed=64, calls=32, time=0.0))
    assert shared.capacity(0.0) == 64 and shared.w_max == 100 * 64 / 264
    assert shared.goal(poll(100, 64, completed=64, calls=32, time=1.0)) == 32.0
