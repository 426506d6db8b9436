"""Transparent mode's plan (netcut/plan/transparent.py): rules, order, backstop, undo,
status, record."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_netcut_plan import PROXY, _after, state

from netcut.errors import InvalidInput
from netcut.helper.script import render_op
from netcut.iptables_text import as_output_rule, nat_args
from netcut.plan.changes import (
    AddBackstop,
    AddRedirect,
    AddRoute,
    DelRoute,
    RemoveRedirect,
)
from netcut.plan.model import AF_INET, NETCUT_PROTO, OutputRule, RedirectRule
from netcut.plan.planner import plan_cut, plan_restore
from netcut.plan.status import judge_status
from netcut.plan.transparent import Redirect, redirect_rules
from netcut.records import plan_from_data, plan_to_data

REDIRECT = Redirect(15001, 15053)


def test_redirect_rules_dns_first_then_local_and_keeps_then_tcp() -> None:
    assert redirect_rules(REDIRECT, (PROXY,)) == (
        RedirectRule("redirect", proto="udp", dport=53, to_port=15053),
        RedirectRule("redirect", proto="tcp", dport=53, to_port=15053),
        RedirectRule("pass", dst_local=True),
        RedirectRule("pass", proto="tcp", dst="198.19.1.1/32", dport=3128),
        RedirectRule("redirect", proto="tcp", to_port=15001),
    )
    no_dns = redirect_rules(Redirect(15001), ())
    assert [r.verdict for r in no_dns] == ["pass", "redirect"]
    assert nat_args(no_dns[-1]) == ["-p", "tcp", "-j", "REDIRECT", "--to-ports", "15001"]


def test_transparent_plan_order_and_backstop() -> None:
    plan = plan_cut(state(), (PROXY,), REDIRECT)
    assert plan.transparent
    assert not plan_cut(state(), (PROXY,)).transparent
    kinds = [type(op).__name__ for op in plan.ops]
    assert kinds[:3] == ["AddBackstop", "AddBackstop", "AddRedirect"]
    lo_route = next(
        op.route for op in plan.ops if isinstance(op, AddRoute) and op.route.dst is None
    )
    assert (lo_route.ifname, lo_route.prefsrc, lo_route.proto) == ("lo", "127.0.0.1", NETCUT_PROTO)
    # the default via lo comes after the old default route is deleted (same key)
    deleted = next(
        i for i, op in enumerate(plan.ops) if isinstance(op, DelRoute) and op.route.dst is None
    )
    assert plan.ops.index(AddRoute(lo_route)) > deleted
    v4 = next(op for op in plan.ops if isinstance(op, AddBackstop) and op.family == AF_INET)
    assert v4.rules[:2] == (
        OutputRule("allow", proto="udp", dst="127.0.0.1/32", dport=15053, out_iface="lo"),
        OutputRule("allow", proto="tcp", dst="127.0.0.1/32", dport=15053, out_iface="lo"),
    )
    assert OutputRule("allow", out_iface="lo") not in v4.rules, "lo alone would accept all"
    assert OutputRule("allow", out_iface="lo", dst_local=True) in v4.rules
    assert v4.rules[-2:] == (OutputRule("reset", proto="tcp"), OutputRule("reject"))
    v6 = next(op for op in plan.ops if isinstance(op, AddBackstop) and op.family != AF_INET)
    assert OutputRule("allow", out_iface="lo") in v6.rules


def test_transparent_restore_status_and_record() -> None:
    before = state()
    plan = plan_cut(before, (PROXY,), REDIRECT)
    undo = plan_restore(plan, before)
    assert RemoveRedirect() in undo.ops
    after = replace(_after(plan, before), redirect=True)
    assert judge_status(plan, after).state == "cut"
    assert judge_status(plan, replace(after, redirect=False)).state == "partial"
    assert judge_status(None, replace(before, redirect=True)).state == "partial"
    assert plan_restore(None, replace(before, redirect=True)).ops == (RemoveRedirect(),)
    assert plan_from_data(json.loads(json.dumps(plan_to_data(plan)))) == plan


def test_render_and_bad_ports() -> None:
    lines = render_op(AddRedirect(redirect_rules(REDIRECT, ())))
    assert lines[0] == "ncut_iptables -w -t nat -N NETCUT_REDIRECT"
    assert lines[-1] == "ncut_iptables -w -t nat -I OUTPUT 1 -j NETCUT_REDIRECT"
    assert "NETCUT_REDIRECT" in render_op(RemoveRedirect())[0]
    with pytest.raises(InvalidInput, match="--redirect-to"):
        Redirect(0)
    with pytest.raises(InvalidInput, match="--dns-to"):
        Redirect(1, 70000)


def test_status_verification_knows_transparent_rules() -> None:
    from netcut.iptables_text import SeenRule
    from netcut.plan.verify import differences, repair_ops

    seen = SeenRule("ACCEPT", out_iface="lo", matches=(("addrtype", (("dst-type", "LOCAL"),)),))
    assert as_output_rule(seen, AF_INET) == OutputRule("allow", out_iface="lo", dst_local=True)
    other = SeenRule("ACCEPT", out_iface="lo", matches=(("addrtype", (("dst-type", "ANY"),)),))
    assert as_output_rule(other, AF_INET) is None
    plan = plan_cut(state(), (PROXY,), REDIRECT)
    after = _after(plan, state())
    assert "the redirects are gone" in differences(plan.ops, after)
    assert any(isinstance(op, AddRedirect) for op in repair_ops(plan.ops, after))
    held = differences(plan.ops, replace(after, redirect=True))
    assert not any("redirects" in d for d in held)


def test_helper_state_dump_reports_the_redirect_chain() -> None:
    from test_netcut_render import DUMP

    from netcut.helper.dump import parse_state_dump
    from netcut.helper.script import state_script

    assert "-t nat -S NETCUT_REDIRECT" in state_script(())
    assert "= nat ] && t=yes" in state_script(())
    assert parse_state_dump(DUMP).redirect is False
    assert parse_state_dump(DUMP + "### redirect\nyes\n### rc 0\n").redirect is True
