"""`egress audit report --html` in a real browser (docs/audit-log.md#egress-audit-report):
headless Chromium (Debian's `chromium` package, installed by `./dev.sh test`) loads the page
from a file, the page logs nothing to the console, the DOM shows the counts of the log, and a
screenshot is kept as a test artifact (its path is printed).

Console messages are read from Chromium's own log (`--enable-logging=stderr --v=0` prints
each as `CONSOLE`); a page that does log an error is checked first, so a detector that sees
nothing cannot pass for a clean page.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from egress.audit.cli import audit_main
from egress.audit.log import AuditLog
from egress.audit.read import is_lifecycle, is_request

ARTIFACTS = Path(os.environ.get("EGRESS_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: ./dev.sh test installs Debian's package")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args, url],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip


def console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def load(page: Path) -> tuple[str, list[str]]:
    """The DOM after load, and the console messages logged while loading."""
    done = chromium("--dump-dom", url=page.resolve().as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, console_messages(done.stderr)


def screenshot(page: Path, name: str, capsys: pytest.CaptureFixture[str]) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    done = chromium(
        f"--screenshot={shot}", "--window-size=1200,2000", "--hide-scrollbars",
        url=page.resolve().as_uri(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.stat().st_size > 10_000  # a rendered page, not an empty canvas
    with capsys.disabled():
        print(f"\n[artifact] screenshot of {page.name}: {shot}")
    return shot


class Dom(HTMLParser):
    """Elements by tag, with their attributes and the text they contain."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def find(self, tag: str, **want: str) -> list[dict[str, str]]:
        return [
            attrs
            for name, attrs in self.elements
            if name == tag
            and all(attrs.get(k.rstrip("_").replace("_", "-")) == v for k, v in want.items())
        ]


def test_the_console_detector_sees_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><script>console.error("seen-it")</script>')
    _, messages = load(bad)
    assert any("seen-it" in m for m in messages), messages


@pytest.mark.netns
async def test_the_demo_report_in_chromium(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from servers import run

    log = tmp_path / "demo.jsonl"
    rc, out, err = await run(
        sys.executable, "-m", "egress.demo", "--audit-log", str(log), timeout=120
    )
    assert rc == 0, out + err
    page = tmp_path / "report.html"
    assert audit_main(["report", "--html", str(page), str(log)]) == 0
    capsys.readouterr()
    dom_text, messages = load(page)
    assert messages == []
    shot = screenshot(page, "audit-report-demo", capsys)
    assert shot.exists()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    requests = [r for r in records if is_request(r)]
    blocked = {str(r["host"]) for r in requests if r["decision"] == "block"}
    dom = Dom(dom_text)
    assert dom.find("div", id="verify")[0]["data-ok"] == "true"
    counts = {a["data-count"]: a for a in dom.find("td") if "data-count" in a}
    assert set(counts) >= {"requests", "block", "allow", "error", "lifecycle"}
    cells = re.findall(r'<td class="n" data-count="(\w+)">(\d+)</td>', dom_text)
    shown = {name: int(n) for name, n in cells}
    assert shown["requests"] == len(requests)
    assert shown["block"] == sum(1 for r in requests if r["decision"] == "block")
    assert shown["lifecycle"] == sum(1 for r in records if is_lifecycle(r))
    hosts = {a["data-host"]: int(a["data-blocks"]) for a in dom.find("tr", class_="blocked-host")}
    assert set(hosts) == blocked
    assert sum(hosts.values()) == shown["block"]
    hashes = [a["data-hash"] for a in dom.find("tr", class_="policy")]
    assert hashes == [r["policy"] for r in records if r.get("type") == "policy"]
    assert len(dom.find("tr", class_="timeline")) == 1  # the demo's one sandbox
    assert dom.find("svg")  # the charts are inline SVG
    assert {a["data-event"] for a in dom.find("tr", class_="lifecycle")} == {
        "sandbox_added",
        "sandbox_removed",
    }
    # the same log exported for a SIEM passes the published OCSF schema
    import jsonschema
    from ocsf_json_schema import OcsfJsonSchemaEmbedded, get_ocsf_schema

    assert audit_main(["export", "--format", "ocsf", str(log)]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(events) == len(requests)
    schema = OcsfJsonSchemaEmbedded(get_ocsf_schema(version="1.7.0"))
    names = {4001: "network_activity", 4002: "http_activity", 4003: "dns_activity"}
    for event in events:
        js = schema.get_class_schema(
            class_name=names[event["class_uid"]], profiles=["security_control"]
        )
        assert not list(jsonschema.Draft202012Validator(js).iter_errors(event)), event


HOSTILE_HOST = '<script>alert("host")</script>.test'
HOSTILE_DETAIL = '"><img src=x onerror=alert(1)><style>body{display:none}</style>'


async def test_a_hostile_log_is_shown_never_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "audit.jsonl"
    async with AuditLog(str(log)) as audit:
        audit.record(
            {
                "client": "198.18.0.2:1",
                "client_id": "</td><script>x()</script>",
                "method": "GET",
                "scheme": "http",
                "host": HOSTILE_HOST,
                "port": 80,
                "path": "/\u202etxt.exe\x1b[31m",
                "decision": "block",
                "reason": "default_deny",
                "rule": '"><b>rule\u202etxt\x1b[31m',
                "detail": HOSTILE_DETAIL,
            }
        )
        audit.record({"type": "policy", "client_id": "<i>c</i>", "policy": '"><x>',
                      "source": "api", "canonical": {"allow": ["<u>a</u>"]}})  # fmt: skip
    page = tmp_path / "report.html"
    assert audit_main(["report", "--html", str(page), str(log)]) == 0
    capsys.readouterr()
    source = page.read_text()
    # self-contained: nothing is fetched, nothing runs (the SVG namespace is a name, not a fetch)
    assert "<script" not in source
    assert not re.search(r"\b(src|href)=|@import|url\(", source)
    assert re.findall(r"https?://[^\"' <]+", source) == ["http://www.w3.org/2000/svg"] * len(
        re.findall("<svg", source)
    )
    dom_text, messages = load(page)
    assert messages == []
    dom = Dom(dom_text)
    assert not dom.find("script")
    assert not dom.find("img")
    assert not dom.find("style")[1:]  # only the page's own stylesheet
    for tag in ("b", "i", "u", "x"):
        assert not dom.find(tag), tag
    text = "".join(dom.text)
    assert HOSTILE_HOST in text  # shown as text
    assert "\\u202e" in source  # bidi and terminal controls are shown escaped
    assert "\\x1b" in source
    hosts = [a["data-host"] for a in dom.find("tr", class_="blocked-host")]
    assert hosts == [HOSTILE_HOST]
    screenshot(page, "audit-report-hostile", capsys)


async def test_reached_hosts_clients_and_errors_in_chromium(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The report's tables of what the agent reached, its clients, errors and kinds load
    in a real browser without a console message, with their counts (issue 32)."""
    log = tmp_path / "audit.jsonl"
    base = {"method": "CONNECT", "scheme": "https", "port": 443, "rule": None}
    async with AuditLog(str(log)) as audit:
        for n in range(5):
            audit.record({**base, "client": f"198.18.0.2:{n}", "client_id": "task-7",
                          "host": "pypi.org", "decision": "allow", "reason": "allow_rule",
                          "rule": "pypi.org", "bytes_up": 10, "bytes_down": 900})  # fmt: skip
        audit.record({**base, "client": "198.18.0.3:1", "client_id": "task-8", "method": "GET",
                      "scheme": "http", "host": "api.test", "port": 80, "decision": "allow",
                      "reason": "allow_rule", "rule": "http://api.test"})  # fmt: skip
        audit.record({**base, "client": "198.18.0.3:2", "client_id": "task-8",
                      "host": "gone.test", "decision": "error", "reason": "dns_error",
                      "detail": "gone.test: name does not resolve"})  # fmt: skip
        audit.record({"client": "198.18.0.3:3", "method": "-", "scheme": "", "host": "",
                      "port": 0, "decision": "error", "reason": "bad_request", "rule": None,
                      "detail": "request line is not 'method SP target SP version'"})  # fmt: skip
        audit.record({**base, "client": "198.18.0.3:4", "client_id": "task-8",
                      "host": "evil.test", "decision": "block",
                      "reason": "default_deny"})  # fmt: skip
    page = tmp_path / "report.html"
    assert audit_main(["report", "--html", str(page), str(log)]) == 0
    capsys.readouterr()
    assert page.stat().st_mode & 0o777 == 0o600
    dom_text, messages = load(page)
    assert messages == []
    screenshot(page, "audit-report-reached", capsys)
    dom = Dom(dom_text)
    reached = {a["data-host"]: a for a in dom.find("tr", class_="reached-host")}
    assert (reached["pypi.org"]["data-tunnels"], reached["api.test"]["data-requests"]) == (
        "5",
        "1",
    )
    clients = {a["data-client"] for a in dom.find("tr", class_="client")}
    assert clients == {"task-7", "task-8", "198.18.0.3"}
    errors = {a["data-reason"] for a in dom.find("tr", class_="error-row")}
    assert errors == {"dns_error", "bad_request"}
    kinds = {a["data-kind"]: a["data-allow"] for a in dom.find("tr", class_="kind")}
    assert (kinds["tunnel"], kinds["request"]) == ("5", "1")
