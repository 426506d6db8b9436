"""The CLI explains itself (issue 22): versions, and errors that name the file, field or
listener and suggest the likely intent. Each case failed (said less) before."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

import egress
import netcut
from egress.audit.cli import audit_main
from egress.cli import main


def egress_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return code, out, err


def test_versions_come_from_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert egress.__version__ == netcut.__version__ == version("egress-netcut")
    code, out, _ = egress_cli(capsys, "--version")
    assert (code, out) == (0, f"egress {egress.__version__}\n")
    done = subprocess.run(
        [sys.executable, "-m", "netcut.cli", "--version"], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, f"netcut {netcut.__version__}\n")


def test_changelog_exists_and_names_this_version() -> None:
    text = (Path(__file__).parents[2] / "CHANGELOG.md").read_text()
    assert f"({egress.__version__})" in text


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('allow = ["example.com/v1"]', "allow rule 'example.com/v1'"),
        ('block = [".evil.test"]', "block rule '.evil.test'"),
        ('resolve = ["a.test"]', "resolve 'a.test': expected NAME=ADDR"),
        ('framework_routes = ["ftp://x"]', "framework route 'ftp://x'"),
        ('reserve = ["10.0.0.1/8"]', "reserve: '10.0.0.1/8' has host bits set"),
        (
            '[clients.a]\ntoken = "t"\nallow = ["a.test/x"]',
            "client 'a': allow rule 'a.test/x'",
        ),
    ],
    ids=["allow", "block", "resolve", "route", "reserve", "client"],
)
def test_policy_file_errors_name_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, expected: str
) -> None:
    policy = tmp_path / "team.toml"
    policy.write_text(content + "\n")
    code, _, err = egress_cli(capsys, "check", "--policy", str(policy), "x.test")
    assert code == 2
    assert err.startswith(f"egress check: policy file {str(policy)!r}: "), err
    assert expected in err


@pytest.mark.parametrize(
    ("rule", "hint"),
    [
        ("example.com/v1", "did you mean 'example.com' or 'https://example.com'?"),
        ("192.168.1.0/24:443", "did you mean '192.168.1.0/24' (ports 80 and 443) or "
         "'192.168.1.0/24:*' (every port)?"),
        (".example.com", "did you mean '*.example.com' (it and its subdomains) or 'example.com'?"),
        ("192.168.1.5/24", "did you mean '192.168.1.0/24'?"),
    ],
    ids=["path", "cidr-port", "leading-dot", "host-bits"],
)  # fmt: skip
def test_natural_mistakes_get_the_likely_intent(
    capsys: pytest.CaptureFixture[str], rule: str, hint: str
) -> None:
    code, _, err = egress_cli(capsys, "check", "--allow", rule, "x.test")
    assert code == 2
    assert hint in err, err


def test_reserve_rejects_host_bits(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = egress_cli(capsys, "check", "--reserve", "10.0.0.1/8", "x.test")
    assert code == 2
    assert "'10.0.0.1/8' has host bits set: did you mean '10.0.0.0/8'" in err
    assert egress_cli(capsys, "check", "--reserve", "10.0.0.0/8", "x.test")[0] == 1


def test_listen_port_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = egress_cli(capsys, "serve", "--listen", "127.0.0.1:99999")
    assert code == 2
    assert "port 99999 is out of range (0-65535" in err
    assert "expected HOST:PORT" not in err


def test_a_mistyped_serve_flag_shows_serves_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = egress_cli(capsys, "serve", "--lisen", "127.0.0.1:0")
    assert code == 2
    assert err.startswith("usage: egress serve "), err
    assert "egress serve: error: unrecognized arguments: --lisen" in err


@pytest.mark.parametrize("flag", ["--socks", "--admin", "--listen"])
def test_address_in_use_names_the_listener(flag: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        extra = [] if flag == "--listen" else ["--listen", "127.0.0.1:0"]
        done = subprocess.run(
            [sys.executable, "-m", "egress.cli", "serve", *extra, flag, address],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 2
    assert (
        done.stderr == f"egress serve: cannot listen on {flag} {address}: address already in use\n"
    )


def test_unknown_filter_reason_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_text("")
    code = audit_main(["filter", "--reason", "reserverd_address", str(log)])
    err = capsys.readouterr().err
    assert code == 2
    assert "--reason 'reserverd_address': not a reason code; did you mean reserved_address?" in err
    assert audit_main(["filter", "--mode", "sock5", str(log)]) == 2
    assert "invalid choice: 'sock5'" in capsys.readouterr().err
    assert audit_main(["filter", "--reason", "sandbox_removed", "--mode", "socks5", str(log)]) == 0


def test_lint_flags_rules_the_guard_makes_useless(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = egress_cli(capsys, "check", "--lint", "--allow", "127.0.0.1:8089")
    assert code == 0  # lint only: findings never change the exit code
    assert out.startswith("lint: allow rule '127.0.0.1:8089': the address guard refuses")
    assert "framework_routes = ['http://127.0.0.1:8089']" in out
    _, out, _ = egress_cli(capsys, "check", "--lint", "--allow", "198.18.0.0/15")
    assert out == ""
