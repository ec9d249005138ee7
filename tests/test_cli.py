"""`python -m speclib COMMAND`: every command answers --help without doing its work, and sees its own arguments."""

import subprocess
import sys

import pytest

from speclib.__main__ import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_answers_help(command, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert f"python -m speclib {command}" in capsys.readouterr().out


def test_unknown_or_missing_command_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "speclib", "nosuch"], capture_output=True, text=True)
    assert out.returncode == 2 and all(c in out.stderr for c in COMMANDS)
    assert subprocess.run([sys.executable, "-m", "speclib", "--help"], capture_output=True).returncode == 0


def test_a_command_sees_its_own_arguments(monkeypatch):
    """Model cards record `python -m speclib train ...` from sys.argv: the command name must not appear twice."""
    seen = {}
    monkeypatch.setitem(COMMANDS, "probe", ("tests_cli_probe", ""))
    monkeypatch.setitem(sys.modules, "tests_cli_probe", type(sys)("tests_cli_probe"))
    sys.modules["tests_cli_probe"].main = lambda argv: seen.update(argv=argv, sys_argv=list(sys.argv))
    monkeypatch.setattr(sys, "argv", ["x"])
    with pytest.raises(SystemExit):
        main(["probe", "model", "a"])
    assert seen == {"argv": ["model", "a"], "sys_argv": ["python -m speclib probe", "model", "a"]}
