"""The comparison study: every scenario × policy pair, in parallel processes, into one table and one grid of plots.

A policy is judged only side by side with the others and with the oracle on the same scenarios, in one run, so
a change to the engine model or a scenario cannot make two tables silently incomparable. The work is
embarrassingly parallel: each pair is one independent simulation. Workers return whole traces (a few numpy
arrays) and the parent summarises and plots, so the oracle of a scenario is simulated once, not once per policy.

Order of work, so the oracle's knee sweeps (the costly, disk-cached part) are never computed twice at once: the
oracle run of each scenario is submitted first; the pairs of a scenario are submitted only when its oracle has
finished, by which time its sweeps are on disk (and a scenario that sizes background traffic from capacity finds
them there).

A scenario whose oracle cannot be built (the lab has no knee for its fleet) is not scored: each of its rows names
the reason in ``unscored``, the rest of the study completes, and the commands exit 1 to say that rows are missing.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model_concurrency.lab.scenario import Scenario
from model_concurrency.lab.summary import SUMMARY_KEYS, summarize
from model_concurrency.lab.trace import Trace

__all__ = ["COLUMNS", "Study", "markdown_table", "run_study", "write_csv", "write_grid", "write_markdown"]

#: ``unscored``: why the lab could not score the scenario (its oracle could not be built); empty when it was scored.
COLUMNS = ("scenario", "policy", *SUMMARY_KEYS, "unscored")


@dataclass(slots=True)
class Study:
    """What a comparison leaves behind: the rows of the table, and the traces to plot them."""

    scenarios: list[Scenario]
    policies: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    traces: dict[tuple[str, str], Trace] = field(default_factory=dict)
    oracles: dict[str, Trace] = field(default_factory=dict)
    unscored: dict[str, str] = field(default_factory=dict)  # scenario name -> why its oracle could not be built

    def row(self, scenario: str, policy: str) -> dict[str, Any]:
        for row in self.rows:
            if row["scenario"] == scenario and row["policy"] == policy:
                return row
        raise KeyError((scenario, policy))


def _oracle_task(scenario: Scenario) -> Trace:
    from model_concurrency.lab.oracle import Oracle

    return Oracle(scenario).run()


def _pair_task(scenario: Scenario, policy: str) -> Trace:
    from model_concurrency.lab.oracle import Oracle
    from model_concurrency.lab.run import simulate
    from model_concurrency.policies.registry import load_policy

    return simulate(
        scenario, policy_factory=lambda: load_policy(policy), resolve_fraction=Oracle(scenario).background_rps
    )


class _Inline(Executor):
    """A serial executor (``jobs=1``): same code path, no processes; what tests and notebooks use."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


def run_study(
    scenarios: Sequence[Scenario],
    policies: Sequence[str],
    *,
    jobs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Study:
    """Run every pair (and each scenario's oracle once); ``progress`` is called with a label per finished task."""
    from model_concurrency.policies.registry import load_policy

    names = [s.name for s in scenarios]
    if len(set(names)) != len(names):
        raise ValueError(f"scenario names must be unique, got {names}")
    for policy in policies:
        load_policy(policy)  # fail fast, with the loader's message, before simulating anything
    study = Study(list(scenarios), list(policies))
    jobs = jobs or os.cpu_count() or 1
    executor: Executor = _Inline() if jobs == 1 else ProcessPoolExecutor(max_workers=jobs)
    with executor:
        pending: dict[Future[Trace], tuple[Scenario, str | None]] = {
            executor.submit(_oracle_task, sc): (sc, None) for sc in scenarios
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                scenario, label = pending.pop(future)
                try:
                    trace = future.result()
                except ValueError as exc:
                    if label is not None:
                        raise  # a policy's run that fails is a bug, not a scenario the lab cannot score
                    study.unscored[scenario.name] = str(exc)  # its rows say why; the rest of the study goes on
                    if progress is not None:
                        progress(f"{scenario.name} / oracle (unscored)")
                    continue
                if label is None:
                    study.oracles[scenario.name] = trace
                    for p in policies:
                        pending[executor.submit(_pair_task, scenario, p)] = (scenario, p)
                else:
                    study.traces[(scenario.name, label)] = trace
                if progress is not None:
                    progress(f"{scenario.name} / {label or 'oracle'}")
    for sc in scenarios:
        for p in policies:
            if sc.name in study.unscored:
                study.rows.append({"scenario": sc.name, "policy": p, "unscored": study.unscored[sc.name]})
                continue
            summary = summarize(study.traces[(sc.name, p)], study.oracles[sc.name])
            study.rows.append({"scenario": sc.name, "policy": p, **summary})
    return study


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    """A GitHub-flavoured Markdown table, one row per scenario × policy (3 significant digits; — for none)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_markdown(rows: Sequence[dict[str, Any]], path: str | Path, columns: Sequence[str] = COLUMNS) -> Path:
    """:func:`markdown_table` written to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown_table(rows, columns))
    return path


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path, columns: Sequence[str] = COLUMNS) -> Path:
    """The same rows at full precision; an absent figure is an empty cell."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: ("" if row.get(c) is None else row.get(c)) for c in columns})
    return path


def write_grid(study: Study, path: str | Path, *, dpi: int = 80) -> Path:
    """Rows = scenarios, columns = policies; each cell is :func:`~model_concurrency.lab.plot.draw_run`'s pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from model_concurrency.lab.plot import draw_run, figure_legend, legend_entries

    n_rows, n_cols = len(study.scenarios), len(study.policies)
    fig, axes = plt.subplots(
        2 * n_rows,
        n_cols,
        figsize=(4.2 * n_cols, 4.4 * n_rows),
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 2] * n_rows},
    )
    for i, sc in enumerate(study.scenarios):
        for j, policy in enumerate(study.policies):
            trace = study.traces.get((sc.name, policy))
            if trace is None:  # unscored: the cell says why
                axes[2 * i, j].set_title(f"{sc.name}: not scored", fontsize=8)
                axes[2 * i, j].text(0.5, 0.5, study.unscored.get(sc.name, ""), ha="center", wrap=True, fontsize=7)
                continue
            pair = (axes[2 * i, j], axes[2 * i + 1, j])
            draw_run(pair, trace, study.oracles.get(sc.name), f"{sc.name}: {policy}", legend=False)
            axes[2 * i + 1, j].sharex(axes[2 * i, j])
    # One legend for the grid, above it: inside a cell it would cover the curves it explains.
    handles, labels = legend_entries(fig)
    figure_legend(fig, handles, labels, ncol=max(1, 2 * n_cols))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
