"""The command line's help speaks plain text to users and its options take what users
type (the subcommands' own output is tested with them: test_bench.py, test_explain.py,
test_package_facts.py)."""
import argparse
import re

import pytest

from resnorm.__main__ import _parser, main

# reST markup, which argparse prints as it is
MARKUP = re.compile(r"`|::|:(?:func|class|meth|mod|data|attr):|\.\. ")


def _subparsers():
    (sub,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def _help(capsys, *argv):
    with pytest.raises(SystemExit) as exit:
        main([*argv, "--help"])
    assert exit.value.code == 0
    return capsys.readouterr().out


def test_subcommands_are_found():
    assert {"bench", "explain", "demo", "info", "checks"} <= set(_subparsers())


@pytest.mark.parametrize("command", [None, *_subparsers()])
def test_help_is_plain_text(capsys, command):
    text = _help(capsys, *([command] if command else []))
    assert text.startswith("usage: resnorm")
    assert not MARKUP.search(text), MARKUP.search(text)


@pytest.mark.parametrize("command", list(_subparsers()))
def test_every_option_says_what_it_does(command):
    parser = _subparsers()[command]
    bare = [a.option_strings[0] for a in parser._actions
            if a.option_strings and not a.help and not isinstance(a, argparse._HelpAction)]
    assert not bare, f"{command}: options without help: {bare}"


def test_explain_takes_values_that_start_with_a_minus_sign(capsys):
    assert main(["explain", "rms", "--x", "-1,2,3", "--weight", "-0.5,1,2",
                 "--dy", "-1,-2,0.5"]) == 0
    glued = capsys.readouterr().out
    # the same as written with '=', which argparse takes as it is
    assert main(["explain", "rms", "--x=-1,2,3", "--weight=-0.5,1,2", "--dy=-1,-2,0.5"]) == 0
    assert capsys.readouterr().out == glued
    assert "-0.5" in glued


def test_explain_takes_a_negative_first_row_of_several(capsys):
    assert main(["explain", "layer", "--x", "-1,2;3,-4", "--bias", "-.5,0"]) == 0
    assert "-4" in capsys.readouterr().out


def test_explain_gated_rms_flags(capsys):
    # --gate takes a first value with a minus sign like the other arrays; --group-size an int
    assert main(["explain", "gated-rms", "--x", "1,2,3,4", "--gate", "-1,0.5,2,1",
                 "--group-size", "2", "--norm-before-gate"]) == 0
    out = capsys.readouterr().out
    assert "z = [-1, 0.5, 2, 1]" in out and "norm before the gate" in out
    with pytest.raises(SystemExit) as exit:
        main(["explain", "gated-rms", "--x", "1,2", "--group-size", "one"])
    assert exit.value.code == 2 and "invalid int value" in capsys.readouterr().err
