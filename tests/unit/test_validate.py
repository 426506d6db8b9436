"""One validator (egress/validate.py) at every entry point (issue 11): wrong types fail
closed, naming the field.

Each case here failed open or crashed before: a string taken as a boolean or a list, a nan
timeout switching slow-client protection off, a traceback instead of a one-line error.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given

from egress import EgressProxy, Limits, Policy, PolicyError, prepare_execution
from egress.cli import main as egress_main
from egress.config import ClientSpec, Settings, build_settings, load_policy_file
from egress.policy.compose import from_harbor, from_verifiers
from egress.validate import as_bool, as_count, as_str_list, as_timeout
from netcut.cli import main as netcut_main

# --- the validator itself -----------------------------------------------------------------


@given(st.one_of(st.text(), st.integers(), st.none(), st.floats(), st.lists(st.booleans())))
def test_only_real_booleans_are_booleans(value: object) -> None:
    with pytest.raises(TypeError, match="flag"):
        as_bool(value, "flag")


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_timeouts_are_finite_and_positive(value: float) -> None:
    if math.isfinite(value) and value > 0:
        assert as_timeout(value, "t") == value
    else:
        with pytest.raises(ValueError, match="t must be a finite number"):
            as_timeout(value, "t")


@given(st.text())
def test_a_string_is_never_a_list(value: str) -> None:
    with pytest.raises(TypeError, match="field must be a list"):
        as_str_list(value, "field")


@pytest.mark.parametrize("value", [True, "3", 3.0, None], ids=["bool", "str", "float", "none"])
def test_counts_are_ints(value: object) -> None:
    with pytest.raises(TypeError, match="n must be an integer"):
        as_count(value, "n")


# --- Python API ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"allow": "*"}, "Policy allow"),
        ({"block": "evil.test"}, "Policy block"),
        ({"allow": b"x"}, "Policy allow"),
        ({"allow": [1]}, "Policy allow"),
        ({"framework_routes": "http://127.0.0.1:1"}, "Policy framework_routes"),
        ({"default": False}, "default"),
        ({"allow": {"a": 1}}, "Policy allow"),
    ],
    ids=[
        "allow-str",
        "block-str",
        "allow-bytes",
        "allow-int-item",
        "routes-str",
        "default-bool",
        "allow-dict",
    ],
)
def test_policy_types(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(TypeError, match=needle):
        Policy(**kwargs)  # type: ignore[arg-type]


def test_policy_allow_star_string_allows_nothing_it_is_refused() -> None:
    # before: Policy(allow="*") iterated the characters and allowed every host
    with pytest.raises(TypeError):
        Policy(allow="*")
    assert Policy(allow=("a.test",)).allow_rules[0].text == "a.test"  # tuples are lists


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"head_timeout": 0}, ValueError),
        ({"head_timeout": math.nan}, ValueError),
        ({"idle_timeout": math.inf}, ValueError),
        ({"connect_timeout": -1.0}, ValueError),
        ({"head_timeout": "10"}, TypeError),
        ({"max_connections": 0}, ValueError),
        ({"max_connections": True}, TypeError),
        ({"max_head": 1.5}, TypeError),
    ],
    ids=["zero", "nan", "inf", "negative", "str", "zero-conns", "bool-conns", "float-head"],
)
def test_limits_are_validated_on_the_api_path(kwargs: dict[str, object], exc: type) -> None:
    name = next(iter(kwargs))
    with pytest.raises(exc, match=f"Limits {name}"):
        Limits(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "kwargs", "needle"),
    [
        (("x",), {}, "EgressProxy policy"),
        ((Policy(),), {"audit": "a.jsonl"}, "EgressProxy audit"),
        ((Policy(),), {"limits": {"head_timeout": 1}}, "EgressProxy limits"),
        ((Policy(),), {"sni_missing": "sometimes"}, "EgressProxy sni_missing"),
        ((Policy(),), {"listen": "127.0.0.1:0"}, "EgressProxy listen"),
    ],
    ids=["policy-str", "audit-path", "limits-dict", "sni-missing", "listen-str"],
)
def test_proxy_construction_refuses_wrong_types(
    args: tuple[object, ...], kwargs: dict[str, object], needle: str
) -> None:
    # before: these constructed, started, then answered every request with an empty reply
    with pytest.raises((TypeError, ValueError), match=needle):
        EgressProxy(*args, **kwargs)  # type: ignore[arg-type]


def test_settings_types() -> None:
    with pytest.raises(TypeError, match="Settings policy must be a Policy"):
        Settings("p")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Settings clients"):
        Settings(Policy(), clients=[ClientSpec("a", Policy(), "t")])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "exc", "needle"),
    [
        ({"token": ""}, ValueError, "token"),
        ({"token": 5}, TypeError, "token"),
        ({"client_id": ""}, ValueError, "client_id"),
        ({"policy": "p"}, TypeError, "policy"),
        ({"sources": ["198.18.0.0/24"]}, TypeError, "sources"),
    ],
    ids=["empty-token", "int-token", "empty-id", "policy-str", "sources-list"],
)
def test_client_spec_types(kwargs: dict[str, object], exc: type, needle: str) -> None:
    base: dict[str, object] = {"client_id": "a", "policy": Policy()}
    with pytest.raises(exc, match=needle):
        ClientSpec(**{**base, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "exc", "needle"),
    [
        ({"mode": "bogus"}, ValueError, "mode"),
        ({"policy": {}}, TypeError, "policy"),
        ({"sandbox": None}, TypeError, "sandbox"),
        ({"proxy": "p"}, TypeError, "proxy"),
        ({"proxy_port": 70000}, ValueError, "proxy_port"),
        ({"framework_routes": "http://127.0.0.1:1"}, TypeError, "framework_routes"),
        ({"expect_blocked": "1.2.3.4:80"}, TypeError, "expect_blocked"),
        ({"force": "false"}, TypeError, "force"),
        ({"token": ""}, ValueError, "token"),
        ({"cut_mode": "nsenter"}, ValueError, "cut_mode"),
        ({"cut_mode": 1}, TypeError, "cut_mode"),
        (
            {"sandbox": "docker:box", "mode": "gateway", "cut_mode": "helper", "helper_image": 3},
            TypeError,
            "helper_image",
        ),
        (
            {"mode": "gateway", "cut_mode": "helper"},
            ValueError,
            "cut_mode='helper' needs a container sandbox",
        ),
        (
            {"sandbox": "containerd:k8s.io/abc", "mode": "gateway", "cut_mode": "helper"},
            ValueError,
            "cut_mode='helper' does not apply to containerd",
        ),
    ],
    ids=[
        "mode",
        "policy-dict",
        "sandbox-none",
        "proxy-str",
        "port",
        "routes-str",
        "blocked-str",
        "force-str",
        "empty-token",
        "cut-mode",
        "cut-mode-int",
        "helper-image-int",
        "helper-not-container",
        "helper-containerd",
    ],
)
def test_prepare_execution_arguments(kwargs: dict[str, object], exc: type, needle: str) -> None:
    # refused before anything is opened or cut: no namespace needed to show it
    proxy = EgressProxy(Policy())
    base: dict[str, object] = {"sandbox": "egt-none", "policy": Policy(), "proxy": proxy}
    args = {**base, **kwargs}
    with pytest.raises(exc, match=f"prepare_execution {needle}"):
        asyncio.run(prepare_execution(**args))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "exc", "needle"),
    [
        ({"restore": "yes"}, TypeError, "restore"),
        ({"cut_mode": "nsenter"}, ValueError, "cut_mode"),
        (
            {"restore": True, "cut_mode": "helper"},
            ValueError,
            "cut_mode='helper' needs a container",
        ),
    ],
    ids=["restore-str", "cut-mode", "helper-not-container"],
)
def test_release_execution_arguments(kwargs: dict[str, object], exc: type, needle: str) -> None:
    # refused before the proxy side is released or anything restored
    from egress.boundary import Execution, release_execution

    proxy = EgressProxy(Policy())
    execution = Execution("egt-none", "egt-none", "http://x", {}, {}, "t")
    with pytest.raises(exc, match=f"release_execution {needle}"):
        asyncio.run(release_execution(proxy, execution, **kwargs))  # type: ignore[arg-type]


# --- framework mappings -------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        {"network_access": "false"},
        {"network_access": "true"},
        {"network_access": 0},
        {"network_access": None},
    ],
    ids=["str-false", "str-true", "int", "none"],
)
def test_verifiers_booleans_are_booleans(settings: dict[str, object]) -> None:
    # before: {'network_access': 'false'} gave default='allow'
    with pytest.raises(PolicyError, match="network_access must be a boolean"):
        from_verifiers(settings)


@pytest.mark.parametrize("value", ["false", "no", 1, None, False], ids=str)
def test_harbor_allow_internet_is_not_a_network_policy_key(value: object) -> None:
    # Harbor 0.26 ignores the deprecated `allow_internet` (a task with it alone is public):
    # a mapping that read it would disagree with Harbor, so it is refused by name
    with pytest.raises(PolicyError, match="unknown key"):
        from_harbor({"allow_internet": value})


@pytest.mark.parametrize("value", ["public", 1, None, ["allowlist"]], ids=str)
def test_harbor_network_mode_is_one_of_three(value: object) -> None:
    if value == "public":
        assert from_harbor({"network_mode": value}).default == "allow"
        return
    with pytest.raises(PolicyError, match="network_mode"):
        from_harbor({"network_mode": value})


def test_mappings_still_take_real_values() -> None:
    assert from_verifiers({"network_access": False}).default == "deny"
    assert from_harbor({"network_mode": "no-network"}).default == "deny"
    assert from_harbor({"network_mode": "public"}).default == "allow"
    with pytest.raises(PolicyError, match="allowed_hosts must be a list"):
        from_harbor({"network_mode": "allowlist", "allowed_hosts": "a.test"})


# --- policy file and command line ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('reserve_private = "false"', "'reserve_private' must be a boolean"),
        ("clients = 5", "'clients' must be a table"),
        ('clients = ["a"]', "'clients' must be a table"),
        ('[clients.a]\ntoken = ""', "client 'a': token must not be empty"),
        ("[clients.a]\ntoken = 5", "client 'a': token must be a string"),
        ("[clients.a]\ntoken_env = 5", "client 'a': token_env must be a string"),
        ('allow = "*"', "'allow' must be a list of strings"),
        ('[clients.a]\ntoken = "t"\nsources = "198.18.0.0/24"', "'sources' must be a list"),
        ('[clients.a]\ntoken = "t"\ndefault = true', "default must be"),
    ],
    ids=[
        "reserve-private-str",
        "clients-int",
        "clients-list",
        "empty-token",
        "int-token",
        "int-token-env",
        "allow-str",
        "sources-str",
        "default-bool",
    ],
)
def test_policy_file_types(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "p.toml"
    f.write_text(text)
    with pytest.raises(PolicyError, match=needle):
        build_settings(load_policy_file(str(f)))


def test_policy_file_not_utf8(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_bytes(b'allow = ["caf\xe9.test"]\n')
    with pytest.raises(PolicyError, match="not UTF-8"):
        load_policy_file(str(f))


def _one_line_error(capsys: pytest.CaptureFixture[str], rc: int, needle: str) -> None:
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"clients = 5", "'clients' must be a table"),
        (b'clients = ["a"]', "'clients' must be a table"),
        (b'[clients.a]\ntoken=""', "token"),
        (b'reserve_private = "false"', "reserve_private"),
    ],
    ids=["not-utf8", "clients-int", "clients-list", "empty-token", "reserve-private-str"],
)
def test_cli_policy_file_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, needle: str
) -> None:
    f = tmp_path / "p.toml"
    f.write_bytes(content)
    rc = egress_main(["check", "--policy", str(f), "a.test"])
    _one_line_error(capsys, rc, needle)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--head-timeout", "nan"),
        ("--idle-timeout", "nan"),
        ("--connect-timeout", "inf"),
        ("--head-timeout", "0"),
        ("--idle-timeout", "-5"),
        ("--audit-keep", "0"),
    ],
    ids=["head-nan", "idle-nan", "connect-inf", "head-zero", "idle-negative", "keep-zero"],
)
def test_cli_timeouts_finite_and_positive(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    rc = egress_main(["serve", "--listen", "127.0.0.1:0", flag, value])
    _one_line_error(capsys, rc, flag)


@pytest.mark.parametrize("port", ["٣١٢٨", "¹"], ids=["arabic-indic", "superscript"])
def test_cli_listen_port_is_ascii_digits(capsys: pytest.CaptureFixture[str], port: str) -> None:
    # before: "٣١٢٨" listened on 3128 (int() reads it), "¹" crashed in int()
    rc = egress_main(["serve", "--listen", f"127.0.0.1:{port}"])
    _one_line_error(capsys, rc, "expected HOST:PORT")


def test_netcut_cut_expect_blocked_needs_a_port(capsys: pytest.CaptureFixture[str]) -> None:
    # before: accepted and the cut applied; probe refused the same argument
    rc = netcut_main(["cut", "--netns", "egt-none", "--expect-blocked", "1.2.3.4"])
    _one_line_error(capsys, rc, "give ADDR:PORT")


# --- any file content: a PolicyError or Settings, nothing else ----------------------------

_SCALARS = st.one_of(
    st.booleans(),
    st.integers(-3, 70000),
    st.text(max_size=12),
    st.sampled_from(
        [
            "deny",
            "allow",
            "a.test",
            "198.18.0.0/24",
            "a.test=1.2.3.4",
            "http://127.0.0.1:8080",
            "",
            "*",
        ]
    ),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_CLIENT_KEYS = ["token", "token_env", "sources", "default", "allow", "block", "framework_routes"]
_TOP = ["default", "allow", "block", "framework_routes", "resolve", "reserve", "reserve_private"]


@given(
    top=st.dictionaries(st.sampled_from(_TOP), _VALUES, max_size=4),
    clients=st.none()
    | _VALUES
    | st.dictionaries(
        st.sampled_from(["a", "b"]),
        st.dictionaries(st.sampled_from(_CLIENT_KEYS), _VALUES, max_size=4) | _VALUES,
        max_size=2,
    ),
)
def test_any_file_data_is_settings_or_a_policy_error(
    top: dict[str, object], clients: object
) -> None:
    data = dict(top)
    if clients is not None:
        data["clients"] = clients
    message = ""
    try:
        settings = build_settings(data)
    except PolicyError as exc:  # the only error a file can cause: one line, naming the field
        message = str(exc)
    if message:
        assert "\n" not in message
    else:
        assert isinstance(settings.guard.reserve_private, bool)


@given(
    st.dictionaries(
        st.sampled_from(
            ["network_mode", "allow_internet", "allowed_hosts", "network_access", "allow", "block"]
        ),
        _VALUES,
    )
)
def test_any_task_settings_give_a_policy_or_a_policy_error(task: dict[str, object]) -> None:
    for mapping in (from_harbor, from_verifiers):
        try:
            policy = mapping(task)
        except PolicyError:
            continue
        assert policy.default in ("deny", "allow")
        if mapping is from_verifiers and task.get("network_access") is False:
            assert policy.default == "deny"  # framework-only
            assert not policy.allow_rules


@pytest.mark.parametrize("cid", ["\n", "a\nb", "x y", "é"])
def test_a_clients_table_header_is_spelled_as_toml_spells_it(cid: str) -> None:
    """Hypothesis found `[clients.\n]` in a one-line error: the header's key is quoted."""
    with pytest.raises(PolicyError) as caught:
        build_settings({"clients": {cid: False}})
    assert "\n" not in str(caught.value)
    assert f"[clients.{json.dumps(cid)}]" in str(caught.value)
