"""`tunesmith data`: counts, a length histogram and one rendered sample with its supervised span marked."""

from __future__ import annotations

from itertools import groupby

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import DataError
from .render import IGNORE_INDEX


def length_histogram(lengths: list[int], num_bins: int = 10) -> list[tuple[int, int, int]]:
    """(low, high, count) bins covering [min, max] of lengths."""
    if not lengths:
        return []
    low, high = min(lengths), max(lengths)
    width = max(1, -(-(high - low + 1) // num_bins))
    bins = [[low + i * width, low + (i + 1) * width - 1, 0] for i in range(num_bins)]
    for n in lengths:
        bins[min((n - low) // width, num_bins - 1)][2] += 1
    return [tuple(b) for b in bins if b[2] or b[0] <= high]


SPAN_OPEN, SPAN_CLOSE = "[[", "]]"


def marked_sample(tokenizer, input_ids: list[int], labels: list[int], plain: bool = False) -> Text:
    """The decoded sample; supervised tokens in bold green, the prompt dimmed.

    With plain=True (output that is not a terminal, where colours are dropped) each maximal run of
    supervised tokens is also wrapped in [[ and ]], so the span stays visible when piped.
    """
    text = Text()
    # Decoded a run of same-kind tokens at a time: a character split over tokens (byte-level BPE's non-ASCII
    # text) decodes whole only with its neighbours.
    for supervised, run in groupby(zip(input_ids, labels), key=lambda pair: pair[1] != IGNORE_INDEX):
        piece = tokenizer.decode([tok for tok, _ in run])
        if plain and supervised:
            piece = SPAN_OPEN + piece + SPAN_CLOSE
        text.append(piece, style="bold green" if supervised else "dim")
    return text


# Rows of the preference stages hold two sequences; their `length` counts both.
TWO_SIDED = {"rejected_input_ids": "chosen + rejected", "kl_input_ids": "sample + its KL sample"}


def print_inspection(console: Console, data, report: dict, tokenizer, index: int) -> None:
    train = data.train
    table = Table(title="datasets")
    for col in ("dataset", "rows", "skipped"):
        table.add_column(col)
    for name, info in report.get("datasets", {}).items():
        table.add_row(name, str(info.get("rows")), str(info.get("skipped", 0)))
    console.print(table)
    lengths = data.train_lengths()
    counted = next((what for column, what in TWO_SIDED.items() if column in train.column_names), None)
    tokens = f"tokens, {counted}" if counted else "tokens"
    console.print(
        f"{len(train)} samples, {sum(lengths):,} {tokens} (min {min(lengths)}, mean {sum(lengths) / len(lengths):.0f}, "
        f"max {max(lengths)}); truncated: {report.get('num_truncated', 0)} (text cut to the character budget "
        f"first: {report.get('num_text_cut', 0)}); "
        f"dropped without supervised tokens: {report.get('num_dropped_no_labels', 0)}; "
        f"skipped (bad media): {report.get('num_skipped_bad_media', 0)}"
    )
    hist = Table(title=f"length histogram ({tokens})")
    hist.add_column("tokens")
    hist.add_column("samples", justify="right")
    hist.add_column("")
    top = max(c for _, _, c in length_histogram(lengths))
    for low, high, count in length_histogram(lengths):
        hist.add_row(f"{low}-{high}", str(count), "#" * round(30 * count / max(top, 1)))
    console.print(hist)
    if data.eval is not None:
        console.print(f"eval: {len(data.eval)} samples")
    if not -len(train) <= index < len(train):
        raise DataError(f"--index {index}: the training data has {len(train)} samples; give 0 to {len(train) - 1} "
                        "(or -1 for the last)")
    index %= len(train)
    row = train[index]
    sides = [("", row["input_ids"], row["labels"])]
    if "rejected_input_ids" in row:
        sides = [("chosen", row["input_ids"], row["labels"]),
                 ("rejected", row["rejected_input_ids"], row["rejected_labels"])]
    elif "kto_tag" in row:
        sides = [(f"kto_tag {str(row['kto_tag']).lower()}: {'desirable' if row['kto_tag'] else 'undesirable'}",
                  row["input_ids"], row["labels"])]
    for what, input_ids, labels in sides:
        print_sample(console, tokenizer, f"sample {index} ({what})" if what else f"sample {index}", input_ids, labels)


def print_sample(console: Console, tokenizer, title: str, input_ids: list[int], labels: list[int]) -> None:
    num_labels = sum(1 for t in labels if t != IGNORE_INDEX)
    plain = not console.is_terminal
    how = (f"supervised tokens wrapped in {SPAN_OPEN} {SPAN_CLOSE}" if plain
           else "[bold green]supervised[/], [dim]not supervised[/]")
    console.print(f"\n{title}: {len(input_ids)} tokens, {num_labels} supervised ({how}):", markup=not plain)
    # soft_wrap: no inserted line breaks, so the printed sample is exactly the decoded tokens (plus markers)
    console.print(marked_sample(tokenizer, input_ids, labels, plain=plain), soft_wrap=True)
