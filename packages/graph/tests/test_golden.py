"""check_golden: compares a pass's output with a file's expected part, rewrites it only when asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.graph import check_golden, read_golden


def _upper(text: str) -> str:
    return text.upper()


def test_a_missing_file_fails_unless_updating(tmp_path: Path) -> None:
    path = tmp_path / "case.txt"
    with pytest.raises(AssertionError, match="does not exist: run the test with --update-golden"):
        check_golden(path, _upper, describe="upper", update=False, input="abc")
    check_golden(path, _upper, describe="upper", update=True, input="abc")
    assert path.read_text() == "# golden: upper\n\nabc\n# ---- expected ----\nABC\n"
    check_golden(path, _upper, describe="upper", update=False)  # passes now


def test_a_changed_output_fails_with_a_diff_and_update_rewrites_it(tmp_path: Path) -> None:
    path = tmp_path / "case.txt"
    path.write_text("# golden: upper\n# a note kept on rewrite\n\nline one\nline two\n# ---- expected ----\nLINE ONE\nLINE 2\n")
    with pytest.raises(AssertionError, match=r"(?s)differs.*-LINE 2\n\+LINE TWO"):
        check_golden(path, _upper, describe="upper", update=False)
    check_golden(path, _upper, describe="ignored", update=True)
    golden = read_golden(path)
    assert golden.header == "# golden: upper\n# a note kept on rewrite"
    assert (golden.input, golden.expected) == ("line one\nline two", "LINE ONE\nLINE TWO")


def test_a_changed_input_fails_unless_updating(tmp_path: Path) -> None:
    path = tmp_path / "case.txt"
    check_golden(path, _upper, describe="upper", update=True, input="abc")
    with pytest.raises(AssertionError, match="the input changed"):
        check_golden(path, _upper, describe="upper", update=False, input="abd")
    check_golden(path, _upper, describe="upper", update=True, input="abd")
    assert read_golden(path).expected == "ABD"


def test_a_file_without_the_separator_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("# golden: x\n\nno expected part\n")
    with pytest.raises(ValueError, match="expected ----"):
        check_golden(path, _upper, describe="x", update=False)
