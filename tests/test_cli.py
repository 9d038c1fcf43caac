import argparse
import os
import signal
import time

import pytest

from qkv.cli import main


def help_text(capsys: pytest.CaptureFixture[str], command: str) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())  # one line, as wide as any terminal


def test_help_names_each_option_default_once(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text(capsys, "translate")
    assert "beam size, 1 = greedy (default 5)" in text
    assert "GNMT length penalty exponent (default 0.6)" in text
    assert "(default 0: all)" in text and "(default 0: all) (default" not in text  # --top-k
    assert "sample instead of searching -" in text  # a flag: no default
    assert "one sentence per line (default stdin)" in text  # said by the help itself
    assert "(default None)" not in text
    assert "random seed (default 1)" in help_text(capsys, "demo")


@pytest.mark.parametrize("command", ["plot", "translate"])
def test_sigterm_stops_a_command_as_ctrl_c_does(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def terminated(args: argparse.Namespace) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises first
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(f"qkv.commands.{command}.run", terminated)
    before = signal.getsignal(signal.SIGTERM)
    assert main([command, "RUN"]) == 130
    assert capsys.readouterr().err == "qkv: interrupted\n"
    assert signal.getsignal(signal.SIGTERM) == before  # restored for the caller


def test_an_unknown_argument_is_named_with_a_hint_where_one_fits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, hint in (
        (["translate", "RUN", "in.de"], True),
        (["classify", "RUN", "texts.txt"], True),
        (["translate", "RUN", "--bogus"], False),
        (["plot", "RUN", "extra"], False),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert f"unrecognized arguments: {argv[-1]}" in err
        assert ("(give an input file with --input FILE)" in err) == hint
