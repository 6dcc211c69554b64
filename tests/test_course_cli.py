"""``python -m ropekit.course``: list, task, template and check from a terminal (the installed wheel runs it too:
tools/check_wheel.sh)."""

import pytest

from ropekit.course import solution_source
from ropekit.course.__main__ import main


def test_list_names_every_exercise(capsys):
    assert main(["list"]) == 0
    assert capsys.readouterr().out.split("\n")[0].split()[0] == "01_rotate_pair"


@pytest.mark.parametrize("source, code, verdict", [
    ("template", 1, "not yet solved"),
    ("solution", 0, "PASSED"),
], ids=["template-is-not-solved", "solution-passes"])
def test_check_grades_the_readers_file(tmp_path, capsys, source, code, verdict):
    mine = tmp_path / "mine.py"
    if source == "template":
        assert main(["template", "01_rotate_pair"]) == 0
        mine.write_text(capsys.readouterr().out)
    else:
        mine.write_text(solution_source("01_rotate_pair"))
    assert main(["check", "01_rotate_pair", str(mine)]) == code
    assert verdict in capsys.readouterr().out


def test_a_file_without_the_entry_says_which_name_it_needs(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("def something_else(): pass\n")
    with pytest.raises(SystemExit, match="no 'rotate_pair'"):
        main(["check", "01_rotate_pair", str(mine)])


def test_an_unknown_exercise_is_a_usage_error_listing_the_exercises(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["task", "nope"])
    assert exit_.value.code == 2 and "01_rotate_pair" in capsys.readouterr().err
