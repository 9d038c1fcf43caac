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
