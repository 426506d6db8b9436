"""Policy files and per-client policies."""

from pathlib import Path

import pytest

from egress.config import build_settings, load_policy_file
from egress.errors import PolicyError
from egress.policy.target import make_target

FILE = """
default = "deny"
allow = ["pypi.org"]
block = ["evil.example"]
framework_routes = ["http://127.0.0.1:8080"]
resolve = { "pypi.org" = "198.18.0.9" }

[clients.open-sandbox]
token = "t-open"
default = "allow"
"""


def test_clients_keep_top_level_blocks_and_routes(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text(FILE)
    settings = build_settings(load_policy_file(str(f)))
    (client,) = settings.clients
    assert client.client_id == "open-sandbox"
    assert client.policy.decide(make_target("https", "anything.example", 443)).allowed
    d = client.policy.decide(make_target("https", "evil.example", 443))
    assert (d.allowed, d.rule) == (False, "evil.example")
    assert client.policy.decide(make_target("http", "127.0.0.1", 8080)).reason == "framework_route"
    assert [str(a) for a in settings.resolve["pypi.org"]] == ["198.18.0.9"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('default = "maybe"', "default"),
        ("allow = 3", "list of strings"),
        ("bogus = 1", "unknown"),
        ("[clients.x]\nallow = []", "token"),
        ('resolve = ["a.test=nope"]', "not an IP"),
        ("allow = [", "invalid TOML"),
    ],
)
def test_bad_files_name_the_culprit(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(PolicyError) as info:
        build_settings(load_policy_file(str(f)))
    assert needle in str(info.value)
