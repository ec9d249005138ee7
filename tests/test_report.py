"""The README's generated blocks (speclib.workbook.report): the committed README says what the committed
results say, intervals never round past a threshold, and a broken section is an error, not a gap."""

import re

import pytest

from speclib.workbook import report, results


def _block(text: str, marker: str) -> str:
    return re.search(rf"<!-- {marker} -->\n(.*?)\n<!-- /{marker} -->", text, flags=re.S).group(1)


def test_readme_blocks_are_what_report_generates_from_the_committed_results(monkeypatch):
    monkeypatch.delenv("SPECLIB_OUT", raising=False)  # the committed data/results, whatever a test set
    stale = "out of date: run `python -m speclib report`"
    assert _block(report.README.read_text(), "headlines") == report.headline_table(), f"README {stale}"
    page = report.RESULTS_PAGE.read_text()
    assert _block(page, "results-table") == report.table(), f"docs/results.md {stale}"
    assert _block(page, "provenance") == report.provenance_table(), f"docs/results.md provenance {stale}"
    assert len(report.provenance_table().splitlines()) > 40  # every committed step has a row
    assert _block(report.USAGE_PAGE.read_text(), "support-matrix") == report.support_table()


def test_every_notebook_has_one_headline_in_the_readme():
    notebooks = sorted(p.stem for p in (report.REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert list(report.HEADLINES) == notebooks
    rows = report.headline_table().splitlines()[2:]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == notebooks


def test_readme_is_a_front_door():
    text = report.README.read_text()
    assert len(text.splitlines()) <= 150
    assert "make test" in text and "docs/usage.md" in text and "docs/results.md" in text


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
