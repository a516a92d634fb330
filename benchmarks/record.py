"""The figures the goals are about, beside the values last recorded in `figures.json`: a figure
worse than its record by more than this run's own noise is marked, so a regression shows before
it lands. `BENCH_RECORD=1` writes this run's values as the new record; docs/performance.md's
table is made from the file (`python -m benchmarks.record` prints it)."""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

RECORD = Path(__file__).with_name("figures.json")


@dataclass(frozen=True)
class Figure:
    """One figure of a run: lower is better; `noise` is how far a repeat of it moves in this
    run (the spread of its samples)."""

    key: str
    title: str
    value: float
    unit: str
    goal: float
    noise: float

    @staticmethod
    def of(key: str, title: str, samples: list[float], unit: str, goal: float) -> Figure:
        """The median of `samples`, its noise half their range."""
        noise = (max(samples) - min(samples)) / 2 if len(samples) > 1 else 0.0
        return Figure(key, title, statistics.median(samples), unit, goal, noise)


def recorded() -> dict[str, dict[str, object]]:
    try:
        return json.loads(RECORD.read_text())
    except FileNotFoundError:
        return {}


def report(figures: list[Figure]) -> None:
    """Each figure beside its goal and its record; what got worse than the noise is marked."""
    record = recorded()
    print("\nFigures beside their goals and the values recorded in benchmarks/figures.json:")
    for f in figures:
        was = record.get(f.key, {}).get("value")
        marks = [] if f.value <= f.goal else ["OVER GOAL"]
        if isinstance(was, int | float) and f.value - was > f.noise:
            marks.append(f"WORSE than recorded by {f.value - was:.1f} {f.unit}")
        digits = 2 if f.unit == "x" else 1
        before = f"{was:.{digits}f}" if isinstance(was, int | float) else "none"
        print(
            f"  {f.title:40s} {f.value:8.{digits}f} {f.unit:4s} goal <= {f.goal:g}  recorded "
            f"{before}  (noise ±{f.noise:.{digits}f})  {'; '.join(marks) or 'ok'}"
        )
    if os.environ.get("BENCH_RECORD") == "1":
        record |= {
            f.key: {"title": f.title, "value": round(f.value, 2), "unit": f.unit, "goal": f.goal}
            for f in figures
        }
        RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"recorded in {RECORD}")


def docs_table(record: dict[str, dict[str, object]]) -> str:
    """docs/performance.md's table of the recorded figures."""
    rows = ["| figure | recorded | goal |", "|---|---|---|"]
    for _, f in sorted(record.items()):
        rows.append(f"| {f['title']} | {f['value']} {f['unit']} | ≤ {f['goal']} {f['unit']} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(docs_table(recorded()))
