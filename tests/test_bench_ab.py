"""bench/ab.py's summary: each figure of a bench's last line as the mean of each tree's runs,
written as the bench writes it."""

from __future__ import annotations

import importlib.util

from tests.conftest import BASE_DIR

spec = importlib.util.spec_from_file_location("bench_ab", BASE_DIR / "bench" / "ab.py")
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)


def test_each_figure_is_the_mean_of_its_side_with_the_benchs_sign_and_decimals():
    before = [
        "overhead: ttft +60.0 ms p50, cpu 8.4 ms/answer; c=1",
        "overhead: ttft +70.0 ms p50, cpu 8.8 ms/answer; c=1",
    ]
    after = [
        "overhead: ttft +55.5 ms p50, cpu 8.1 ms/answer; c=1",
        "overhead: ttft +58.5 ms p50, cpu 8.3 ms/answer; c=1",
    ]
    assert ab.side_by_side(before, after) == (
        "overhead: ttft +65.0 -> +57.0 ms p50, cpu 8.6 -> 8.2 ms/answer; c=1"
    )


def test_lines_that_differ_in_their_words_are_shown_not_averaged():
    summary = ab.side_by_side(["overhead: cpu 8 ms"], ["openai: cpu 7 ms"])
    assert summary.startswith("the two trees print different last lines")
