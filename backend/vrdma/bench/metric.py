"""What a benchmark measures: one Metric each (name, value, unit, the command that measures it), and a Report.

Library code returns Metrics; printing them is the command line's job (vrdma.cli), writing them this module's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    unit: str
    command: str
    sweep: dict[str, float] | None = None  # the figure at each size, where the metric is one point of a sweep

    def to_json(self) -> dict[str, object]:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class Report:
    metrics: list[Metric]
    results_file: Path
    plot_file: Path | None  # none where no benchmark run had a sweep to draw

    def table(self) -> str:
        """The metrics as a table, one line each."""
        width = max([len("metric"), *(len(m.name) for m in self.metrics)])
        rows = [f"{'metric':<{width}} {'value':>10}  unit"]
        rows += [f"{m.name:<{width}} {m.value:>10}  {m.unit}" for m in self.metrics]
        return "\n".join(rows)


def write(metrics: list[Metric], path: Path) -> None:
    """``path`` as a JSON list of metric objects (name, value, unit, command[, sweep])."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([m.to_json() for m in metrics], indent=2) + "\n")
