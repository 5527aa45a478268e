"""How a method's metric sums become the logged means (engines/base.metric_means)."""

import pytest

from tunesmith.engines.base import metric_means


def test_sums_divide_by_units_or_by_their_class_count():
    sums = {"rewards/chosen": 0.6, "rewards/rejected": -0.2, "count/chosen": 3.0, "count/rejected": 1.0,
            "kl": 2.0, "nll": 9.0, "ratio_max": 4.0}
    means = metric_means(sums, count=4)
    assert means == pytest.approx({"rewards/chosen": 0.2, "rewards/rejected": -0.2, "rewards/margins": 0.4,
                                   "kl": 0.5, "ratio_max": 4.0})


def test_a_class_absent_from_the_window_logs_nothing_and_pair_margins_are_kept():
    means = metric_means({"rewards/chosen": 0.0, "count/chosen": 0.0, "rewards/rejected": -1.0,
                          "count/rejected": 2.0}, count=2)
    assert means == {"rewards/rejected": -0.5}
    pairs = metric_means({"rewards/chosen": 2.0, "rewards/rejected": 1.0, "rewards/margins": 3.0}, count=2)
    assert pairs["rewards/margins"] == 1.5  # a pair method's own margins, not chosen − rejected
