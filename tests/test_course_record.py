"""ropekit.course.record: a number quoted from the tuning record is found in the section named, and only there."""

import pytest

from ropekit.course import record


def test_a_quote_from_its_section_passes():
    rows = record.show_quotes({"eviction-hints": ["117.6", "115.6"], "flat-path": ["84.30"]})
    assert rows == [("eviction-hints", "117.6, 115.6"), ("flat-path", "84.30")]


def test_a_number_from_another_section_fails():
    with pytest.raises(AssertionError, match="eviction-hints"):
        record.show_quotes({"eviction-hints": ["84.30"]})  # a flat-path number


def test_a_prefix_of_a_number_is_not_a_match():
    with pytest.raises(AssertionError):
        record.show_quotes({"eviction-hints": ["117"]})  # the record writes 117.6


def test_an_unknown_section_is_named():
    with pytest.raises(KeyError, match="anchor"):
        record.section("no-such-section")


def test_without_a_clone_the_error_says_where_the_record_lives(tmp_path):
    """An installed wheel ships no docs/: the error names the file and says that a clone has it."""
    with pytest.raises(FileNotFoundError, match="docs/tuning.md of a clone"):
        record.section("eviction-hints", tmp_path / "docs" / "tuning.md")
