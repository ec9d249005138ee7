"""The README's generated blocks (speclib.workbook.report): the committed README says what the committed
results say, intervals never round past a threshold, and a broken section is an error, not a gap."""

import re

import pytest

from speclib.workbook import report, results


def _block(text: str, marker: str) -> str:
    return re.search(rf"<!-- {marker} -->\n(.*?)\n<!-- /{marker} -->", text, flags=re.S).group(1)


def test_readme_blocks_are_what_report_generates_from_the_committed_results(monkeypatch):
    monkeypatch.delenv("SPECLIB_OUT", raising=False)  # the committed data/results, whatever a test set
    text = report.README.read_text()
    assert _block(text, "results-table") == report.table(), "README out of date: run `python -m speclib report`"
    assert _block(text, "support-matrix") == report.support_table()


@pytest.mark.parametrize(
    "lo, hi, want",
    [
        (0.996, 1.342, "0.99–1.35"),
        (1.0, 1.34, "1.00–1.34"),
        (1.002, 1.17, "1.00–1.17"),
        (0.7349, 1.0701, "0.73–1.08"),
        (float("nan"), 1.0, "n/a"),
    ],
)
def test_intervals_round_outward(lo, hi, want):
    assert report.ci(lo, hi) == want


def test_a_missing_result_is_not_run_yet_and_any_other_error_is_raised(monkeypatch):
    def missing():
        return results.load("99_nothing/here")

    monkeypatch.setattr(report, "SECTIONS", {"99_nothing": missing})
    assert "(not run yet: `make figures`)" in report.table()

    def broken():
        raise KeyError("a column the section expects")

    monkeypatch.setattr(report, "SECTIONS", {"99_broken": broken})
    with pytest.raises(KeyError):
        report.table()
