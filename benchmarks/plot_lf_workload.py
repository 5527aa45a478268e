"""Bar chart of a benchmarks/lf_workload.py result: training tokens/s and end-to-end seconds per run.

    python benchmarks/plot_lf_workload.py benchmarks/results/2026-12-02-lf-workload.json docs/images/lf-workload.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(result_file: str, png: str) -> None:
    result = json.load(open(result_file))
    runs = [r for r in result["results"] if r["returncode"] == 0]
    labels = [f"{r['tool']}\n{r['name'].replace(r['tool'] + '-', '')}" for r in runs]
    fig, (speed, wall) = plt.subplots(1, 2, figsize=(10, 3.6))
    speed.bar(labels, [r["tokens_per_s"] / 1e3 for r in runs], color="tab:blue")
    speed.set_title("training tokens/s (thousands)")
    wall.bar(labels, [r["end_to_end_s"] for r in runs], color="tab:orange")
    wall.set_title("end to end (s)")
    for axis in (speed, wall):
        axis.tick_params(axis="x", labelsize=8)
        for bar in axis.patches:
            axis.annotate(f"{bar.get_height():.1f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                          ha="center", va="bottom", fontsize=8)
    title = result.get("title", "the issue-15 LLaMA-Factory YAML on one H200 (Qwen3-1.7B shape, 1.13M tokens)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
