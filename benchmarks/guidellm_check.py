"""guidellm (the vLLM project's benchmark client) against the served emulator, next to the engine model's own
figures for the same workload.

Why a benchmark and not a test: guidellm pulls torch and transformers (≈ 1.5 GB with the CPU torch wheel), so it
lives in its own venv, given by ``--guidellm-venv``; this script runs with the project's venv (it starts the
emulator) and drives guidellm's CLI as a subprocess. Set-up of that venv, once::

    python3.11 -m venv /tmp/guidellm-venv
    /tmp/guidellm-venv/bin/pip install torch==2.13.0 guidellm tokenizers   # torch 2.13.0: a CPU wheel

No model hub is reachable, so the tokenizer is built here: a word-level ``tokenizers`` model with the
``Whitespace`` pre-tokenizer, trained on Faker text (what guidellm's ``synthetic_text`` data is made of), saved
as a Hugging Face tokenizer directory. The emulator runs with ``--tokenizer words``, which counts exactly what
that tokenizer counts, so guidellm's token counts and the emulator's agree.

For each concurrency, guidellm runs a closed loop of N streams of ``/v1/completions`` (``stream=true``,
``ignore_eos`` with ``max_tokens`` = the output length, as guidellm sends for synthetic data). The engine model's
own figures come from the same :class:`~model_concurrency.engine.Server` preset in pure SimPy: N clients, each
submitting the next request when the last finished (client i a further i µs later: HTTP arrivals are never
simultaneous), with guidellm's measured prompt length, over the same (simulated) duration. guidellm's
wall-clock figures are converted to simulated time (× ``time_scale``). Goal: TTFT, ITL and output throughput
within 10 % (ITL: 10 % or 1 ms).

    .venv/bin/python benchmarks/guidellm_check.py --guidellm-venv /tmp/guidellm-venv
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import simpy

from model_concurrency.emulator import EmulatorConfig, serve_in_processes
from model_concurrency.engine import Request, Server

BUILD_TOKENIZER = """
import sys
from faker import Faker
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
fake = Faker()
fake.seed_instance(0)
corpus = [fake.text(max_nb_chars=2000) for _ in range(2000)]
corpus.append("the engine batch token queue model step cache block serve fast load")
tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""


def run_guidellm(venv: Path, url: str, tokenizer: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        str(venv / "bin" / "guidellm"),
        "run",
        "--backend",
        f"kind=openai_http,target={url},request_format=/v1/completions",
        "--profile",
        "kind=concurrent",
        "--override",
        "profile.streams",
        args.concurrency,
        "--data",
        f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
        "--tokenizer",
        f"kind=huggingface_auto,model={tokenizer}",
        "--constraint",
        f"kind=max_duration,seconds={args.seconds}",
        "--output",
        f"kind=json,path={out}",
        "--disable-progress",
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def guidellm_figures(benchmark: dict[str, Any], time_scale: float) -> dict[str, float]:
    metrics = benchmark["metrics"]

    def ok(name: str, stat: str = "median") -> float:
        return float(metrics[name]["successful"][stat])

    return {
        "streams": float(benchmark["config"]["strategy"]["streams"]),
        "prompt": ok("prompt_token_count"),
        "output": ok("output_token_count"),
        "ttft_ms": ok("time_to_first_token_ms") * time_scale,
        "itl_ms": ok("inter_token_latency_ms", "mean") * time_scale,
        "out_tok_s": ok("output_tokens_per_second", "mean") / time_scale,
        "wall_s": float(benchmark["duration"]),
    }


def model_figures(
    config: EmulatorConfig, streams: int, prompt: int, output: int, sim_s: float, stagger_s: float = 1e-6
) -> dict[str, float]:
    """The engine model alone: ``streams`` closed-loop clients for ``sim_s`` simulated seconds.

    Client ``i`` sends its next request ``i × stagger_s`` after its last one finished. Why: over HTTP, requests
    released together never reach the engine at the same instant, and the engine steps eagerly on the first
    arrival (a one-request prefill) while the rest wait for the next step. Perfectly simultaneous arrivals would
    all share one prefill step, a TTFT no real client sees (at 8 streams 27 ms against 34 ms here). Any stagger
    from 1 µs to 100 µs gives the same figures within 2 %.
    """
    env = simpy.Environment()
    server = Server(env, config.engine_preset())
    finished: list[Request] = []

    def client(i: int) -> Any:
        while True:
            yield env.timeout(i * stagger_s)
            request = Request(prompt, output, stop_reason="length")
            yield server.submit(request)
            finished.append(request)

    for i in range(streams):
        env.process(client(i))
    env.run(until=sim_s)
    ttft = [r.first_token_time - r.arrival_time for r in finished]  # type: ignore[operator]
    itl = [(r.finish_time - r.first_token_time) / (output - 1) for r in finished]  # type: ignore[operator]
    return {
        "ttft_ms": statistics.median(ttft) * 1000,
        "itl_ms": statistics.fmean(itl) * 1000,
        "out_tok_s": len(finished) * output / sim_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--guidellm-venv", type=Path, required=True)
    parser.add_argument("--preset", default="llama-8b-h100")
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0, help="wall seconds per concurrency")
    parser.add_argument("--frontends", type=int, default=1)
    args = parser.parse_args()
    config = EmulatorConfig(preset=args.preset, time_scale=args.time_scale, tokenizer="words", frontends=args.frontends)
    with tempfile.TemporaryDirectory(prefix="guidellm-check-") as tmp:
        tokenizer = Path(tmp) / "tokenizer"
        subprocess.run([str(args.guidellm_venv / "bin" / "python"), "-c", BUILD_TOKENIZER, str(tokenizer)], check=True)
        with serve_in_processes(config) as emu:
            report = run_guidellm(args.guidellm_venv, emu.url, tokenizer, Path(tmp) / "report.json", args)
    print(
        f"preset {args.preset}, time scale {args.time_scale}, /v1/completions streaming, "
        f"{args.prompt_tokens} prompt / {args.output_tokens} output tokens asked, {args.seconds:g} wall s per level; "
        "figures in simulated time (guidellm's wall figures × time scale)"
    )
    print(
        "| streams | prompt tok (guidellm) | TTFT ms guidellm / model | ratio | ITL ms guidellm / model | ratio "
        "| output tok/s guidellm / model | ratio |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for benchmark in report["benchmarks"]:
        g = guidellm_figures(benchmark, args.time_scale)
        m = model_figures(
            config, int(g["streams"]), round(g["prompt"]), round(g["output"]), g["wall_s"] * args.time_scale
        )
        print(
            f"| {g['streams']:.0f} | {g['prompt']:.0f} | {g['ttft_ms']:.2f} / {m['ttft_ms']:.2f} | "
            f"{g['ttft_ms'] / m['ttft_ms']:.2f} | {g['itl_ms']:.2f} / {m['itl_ms']:.2f} | "
            f"{g['itl_ms'] / m['itl_ms']:.2f} | {g['out_tok_s']:.0f} / {m['out_tok_s']:.0f} | "
            f"{g['out_tok_s'] / m['out_tok_s']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
