"""Console output: the data report table and the progress bar (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console(stderr=True)


def status(text: str):
    """A spinner while a long step runs (data preparation), on the narrating rank only."""
    import contextlib

    from .. import dist

    return console.status(text) if dist.is_main() and console.is_terminal else contextlib.nullcontext()


def print_data_report(report: dict, cfg, title: str = "training data") -> None:
    from .. import dist

    if not dist.is_main():
        return
    table = Table(title=title, show_lines=False)
    table.add_column("dataset")
    table.add_column("rows", justify="right")
    table.add_column("skipped", justify="right")
    for name, info in report.get("datasets", {}).items():
        table.add_row(name, str(info.get("rows", "?")), str(info.get("skipped", 0)))
    console.print(table)
    console.print(
        f"{report.get('num_rows', 0)} samples, {report.get('num_tokens', 0):,} tokens; "
        f"truncated to cutoff_len{_cutoff(cfg, report)}: {report.get('num_truncated', 0)}; "
        f"dropped (no supervised token left): {report.get('num_dropped_no_labels', 0)}; "
        f"dropped (media past cutoff_len): {report.get('num_dropped_too_long', 0)}; "
        f"skipped (bad media): {report.get('num_skipped_bad_media', 0)}; text cut to the cutoff's character "
        f"budget before tokenizing: {report.get('num_text_cut', 0)}; cache {report.get('cache', '?')}"
    )
    if "eval" in report:
        console.print(f"eval: {report['eval'].get('num_rows', '?')} samples")


class TrainProgress:
    """The bar and metric lines, on the main rank only. The bar shows one metric, named by `label` (the step
    source's progress_key: loss, or online RL's reward_mean)."""

    def __init__(self, total: int, done: int, label: str = "loss"):
        from .. import dist

        self.enabled = dist.is_main()
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(f"{label} {{task.fields[value]:.4f}}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("train", total=total, completed=done, value=float("nan"))

    def __enter__(self):
        if self.enabled:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.stop()

    def update(self, step: int, value: float) -> None:
        if self.enabled:
            self.progress.update(self.task, completed=step, value=value)

    def print_metrics(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()]
        self.progress.console.print(f"step {step}: " + "  ".join(parts))


def _cutoff(cfg, report: dict) -> str:
    """The cutoff the rows were cut at: this config's, unless they were loaded from tokenized_path as saved."""
    return "" if report.get("cache") == "tokenized_path" else f"={cfg.data.cutoff_len}"
