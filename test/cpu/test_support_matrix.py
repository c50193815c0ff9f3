"""The README's support matrix is the capability rows' own rendering: a row that changes without the README
(or a README edited by hand) fails here. Fix: `python -m frost.lowering.support_matrix`."""

from __future__ import annotations

from pathlib import Path

from frost.lowering import support_matrix
from frost.lowering.capabilities import ROWS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_matrix_matches_the_capability_rows():
    text = README.read_text()
    block = support_matrix.readme_block(text)
    assert block, "README.md lost its support-matrix markers"
    assert block == support_matrix.render(), "README's support matrix is stale: python -m frost.lowering.support_matrix"


def test_a_changed_row_changes_the_matrix():
    """The comparison above can fail: dropping a feature, a head dim or an arch from a row changes the block."""
    base = support_matrix.render()
    sm90 = next(r for r in ROWS if r.name == "SdpaFwdDslSm90")
    for change in (
        {"features": sm90.features - {"sinks"}},
        {"cc_min": (8, 9)},
        {"head_dims": ((64, 64), (128, 128))},
        {"pending": "not yet"},
    ):
        rows = tuple(r.model_copy(update=change) if r is sm90 else r for r in ROWS)
        assert support_matrix.render(rows) != base, change


def test_check_mode_reports_a_stale_readme(tmp_path):
    stale = tmp_path / "README.md"
    stale.write_text(README.read_text().replace("| GQA / MQA |", "| GQA |"))
    assert support_matrix.main(["--readme", str(stale), "--check"]) == 1
    assert support_matrix.main(["--readme", str(stale)]) == 0  # rewrites it
    assert support_matrix.main(["--readme", str(stale), "--check"]) == 0


def test_every_row_feature_has_a_matrix_row():
    """A feature added to a capability row must be shown (a row in FEATURES) or said not to be (NOT_SHOWN)."""
    shown = {f for _, needs in support_matrix.FEATURES for f in needs} | set(support_matrix.NOT_SHOWN)
    missing = {f for row in ROWS for f in row.features} - shown
    assert not missing, f"features the README's matrix does not show: {sorted(missing)} (add them to FEATURES)"
