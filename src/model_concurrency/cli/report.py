"""``model-concurrency report``: run the comparisons behind docs/results.md and write the page from their CSVs.

One run, at one commit: ``compare`` over the bundled scenarios (fleet-1000 excepted: a thousand clients), ``fuzz``
at a stated seed, size and scale with the same policies, and ``benchmarks/conformance.py --quick`` (the cheap live
checks, run from the repository as a subprocess, its output captured). Each runs as the command the page shows, so
any table can be re-made by hand. Everything lands in the work folder (default out/report: bundled/compare.csv,
fuzz/fuzz.csv, run.json); ``--from DIR`` rebuilds the page from such a folder without running anything. ``make
results`` runs ``model-concurrency report --out docs/results.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the lab needs numpy (the [sim] extra): imported by the handlers, so --help stays light
    from model_concurrency.lab.report import Run

__all__ = ["live_misses", "read_rows", "register"]

# The default policy first, the peers it is measured against (model-concurrency list), then the package's plain AIMD
# and the static configuration (the floor, never moved) as the baseline a policy must beat.
DEFAULT_POLICIES = "adaptive,aibrix,llmd-aimd,batch-gateway-aimd,queue-time-aimd,aimd,static"
LIVE_SCRIPT = Path("benchmarks") / "conformance.py"
# The live checks' goals (benchmarks/conformance.py): lab and live within these of each other.
LIVE_GOODPUT_GAP = 0.05
LIVE_T90_POLLS = 2.0
_TEXT_COLUMNS = frozenset({"scenario", "policy", "unscored", "preset", "events"})


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report",
        help="run the bundled set, the generator and the live checks; write the results page",
        description=__doc__,
    )
    p.add_argument("--out", type=Path, required=True, help="the page to write, e.g. docs/results.md")
    p.add_argument("--seed", type=int, default=41, help="the generator's seed (default 41)")
    p.add_argument("--n", type=int, default=200, help="the generator's draws (default 200)")
    p.add_argument("--scale", type=float, default=1.0, help="shorten every run: multiply durations by this (0-1]")
    p.add_argument(
        "--policies", default=DEFAULT_POLICIES, help=f"comma-separated policies (default {DEFAULT_POLICIES})"
    )
    p.add_argument("--scenarios", default=None, help="comma-separated bundled scenarios (default: all but fleet-1000)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: the number of CPUs)")
    p.add_argument("--no-live", action="store_true", help="skip the live checks (benchmarks/conformance.py --quick)")
    p.add_argument("--work", type=Path, default=Path("out/report"), help="folder for the runs' files (out/report)")
    p.add_argument(
        "--from", dest="source", type=Path, default=None, metavar="DIR", help="rebuild the page from DIR; run nothing"
    )
    p.set_defaults(func=run)


def _parse(column: str, value: str) -> Any:
    if column in _TEXT_COLUMNS:
        return value or None
    if value in ("", "True", "False"):
        return None if value == "" else value == "True"
    try:
        return float(value)
    except ValueError:
        return value


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A CSV written by ``compare`` or ``fuzz``, its figures numbers again (an empty cell None); [] if absent."""
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        return [{k: _parse(k, v) for k, v in row.items()} for row in csv.DictReader(fh)]


def live_misses(output: str, status: int) -> tuple[str, ...]:
    """The live goals missed, read from the benchmark's output: its per-scenario knee verdict and its last line."""
    misses = [f"Live checks failed (exit status {status}); their output is above."] if status else []
    scenario = "?"
    for line in output.splitlines():
        if header := re.match(r"^(\S+) \(poll ", line):
            scenario = header.group(1)
        elif line.strip().startswith("knee") and line.rstrip().endswith("MISSED"):
            misses.append(f"Live `{scenario}`: {line.strip().removeprefix('knee').strip()}.")
        elif gaps := re.search(r"conformance: max goodput-ratio gap (\S+), max t90 gap (\S+) polls", line):
            goodput, t90 = float(gaps.group(1)), float(gaps.group(2))
            if goodput > LIVE_GOODPUT_GAP:
                misses.append(f"Live, lab-to-live gap in goodput ratio {goodput:.3f} (goal ≤ {LIVE_GOODPUT_GAP:g}).")
            if t90 > LIVE_T90_POLLS:
                misses.append(f"Live, lab-to-live gap in time to 90 % {t90:.2f} polls (goal ≤ {LIVE_T90_POLLS:g}).")
    return tuple(misses)


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def _root() -> Path:
    top = _git(Path.cwd(), "rev-parse", "--show-toplevel")
    return Path(top.strip()) if top else Path.cwd()


def commit_label(root: Path, page: Path) -> str:
    """``git rev-parse --short HEAD``, with "(dirty)" when the tree has changes other than the page itself."""
    head = _git(root, "rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    try:
        own = page.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        own = ""
    changed = [line[3:] for line in (_git(root, "status", "--porcelain") or "").splitlines() if line[3:] != own]
    return f"{head.strip()} (dirty)" if changed else head.strip()


def _version() -> str:
    try:
        from model_concurrency import __version__

        return str(__version__)
    except ImportError:  # pragma: no cover - the package always defines it
        from importlib.metadata import version

        return version("model-concurrency")


def _lab(argv: list[str], log: Path) -> None:
    """A lab subcommand in this process, exactly as ``model-concurrency ARGV`` runs it; its stdout to ``log``.

    Exit 1 (some scenarios could not be scored) is kept: their rows say why, and the page shows them."""
    from model_concurrency.cli import compare, fuzz

    parser = argparse.ArgumentParser(prog="model-concurrency")
    subparsers = parser.add_subparsers(required=True)
    compare.register(subparsers)
    fuzz.register(subparsers)
    args = parser.parse_args(argv)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh, contextlib.redirect_stdout(fh):
        args.func(args)


def _live(root: Path) -> tuple[str, str | None, int | None, str]:
    """Run the live checks from the repository: (command, output, exit status, why not run)."""
    command = shlex.join(["python", LIVE_SCRIPT.as_posix(), "--quick"])
    if not (root / LIVE_SCRIPT).is_file():
        return command, None, None, f"{LIVE_SCRIPT} not found: run from the repository"
    done = subprocess.run(
        [sys.executable, str(LIVE_SCRIPT), "--quick"], cwd=root, capture_output=True, text=True, check=False
    )
    output = done.stdout
    if done.returncode:
        output += "".join(f"\n{line}" for line in done.stderr.strip().splitlines()[-5:])
    return command, output, done.returncode, ""


def _policies(args: argparse.Namespace) -> tuple[list[str], str]:
    from model_concurrency import config
    from model_concurrency.cli.compare import study_policies

    policies = study_policies(args)
    default = str(config.setting(*config.POLICY))
    return policies, default if default in policies else policies[0]


def _scenarios(text: str | None) -> list[str]:
    from model_concurrency.lab.ablation import BUNDLED_SKIP
    from model_concurrency.lab.scenario import bundled_scenarios

    if text is None:
        return [name for name in sorted(bundled_scenarios()) if name not in BUNDLED_SKIP]
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise ValueError("--scenarios names no scenario")
    return names


def _command(args: argparse.Namespace) -> str:
    words = ["model-concurrency", "report", "--out", str(args.out), "--seed", str(args.seed), "--n", str(args.n)]
    words += ["--scale", f"{args.scale:g}", "--policies", args.policies]
    words += ["--scenarios", args.scenarios] if args.scenarios else []
    words += ["--jobs", str(args.jobs)] if args.jobs else []
    words += ["--no-live"] if args.no_live else []
    return shlex.join([*words, "--work", str(args.work)])


def _timed(label: str, seconds: dict[str, float], start: float) -> None:
    seconds[label] = time.perf_counter() - start
    print(f"report: {label} took {seconds[label]:.0f} s", flush=True)


def collect(args: argparse.Namespace) -> Run:
    """Run the three studies into the work folder and return the run's record (also written as run.json)."""
    from model_concurrency.lab.report import Run

    policies, default = _policies(args)
    if args.n < 1:
        raise ValueError("--n must be >= 1")
    root, work = _root(), Path(args.work)
    commit = commit_label(root, args.out)  # before anything is written
    jobs = ["--jobs", str(args.jobs)] if args.jobs else []
    study = ["--policies", ",".join(policies), "--scale", f"{args.scale:g}", *jobs, "--quiet"]
    bundled = ["compare", *_scenarios(args.scenarios), *study, "--no-plot", "--out", str(work / "bundled")]
    draws = ["fuzz", "--seed", str(args.seed), "--n", str(args.n), *study, "--out", str(work / "fuzz")]
    seconds: dict[str, float] = {}
    for label, argv in (("bundled set", bundled), ("generator", draws)):
        print(f"report: {label}: model-concurrency {shlex.join(argv)}", flush=True)
        start = time.perf_counter()
        _lab(argv, work / f"{argv[0]}.log")
        _timed(label, seconds, start)
    live: tuple[str | None, str | None, int | None, str] = (None, None, None, "--no-live")
    if not args.no_live:
        start = time.perf_counter()
        live = _live(root)
        _timed("live checks", seconds, start)
    command, output, status, skipped = live
    record = Run(
        commit=commit,
        version=_version(),
        generated=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=_command(args),
        default_policy=default,
        policies=tuple(policies),
        bundled_command=shlex.join(["model-concurrency", *bundled]),
        fuzz_command=shlex.join(["model-concurrency", *draws]),
        live_command=command,
        live_output=output,
        live_status=status,
        live_skipped=skipped,
        live_misses=live_misses(output, status or 0) if output is not None else (),
    )
    (work / "run.json").write_text(json.dumps(dataclasses.asdict(record), indent=2) + "\n")
    return record


def load_run(folder: Path) -> Run:
    from model_concurrency.lab.report import Run

    path = folder / "run.json"
    if not path.is_file():
        raise ValueError(f"{path}: not found (a work folder of `model-concurrency report`, which writes it)")
    data = json.loads(path.read_text())
    return Run(**{**data, "policies": tuple(data["policies"]), "live_misses": tuple(data["live_misses"])})


def write_page(folder: Path, out: Path, run_record: Run | None = None) -> int:
    """The page from the folder's CSVs; exit 1 when it is over the page's word limit (it is written all the same)."""
    from model_concurrency.lab.report import MAX_WORDS, build_page

    record = run_record or load_run(folder)
    page = build_page(record, read_rows(folder / "bundled" / "compare.csv"), read_rows(folder / "fuzz" / "fuzz.csv"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    words = len(page.split())
    print(f"wrote {out} ({words:,} words)")
    if words > MAX_WORDS:
        print(f"model-concurrency: the page has {words:,} words, over {MAX_WORDS:,}: fewer policies?", file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    if args.source is not None:
        return write_page(args.source, args.out)
    return write_page(args.work, args.out, collect(args))
