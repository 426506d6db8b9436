"""Helper mode's pure parts: plan ops as shell, the state dump parsed back, helper argv."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netcut.errors import InvalidInput
from netcut.helper import mode as helper
from netcut.helper.dump import parse_state_dump
from netcut.helper.script import render_batched, render_op, render_script, state_script
from netcut.iptables_text import SAVE_MARK, SeenRule, parse_rule_spec, parse_save
from netcut.plan.changes import AddBackstop, AddRoute, KillFlows, RemoveBackstop, SetSysctl
from netcut.plan.model import (
    AF_INET,
    AF_INET6,
    NETCUT_PROTO,
    RTNH_F_ONLINK,
    OutputRule,
    Route,
    parse_keep,
)
from netcut.plan.planner import plan_cut

DUMP = """\
### links
[{"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"]},{"ifindex":9,"ifname":"eth0","flags":["BROADCAST","UP"]}]
### rc 0
### addrs
[{"ifindex":1,"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"254"}]},{"ifindex":9,"ifname":"eth0","addr_info":[{"family":"inet","local":"198.19.7.2","prefixlen":24,"scope":"0"},{"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"253"}]}]
### rc 0
### routes4
[{"type":"1","dst":"default","gateway":"198.19.7.1","dev":"eth0","table":"254","protocol":"3","scope":"0","flags":[]},{"type":"1","dst":"198.19.7.0/24","dev":"eth0","table":"254","protocol":"2","scope":"253","prefsrc":"198.19.7.2","flags":[]},{"type":"2","dst":"198.19.7.2","dev":"eth0","table":"255","protocol":"2","scope":"254","prefsrc":"198.19.7.2","flags":[]},{"type":"1","dst":"198.19.9.9","gateway":"198.19.7.1","dev":"eth0","table":"254","protocol":"110","scope":"0","flags":["onlink"],"metrics":[{"mtu":1400}]}]
### rc 0
### routes6
[{"type":"1","dst":"fe80::/64","dev":"eth0","table":"254","protocol":"2","scope":"0","metric":256,"flags":[],"pref":"medium"}]
### rc 0
### get 198.19.7.1
[{"dst":"198.19.7.1","dev":"eth0","prefsrc":"198.19.7.2","flags":[],"uid":0,"cache":[]}]
### rc 0
### sysctls
/proc/sys/net/ipv6/conf/eth0/disable_ipv6 0
/proc/sys/net/ipv6/conf/eth0/accept_ra 1
### rc 0
### backstop4
yes
### rc 0
### backstop6
no
### rc 0
"""


def test_parse_state_dump() -> None:
    state = parse_state_dump(DUMP, ("127.0.0.11",))
    assert [(link.index, link.name, link.loopback) for link in state.links] == [
        (1, "lo", True),
        (9, "eth0", False),
    ]
    assert [a.address for a in state.addrs] == ["127.0.0.1", "198.19.7.2", "fe80::1"]
    default, connected, local, marked, v6 = state.routes
    assert (default.dst, default.dst_len, default.gateway, default.oif, default.proto) == (
        None,
        0,
        "198.19.7.1",
        9,
        3,
    )
    assert (connected.dst, connected.dst_len, connected.scope) == ("198.19.7.0", 24, 253)
    assert (local.table, local.type, local.dst_len) == (255, 2, 32)
    assert marked.proto == NETCUT_PROTO
    assert marked.flags == RTNH_F_ONLINK
    assert marked.metrics == (("RTAX_MTU", 1400),)
    assert (v6.family, v6.priority, v6.pref) == (AF_INET6, 256, 0)
    assert state.lookups[0].oif == 9
    assert state.sysctl("net/ipv6/conf/eth0/disable_ipv6") == "0"
    assert state.backstop == (AF_INET,)
    assert state.nameservers == ("127.0.0.11",)


def test_dump_parses_into_a_plan() -> None:
    plan = plan_cut(parse_state_dump(DUMP), (parse_keep("198.19.7.1:3128"),))
    script = render_script(plan.ops)
    assert script.startswith("set -e\n")
    assert "ncut_ip -4 route add 198.19.7.1/32 dev eth0 table 254 proto 110 scope 253" in script
    assert "ncut_ip -4 route del default via 198.19.7.1 dev eth0 table 254 proto 3" in script


@pytest.mark.parametrize(
    "text",
    ["### links\nnot json\n", "### routes4\n{}\n"],
    ids=["not-json", "not-a-list"],
)
def test_malformed_dump_is_invalid_input(text: str) -> None:
    from netcut.errors import InvalidInput

    with pytest.raises(InvalidInput, match="helper state dump"):
        parse_state_dump(text)


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (
            AddRoute(
                Route(
                    AF_INET,
                    "198.19.1.1",
                    32,
                    2,
                    "eth0",
                    proto=110,
                    scope=253,
                    metrics=(("RTAX_MTU", 1400),),
                )
            ),
            ["ncut_ip -4 route add 198.19.1.1/32 dev eth0 table 254 proto 110 scope 253 mtu 1400"],
        ),
        (
            SetSysctl("net/ipv6/conf/eth0/disable_ipv6", "1", "0"),
            ['echo 1 > "$NCUT_SYS"/net/ipv6/conf/eth0/disable_ipv6'],
        ),
        (
            AddBackstop(AF_INET6, (OutputRule("allow", out_iface="lo"),)),
            [
                "ncut_ip6tables -w -I OUTPUT 1 -m comment --comment netcut-hold -j REJECT",
                "while ncut_ip6tables -w -D OUTPUT -j NETCUT 2>/dev/null; do :; done",
                "ncut_ip6tables -w -N NETCUT 2>/dev/null || ncut_ip6tables -w -F NETCUT",
                "ncut_ip6tables -w -A NETCUT -o lo -j ACCEPT",
                "ncut_ip6tables -w -I OUTPUT 1 -j NETCUT",
                "ncut_ip6tables -w -D OUTPUT -m comment --comment netcut-hold -j REJECT",
            ],
        ),
        (
            KillFlows((("198.19.1.1", 3128), ("198.19.1.2", None))),
            [
                "ncut_ss -K -t state connected 'not ( dst 127.0.0.0/8 or dst [::1] or dst "
                "198.19.1.1:3128 or dst 198.19.1.2 )' >/dev/null 2>/dev/null || true"
            ],
        ),
    ],
    ids=["route", "sysctl", "backstop6", "flows"],
)
def test_render_op(op: object, expected: list[str]) -> None:
    assert render_op(op) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda d: d.replace("### rc 0", "### rc 127", 1), "'links' failed (exit 127)"),
        (
            lambda d: d.replace(
                '{"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"]},', ""
            ),
            "no loopback interface",
        ),
        (lambda d: d.replace("### sysctls", "### other"), "no 'sysctls' section"),
        (
            lambda d: d.replace("### backstop6\nno", "### backstop6\nPermission denied"),
            "'backstop6' answered 'Permission denied'",
        ),
        (
            lambda d: (
                d.split("### routes4")[0]
                + "### routes4\n[]\n### rc 0\n"
                + "### routes6"
                + d.split("### routes6")[1]
            ),
            "no local routes",
        ),
        (lambda d: re.sub(r"### rc 0\n(### addrs)", r"\1", d), "'links' failed (exit missing)"),
    ],
    ids=["tool-failed", "no-lo", "missing-section", "iptables-error", "empty-routes", "no-rc"],
)
def test_state_dump_proves_itself(change: Any, complaint: str) -> None:
    """A dump from a broken helper (Debian busybox's `ip` applet answered nothing, iptables
    had no raw socket) is an error, never an empty namespace that would look cut."""
    from netcut.errors import InvalidInput

    parse_state_dump(DUMP)  # the untouched dump is fine
    with pytest.raises(InvalidInput, match=re.escape(complaint)):
        parse_state_dump(change(DUMP))


def test_tolerant_script_never_stops() -> None:
    script = render_script((RemoveBackstop(AF_INET),), tolerant=True)
    assert "set -e" not in script
    assert all(line.endswith("|| true") for line in script.splitlines())


def test_state_script_asks_for_each_kept_route() -> None:
    script = state_script((parse_keep("198.19.7.1:3128"), parse_keep("127.0.0.1:8080")))
    assert "ncut_ip -d -N -j route get 198.19.7.1" in script
    assert "127.0.0.1" not in script


@pytest.mark.parametrize(
    ("runtime", "unmask"),
    [("/usr/bin/docker", "systempaths=unconfined"), ("/usr/bin/podman", "unmask=/proc/sys")],
    ids=["docker", "podman"],
)
def test_helper_argv(runtime: str, unmask: str) -> None:
    argv = helper.helper_argv(runtime, "abc", "img:1")
    assert argv == [
        runtime,
        "run",
        "-i",
        "--rm",
        "--pull",
        "never",
        "--log-driver",
        "none",
        "--network",
        "container:abc",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "NET_ADMIN",
        "--cap-add",
        "NET_RAW",
        "--security-opt",
        unmask,
        "--entrypoint",
        "/bin/sh",
        "img:1",
    ]


@pytest.mark.parametrize(
    ("host_config", "findings"),
    [
        ({"CapDrop": ["ALL"]}, ()),
        ({"CapDrop": ["NET_RAW"]}, ()),
        ({}, ("container may hold CAP_NET_RAW",)),
        ({"CapDrop": ["ALL"], "CapAdd": ["CAP_NET_ADMIN"]}, ("container may hold CAP_NET_ADMIN",)),
        (
            {"CapDrop": ["ALL"], "CapAdd": ["ALL"]},
            (
                "container may hold CAP_NET_ADMIN",
                "container may hold CAP_NET_RAW",
                "container may hold CAP_SYS_ADMIN",
            ),
        ),
        ({"Privileged": True}, ("container is privileged (all capabilities)",)),
    ],
    ids=["drop-all", "drop-raw", "default-set", "add-admin", "add-all", "privileged"],
)
def test_container_findings(host_config: dict[str, object], findings: tuple[str, ...]) -> None:
    assert helper.container_findings({"HostConfig": host_config}) == findings


@pytest.mark.parametrize(
    ("bounding", "findings"),
    [
        (["CAP_CHOWN", "CAP_SETUID"], ()),
        (["CAP_CHOWN", "CAP_NET_RAW"], ("container may hold CAP_NET_RAW (bounding set)",)),
        ([], ()),
    ],
    ids=["podman-default", "podman-add-raw", "podman-drop-all"],
)
def test_container_findings_from_podmans_bounding_set(
    bounding: list[str], findings: tuple[str, ...]
) -> None:
    """podman reports the bounding set: judged as it is, whatever CapAdd/CapDrop say."""
    info = {"HostConfig": {"CapDrop": [], "CapAdd": []}, "BoundingCaps": bounding}
    assert helper.container_findings(info) == findings


def test_container_network_from_docker_and_podman_inspect() -> None:
    """Both engines' `inspect` share NetworkSettings.Networks; the top-level copy (docker's
    default bridge, podman's first network) is merged, not counted twice."""
    net = {
        "Gateway": "198.19.251.1",
        "IPAddress": "198.19.251.7",
        "GlobalIPv6Address": "fd00::7",
        "IPv6Gateway": "fd00::1",
    }
    info = {
        "NetworkSettings": {
            "Gateway": "198.19.251.1",
            "IPAddress": "198.19.251.7",
            "GlobalIPv6Address": "",
            "Networks": {"nc-ci": net},
        }
    }
    found = helper.container_network(info)
    assert found.gateways == ("198.19.251.1",)  # IPv4 only: the IPv6 gateway is not one
    assert found.addresses == ("198.19.251.7", "fd00::7")
    two = {
        "NetworkSettings": {
            "Networks": {"a": {"Gateway": "198.19.250.1"}, "b": {"Gateway": "198.19.252.1"}}
        }
    }
    assert helper.container_network(two).gateways == ("198.19.250.1", "198.19.252.1")
    host = {"NetworkSettings": {"Gateway": "", "IPAddress": "", "Networks": {"host": {}}}}
    assert helper.container_network(host) == helper.ContainerNetwork((), ())


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=20)
    | st.sampled_from(["198.19.251.1", "fd00::1", "1.2.3", "::", "198.19.251.1/24"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["NetworkSettings", "Networks", "Gateway", "IPAddress", "GlobalIPv6Address", "x"]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@given(_json)
def test_container_network_never_fails_and_returns_only_addresses(info: Any) -> None:
    """Whatever `inspect` printed: no exception, and only real addresses come back."""
    import ipaddress

    found = helper.container_network(info)
    for text in (*found.gateways, *found.addresses):
        ipaddress.ip_address(text)
    assert all(ipaddress.ip_address(g).version == 4 for g in found.gateways)


def test_probe_output_parsing() -> None:
    keep, blocked = parse_keep("198.19.1.1:3128"), parse_keep("198.19.1.3:7000")
    result = helper.parse_probe(
        "connected 198.19.1.1:3128\nfailed 198.19.1.3:7000\n", (keep,), (blocked,)
    )
    assert result.ok
    assert not helper.parse_probe("failed 198.19.1.1:3128\n", (keep,), ()).ok


@given(st.text(max_size=400))
def test_state_dump_parses_or_raises_invalid_input(text: str) -> None:
    from netcut.errors import InvalidInput

    try:
        parse_state_dump(text)
    except InvalidInput:
        pass


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


@given(
    st.sampled_from(["links", "addrs", "routes4", "routes6", "get 1.2.3.4"]),
    st.lists(
        st.dictionaries(
            st.sampled_from(
                [
                    "ifindex",
                    "ifname",
                    "dst",
                    "dev",
                    "type",
                    "metric",
                    "flags",
                    "addr_info",
                    "table",
                    "protocol",
                    "metrics",
                    "pref",
                ]
            ),
            _json_values,
            max_size=6,
        ),
        max_size=3,
    ),
)
def test_state_dump_sections_of_any_shape(section: str, items: list[object]) -> None:
    import json

    from netcut.errors import InvalidInput

    try:
        parse_state_dump(f"### {section}\n{json.dumps(items)}\n")
    except InvalidInput:
        pass


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("-A OUTPUT -j NETCUT", SeenRule("NETCUT", proto="ip")),
        (
            "-A NETCUT -d 198.19.1.1/32 -p tcp -m tcp --dport 3128 -j ACCEPT",
            SeenRule(
                "ACCEPT",
                proto="tcp",
                dst="198.19.1.1/255.255.255.255",
                matches=(("tcp", (("dport", "3128"),)),),
            ),
        ),
        (
            "-A NETCUT -p tcp -j REJECT --reject-with tcp-reset",
            SeenRule("REJECT", proto="tcp", target_params=(("reject-with", "tcp-reset"),)),
        ),
        (
            "-A OUTPUT ! -d 198.19.1.1/32 -o lo -j ACCEPT",
            SeenRule("ACCEPT", proto="ip", dst="!198.19.1.1/32", out_iface="lo"),
        ),
        (
            "-A OUTPUT -p tcp -m tcp ! --dport 53 -j ACCEPT",
            SeenRule("ACCEPT", proto="tcp", matches=(("tcp", (("dport", "!53"),)),)),
        ),
    ],
    ids=["jump", "keep", "reset", "negated-dst", "negated-port"],
)
def test_parse_rule_spec(line: str, want: SeenRule) -> None:
    """`iptables -S` lines parse to what python-iptables decodes in direct mode."""
    assert parse_rule_spec(line) == want


@given(st.text(max_size=120))
def test_rule_spec_parses_or_raises_invalid_input(text: str) -> None:
    from netcut.errors import InvalidInput

    try:
        parse_rule_spec("-A OUTPUT " + text)
    except InvalidInput:
        pass


def test_a_failed_section_names_itself_its_command_and_all_it_said() -> None:
    """The error used to keep 300 characters of the output joined into one line, which cut off
    the cause; now it names the section, the command the script ran and every line."""
    from netcut.errors import InvalidInput

    script = state_script(())
    assert "echo '### cmd read each /proc/sys/net/ipv6/conf/" in script
    said = [f"line {i}: " + "x" * 60 for i in range(12)]
    broken = DUMP.replace(
        "### sysctls\n",
        "### sysctls\n### cmd read each /proc/sys/net/ipv6/conf/*/{disable_ipv6,accept_ra}\n"
        + "\n".join(said)
        + "\n### rc 1\n### ignored\n",
        1,
    )
    with pytest.raises(InvalidInput) as caught:
        parse_state_dump(broken)
    message = str(caught.value)
    assert "'sysctls' (`read each /proc/sys/net/ipv6/conf/*/{disable_ipv6,accept_ra}`)" in message
    assert "failed (exit 1)" in message
    assert message.endswith("\n".join(said))


# ---------------------------------------------------------------- one iptables-save per family

SAVE4 = """\
# Generated by iptables-save v1.8.9 on Thu Dec  3 14:00:00 2026
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:NETCUT_REDIRECT - [0:0]
-A OUTPUT -j NETCUT_REDIRECT
-A OUTPUT -d 127.0.0.11/32 -p udp -m udp --dport 53 -j DNAT --to-destination 127.0.0.11:40000
COMMIT
*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:NETCUT - [0:0]
-A OUTPUT -j NETCUT
-A NETCUT -o lo -j ACCEPT
-A NETCUT -j REJECT --reject-with icmp-port-unreachable
COMMIT
"""


def _save_dump(save4: str, save6: str, verify: bool = True) -> str:
    """DUMP with its netfilter sections as `IptablesShell.dump` writes them from the saves."""
    head = DUMP.split("### backstop4")[0]
    out = head + f"### backstop4\n{SAVE_MARK}\n{save4}### rc 0\n"
    out += f"### backstop6\n{SAVE_MARK}\n{save6}### rc 0\n"
    if verify:
        out += "### rules4\n[]\n### rc 0\n### rules6\n[]\n### rc 0\n"
    return out


def test_parse_save_reads_tables_chains_and_rules_in_order() -> None:
    tables = parse_save(SAVE4)
    assert set(tables) == {"nat", "filter"}
    assert tables["filter"]["NETCUT"] == [
        "-A NETCUT -o lo -j ACCEPT",
        "-A NETCUT -j REJECT --reject-with icmp-port-unreachable",
    ]
    assert tables["filter"]["INPUT"] == []
    assert parse_save("") == {}


def test_a_save_dump_reads_as_the_command_dump_does() -> None:
    """The backstop, its rules and the redirects from one save per family equal what the
    `-S` sections (today's path, kept for images without `-save`) tell."""
    state = parse_state_dump(_save_dump(SAVE4, ""))
    assert state.backstop == (AF_INET,)
    assert state.redirect is True
    assert state.filters is not None
    assert len(state.filters) == 1
    by_command = parse_state_dump(
        DUMP.split("### backstop4")[0]
        + "### backstop4\nyes\n### rc 0\n### backstop6\nno\n### rc 0\n"
        + "### output4\n-P OUTPUT ACCEPT\n-A OUTPUT -j NETCUT\n### rc 0\n"
        + "### chain4\n-N NETCUT\n-A NETCUT -o lo -j ACCEPT\n"
        + "-A NETCUT -j REJECT --reject-with icmp-port-unreachable\n### rc 0\n"
        + "### redirect\nyes\n### rc 0\n### rules4\n[]\n### rc 0\n### rules6\n[]\n### rc 0\n"
    )
    assert state.filters == by_command.filters
    assert parse_state_dump(_save_dump("", "", verify=False)).backstop == ()
    assert parse_state_dump(_save_dump("", "", verify=False)).redirect is False


@pytest.mark.parametrize(
    "text",
    [
        "-A OUTPUT -j NETCUT\n",  # a rule outside any table
        "*filter\n-A NETCUT -j ACCEPT\nCOMMIT\n",  # a rule for no declared chain
        "*filter\n:OUTPUT ACCEPT [0:0]\n",  # never committed: cut short
        "*filter\nCOMMIT\n*filter\nCOMMIT\n",  # a table twice
        "*filter\n:NETCUT - [0:0]\n:NETCUT - [0:0]\nCOMMIT\n",  # a chain twice
        "*filter\n*nat\nCOMMIT\n",  # a table inside a table
        "*\nCOMMIT\n",
        "*fil ter\nCOMMIT\n",
        "*filter\n:\nCOMMIT\n",
        "*filter\n:NETCUT - [0:0]\nNETCUT yes\nCOMMIT\n",
        "COMMIT\n",
        "### backstop4\nyes\n",
    ],
)
def test_malformed_save_is_invalid_input(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_save(text)
    with pytest.raises(InvalidInput):
        parse_state_dump(_save_dump(text, ""))


_WORD = st.text(st.sampled_from("ABCNETUab-_:*#! 0[]/"), min_size=0, max_size=12)


@given(st.lists(st.one_of(_WORD, st.sampled_from(["COMMIT", "*filter", ":NETCUT - [0:0]"]))))
def test_save_parses_or_raises_invalid_input(lines: list[str]) -> None:
    text = "\n".join(lines)
    try:
        tables = parse_save(text)
    except InvalidInput:
        return
    for chains in tables.values():
        for chain, rules in chains.items():
            assert all(rule.startswith(f"-A {chain} ") or rule == f"-A {chain}" for rule in rules)


@given(
    st.lists(st.sampled_from(["NETCUT", "OUTPUT", "INPUT", "X"]), unique=True),
    st.lists(st.sampled_from(["-o lo -j ACCEPT", "-j REJECT", "-d 198.18.0.1/32 -j ACCEPT"])),
)
def test_a_well_formed_save_round_trips(chains: list[str], rules: list[str]) -> None:
    """Any table `iptables-save` could write parses back to its chains and rules, in order."""
    body = "".join(f":{c} - [0:0]\n" for c in chains)
    body += "".join(f"-A {c} {r}\n" for c in chains for r in rules)
    tables = parse_save(f"*filter\n{body}COMMIT\n")
    assert tables == {"filter": {c: [f"-A {c} {r}" for r in rules] for c in chains}}
    assert parse_state_dump(_save_dump(f"*filter\n{body}COMMIT\n", "")).backstop == (
        (AF_INET,) if "NETCUT" in chains else ()
    )


@pytest.mark.parametrize("iface", ['e"th0', "e th0", "eth$0", "eth'0", "e\\th0", "eth0\n-F", ""])
def test_a_rule_restore_cannot_carry_keeps_the_per_command_path(iface: str) -> None:
    """iptables-restore has quoting of its own: a word outside its plain set never goes
    into a batch (an interface name may hold quotes or `$`), the commands are used."""
    op = AddBackstop(AF_INET, (OutputRule("allow", out_iface=iface or None), OutputRule("reject")))
    if iface:
        assert render_batched(op) == render_op(op)
    else:
        assert "ncut_iptrestore" in render_batched(op)[0]


@given(st.text(max_size=16))
def test_batching_any_interface_name_is_plain_words_or_the_commands(iface: str) -> None:
    op = AddBackstop(AF_INET, (OutputRule("allow", out_iface=iface or None),))
    (batch, *rest) = render_batched(op)
    if "ncut_iptrestore" in batch:
        assert not rest
        assert iface == "" or re.fullmatch(r"[A-Za-z0-9_.:/+@%=,-]+", iface)
    else:
        assert [batch, *rest] == render_op(op)


def _marks_only(dump: str) -> str:
    """`DUMP` as `marks_script` writes it: no links, addresses, lookups or sysctls."""
    from netcut.helper.dump import read_sections

    s = read_sections(dump)
    return "".join(
        f"### {n}\n{s[n]}\n### rc 0\n" for n in ("routes4", "routes6", "backstop4", "backstop6")
    )


def test_the_marks_dump_is_the_whole_dumps_marks_where_no_route_is_marked() -> None:
    from netcut.helper.dump import parse_marks_dump

    unmarked = DUMP.replace('"protocol":"110"', '"protocol":"4"')
    assert parse_marks_dump(_marks_only(unmarked)) == parse_state_dump(unmarked).marks()
    assert parse_marks_dump(_marks_only(unmarked)).backstop == (AF_INET,)  # type: ignore[union-attr]
    # a marked route is left: the caller reads the whole state, which names its link
    assert parse_marks_dump(_marks_only(DUMP)) is None


def _routes4_empty(text: str) -> str:
    head, _, rest = text.partition("### routes4\n")
    return head + "### routes4\n[]\n### rc 0\n" + rest.split("### rc 0\n", 1)[1]


@pytest.mark.parametrize(
    "broken",
    [
        _routes4_empty,  # `ip` printed no route: not even the local table's
        lambda text: text.replace("### backstop6\nno\n### rc 0\n", ""),
        lambda text: text.replace("### routes6\n[", "### routes6\n[{]"),
        lambda text: text.replace("### rc 0\n", "### rc 1\n", 1),
    ],
    ids=["no-local-route", "missing-section", "not-json", "failed-tool"],
)
def test_a_marks_dump_that_proves_nothing_is_invalid_input(broken: Any) -> None:
    """Never "no marks" from a tool that answered nothing or failed."""
    from netcut.errors import InvalidInput
    from netcut.helper.dump import parse_marks_dump

    good = _marks_only(DUMP.replace('"protocol":"110"', '"protocol":"4"'))
    assert parse_marks_dump(good) is not None
    text = broken(good)
    assert text != good
    with pytest.raises(InvalidInput):
        parse_marks_dump(text)


@given(st.text(max_size=400))
def test_marks_dump_parses_or_raises_invalid_input(text: str) -> None:
    from netcut.errors import InvalidInput
    from netcut.helper.dump import parse_marks_dump

    try:
        parse_marks_dump(text)
    except InvalidInput:
        pass
