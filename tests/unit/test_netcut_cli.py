"""netcut CLI: bad usage and bad input exit 2 with a one-line error, no traceback."""

from __future__ import annotations

import pytest

from netcut.cli import main


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "required"),
        (["cut"], "one of the arguments"),
        (["cut", "--netns", "a", "--pid", "1"], "not allowed with"),
        (["cut", "--netns", "a/b"], "--netns 'a/b'"),
        (["cut", "--netns", "x", "--keep", "example.com:80"], "not an IP address"),
        (["cut", "--netns", "x", "--keep", "1.2.3.4:99999"], "port must be"),
        (["probe", "--pid", "nope"], "--pid 'nope'"),
        (["status", "--netns", "x", "--runtime", "docker"], "apply to --container only"),
        (["status", "--netns", "x", "--namespace", "k8s.io"], "apply to --container only"),
        (
            ["cut", "--container", "c", "--runtime", "docker", "--namespace", "k8s.io"],
            "--namespace 'k8s.io': applies to the containerd runtime only",
        ),
        (["cut", "--netns", "x", "--expect-blocked", "1.2.3.4"], "give ADDR:PORT"),
        (["cut", "--netns", "x", "--expect-blocked", "[::1]"], "give ADDR:PORT"),
        (["probe", "--netns", "x", "--expect-blocked", "host:80"], "not an IP address"),
        (["cut", "--container", "c", "--runtime", "lxc"], "invalid choice"),
        (["restore", "--netns-path", "rel/path"], "absolute path"),
        (["probe", "--netns", "x", "--expect-reachable", "1.2.3.4"], "give ADDR:PORT"),
        (["probe", "--netns", "x", "--timeout", "-1"], "more than 0"),
        (["cut", "--netns", "x", "--probe-timeout", "soon"], "give seconds"),
    ],
    ids=[
        "no-command",
        "no-target",
        "two-targets",
        "slash-name",
        "name-keep",
        "big-port",
        "bad-pid",
        "runtime-without-container",
        "namespace-without-container",
        "namespace-with-docker",
        "cut-portless-blocked",
        "cut-portless-v6-blocked",
        "probe-name-blocked",
        "bad-runtime",
        "relative-path",
        "portless",
        "negative-timeout",
        "text-timeout",
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_json_errors_are_json_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["status", "--netns", "ncnope-json", "--json"]) == 2
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["result"] == "error"
    assert data["exit_code"] == 2
    assert data["kind"] in ("TargetNotFound", "PrivilegeError")
    assert "netcut: error:" in out.err


def test_usage_errors_are_json_with_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    with pytest.raises(SystemExit) as info:
        main(["cut", "--netns", "x", "--bogus", "--json"])
    assert info.value.code == 2
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["result"] == "error"
    assert data["kind"] == "UsageError"
    assert data["exit_code"] == 2
    assert "error: unrecognized arguments: --bogus" in out.err
    with pytest.raises(SystemExit):
        main(["cut", "--netns", "x", "--bogus"])
    assert capsys.readouterr().out == ""  # without --json, stdout stays empty


@pytest.mark.parametrize("command", ["cut", "probe"])
def test_every_cut_and_probe_flag_has_help(command: str) -> None:
    from netcut.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and command in a.choices)
    assert isinstance(sub.choices, dict)
    flags = [a for a in sub.choices[command]._actions if a.option_strings]
    assert len(flags) > 8
    silent = [a.option_strings[0] for a in flags if not a.help]
    assert silent == []


def test_status_exit_codes_are_distinct_and_documented() -> None:
    import pathlib

    from netcut.cli import STATUS_EXIT

    assert STATUS_EXIT["cut"] == 0
    assert len(set(STATUS_EXIT.values())) == 3
    assert not {1, 2} & {STATUS_EXIT["partial"], STATUS_EXIT["not cut"]}, "1 and 2 mean others"
    docs = (pathlib.Path(__file__).parents[2] / "docs" / "netcut.md").read_text()
    for state, code in STATUS_EXIT.items():
        assert f"**{code}** `{state}`" in docs
