"""`egress.integrations.hb_policy` (no Harbor imported): a task config's phases as Harbor
0.26 resolves them, and a compose project with every service behind the holder or refused by
name (docs/integrations.md#harbor-tasks-through-inspect-harbor). The task config and the
compose file are the task author's: hostile input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress.errors import PolicyError
from egress.integrations.hb_policy import (
    NETNS_SERVICE,
    HarborTaskError,
    harbor_phases,
    phase_policy,
    police_compose,
)

ALLOW = {"network_mode": "allowlist", "allowed_hosts": ["pypi.org"]}
PUBLIC = {"network_mode": "public", "allowed_hosts": []}


def test_the_agent_and_the_verifier_inherit_the_baseline() -> None:
    phases = harbor_phases({"environment": ALLOW, "agent": {}, "verifier": {}})
    assert phases.baseline == phases.agent == phases.verifier == ALLOW
    assert phases.restricted


def test_a_phase_of_its_own_overrides_the_baseline() -> None:
    config = {
        "environment": {"network_mode": "public"},
        "agent": {"network_mode": "allowlist", "allowed_hosts": ["a.test"]},
        "verifier": {"network_mode": "no-network", "allowed_hosts": None},
    }
    phases = harbor_phases(config)
    assert phases.baseline == PUBLIC
    assert phases.agent == {"network_mode": "allowlist", "allowed_hosts": ["a.test"]}
    assert phases.verifier == {"network_mode": "no-network", "allowed_hosts": []}


def test_an_all_public_task_is_not_restricted() -> None:
    assert not harbor_phases({}).restricted
    assert harbor_phases({"environment": None}).baseline == PUBLIC


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"steps": [{"name": "one"}]}, "steps"),
        ({"verifier": {"environment_mode": "separate"}}, "separate"),
        ({"verifier": {"environment": {"docker_image": "x"}}}, "separate"),
        ({"environment": "allowlist"}, "[environment]"),
        ({"environment": {"network_mode": "allowlist", "allowed_hosts": "pypi.org"}}, "list"),
        ({"environment": {"network_mode": "allowlist", "allowed_hosts": ["2001:db8::1"]}},
         "2001:db8::1"),
        ({"agent": {"network_mode": "allowlist", "allowed_hosts": ["[::1]"]}}, "[::1]"),
        ({"agent": {"network_mode": "allowlist", "allowed_hosts": ["fd00::/8"]}}, "fd00::/8"),
    ],
)  # fmt: skip
def test_what_the_resolution_does_not_cover_is_refused_by_name(
    config: dict[str, Any], named: str
) -> None:
    with pytest.raises(HarborTaskError, match=named.replace("[", r"\[").replace("]", r"\]")):
        harbor_phases(config)


def test_not_a_mapping_is_refused() -> None:
    with pytest.raises(HarborTaskError):
        harbor_phases(["environment"])  # type: ignore[arg-type]


def test_phase_policy_maps_a_resolved_phase_as_harbor_does() -> None:
    policy = phase_policy(harbor_phases({"environment": ALLOW}).agent)
    assert policy.canonical()["allow"] == ["pypi.org:*"]  # every port, as Harbor's gost
    with pytest.raises(PolicyError):
        phase_policy({"network_mode": "allowlist", "allowed_hosts": ["*.1.0x1/"]})


def test_every_service_joins_the_holder() -> None:
    project = {
        "services": {
            "main": {"image": "t", "network_mode": "bridge", "cap_drop": ["MKNOD"]},
            "db": {"image": "t", "network_mode": "none", "depends_on": ["cache"]},
            "cache": {"image": "t"},
        },
        "volumes": {"data": {}},
    }
    out = police_compose(project, "holder:1")
    assert out["volumes"] == {"data": {}}
    assert out["services"][NETNS_SERVICE]["image"] == "holder:1"
    assert out["services"][NETNS_SERVICE]["cap_drop"] == ["ALL"]
    for name in ("main", "db", "cache"):
        service = out["services"][name]
        assert service["network_mode"] == f"service:{NETNS_SERVICE}"
        assert {"NET_ADMIN", "NET_RAW", "SYS_ADMIN"} <= set(service["cap_drop"])
        assert NETNS_SERVICE in service["depends_on"]
    assert "MKNOD" in out["services"]["main"]["cap_drop"]
    assert "cache" in out["services"]["db"]["depends_on"]
    assert project["services"]["main"]["network_mode"] == "bridge"  # the input is untouched


@pytest.mark.parametrize(
    ("service", "named"),
    [
        ({"networks": ["front"]}, "`networks`"),
        ({"ports": ["80:80"]}, "`ports`"),
        ({"extra_hosts": ["a:1.2.3.4"]}, "`extra_hosts`"),
        ({"hostname": "h"}, "`hostname`"),
        ({"network_mode": "host"}, "network_mode: host"),
        ({"network_mode": "service:other"}, "network_mode: service:other"),
        ({"network_mode": "container:abc"}, "network_mode: container:abc"),
        ({"privileged": True}, "privileged"),
        ({"cap_add": ["net_admin"]}, "NET_ADMIN"),
        ({"cap_add": ["CAP_SYS_ADMIN"]}, "SYS_ADMIN"),
        ({"cap_add": ["ALL"]}, "ALL"),
        ({"cap_add": ["NET_RAW", "CHOWN"]}, "NET_RAW"),
    ],
)
def test_what_would_leave_the_namespace_is_refused_by_name(
    service: dict[str, Any], named: str
) -> None:
    project = {"services": {"main": {"image": "t"}, "side": {"image": "t", **service}}}
    with pytest.raises(HarborTaskError, match="'side'") as caught:
        police_compose(project, "holder:1")
    assert named in str(caught.value)


@pytest.mark.parametrize(
    "project",
    [
        {},
        {"services": {}},
        {"services": ["main"]},
        {"services": {"main": "image"}},
        {"services": {"main": {"depends_on": [["db"]]}}},
        {"services": {"main": {"depends_on": "db"}}},
        {"services": {"main": {"cap_add": "NET_ADMIN"}}},
        {"services": {"main": {"cap_drop": [1]}}},
    ],
)
def test_a_malformed_project_is_refused(project: dict[str, Any]) -> None:
    with pytest.raises(HarborTaskError):
        police_compose(project, "holder:1")


def test_a_service_named_like_the_holder_is_refused() -> None:
    with pytest.raises(HarborTaskError, match=NETNS_SERVICE):
        police_compose({"services": {NETNS_SERVICE: {"image": "t"}}}, "holder:1")


_KEYS = st.sampled_from(
    ["image", "networks", "ports", "network_mode", "privileged", "cap_add", "cap_drop",
     "extra_hosts", "hostname", "dns", "depends_on", "command", "x-default", "mac_address"]
)  # fmt: skip
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["bridge", "none", "host", "service:x", "container:y"]),
    st.lists(st.sampled_from(["NET_ADMIN", "CHOWN", "net_raw", "ALL", "x"]), max_size=3),
)
_SERVICES = st.dictionaries(
    st.text(min_size=1, max_size=8), st.dictionaries(_KEYS, _VALUES, max_size=5), max_size=4
)


@settings(max_examples=400, deadline=None)
@given(_SERVICES)
def test_a_policed_project_leaves_no_service_outside_the_holder(
    services: dict[str, dict[str, Any]],
) -> None:
    """Whatever the task's compose file says: refused with `HarborTaskError`, or every
    service is in the holder's namespace, without networking of its own and without the
    capabilities that could undo the cut."""
    try:
        out = police_compose({"services": services}, "holder:1")
    except HarborTaskError:
        return
    assert set(out["services"]) == {*services, NETNS_SERVICE}
    for name in services:
        service = out["services"][name]
        assert service["network_mode"] == f"service:{NETNS_SERVICE}"
        assert not service.get("privileged")
        assert not any(service.get(k) for k in ("networks", "ports", "extra_hosts", "hostname"))
        added = {str(c).upper().removeprefix("CAP_") for c in service.get("cap_add") or []}
        assert not added & {"ALL", "NET_ADMIN", "NET_RAW", "SYS_ADMIN"}
        assert {"NET_ADMIN", "NET_RAW", "SYS_ADMIN"} <= set(service["cap_drop"])


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["environment", "agent", "verifier", "steps", "metadata"]),
        st.one_of(
            st.none(),
            st.text(max_size=5),
            st.dictionaries(
                st.sampled_from(["network_mode", "allowed_hosts", "environment_mode"]),
                st.one_of(
                    st.none(),
                    st.sampled_from(["public", "allowlist", "no-network", "shared", "separate"]),
                    st.lists(st.sampled_from(["a.test", "::1", "10.0.0.0/8", "*.x.test"])),
                    st.text(max_size=5),
                ),
            ),
        ),
    )
)
def test_any_task_config_resolves_or_is_refused(config: dict[str, Any]) -> None:
    """Never another exception, and each resolved phase is a mode plus a list of entries."""
    try:
        phases = harbor_phases(config)
    except HarborTaskError:
        return
    for phase in (phases.baseline, phases.agent, phases.verifier):
        assert set(phase) == {"network_mode", "allowed_hosts"}
        assert isinstance(phase["allowed_hosts"], list)
