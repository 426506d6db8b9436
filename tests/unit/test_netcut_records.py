"""netcut's record format on disk does not change with the code's layout: a record written
by the netcut that still spoke iptables in its plan (the fixture, written by that version's
`Store.save` and journal) loads, restores and is written again byte for byte
(docs/netcut.md#the-journal)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from test_netcut_plan import state

from netcut.plan.changes import RemoveBackstop, RemoveRedirect
from netcut.plan.model import Lookup, NamespaceState, parse_keep
from netcut.plan.planner import plan_cut, plan_restore
from netcut.plan.transparent import Redirect
from netcut.records import Store, plan_to_data, record_text

FIXTURE = Path(__file__).with_name("netcut_record_v1.json")
KEEPS = (parse_keep("198.19.1.1:3128"), parse_keep("198.19.5.5"), parse_keep("127.0.0.1:9"))


def fixture_state() -> NamespaceState:
    lookups = (
        Lookup("198.19.1.1", 1, 2, "eth0", None, "198.19.1.2"),
        Lookup("198.19.5.5", 1, 2, "eth0", "198.19.1.1", "198.19.1.2"),
    )
    return state(nameservers=("127.0.0.11",), lookups=lookups)


def test_an_old_record_loads_as_todays_plan(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, tmp_path / "1-2.json")
    loaded = Store(str(tmp_path), "1-2").load()
    assert loaded is not None
    assert loaded.applied == 3, "its journal says three ops ran"
    assert loaded == plan_cut(fixture_state(), KEEPS, Redirect(15001, 15053))
    undo = plan_restore(loaded, fixture_state())
    assert undo.ops[-3:] == (RemoveRedirect(), RemoveBackstop(10), RemoveBackstop(2))


def test_todays_plan_is_written_as_the_old_record() -> None:
    head = json.loads(FIXTURE.read_text().partition("\n")[0])
    plan = plan_cut(fixture_state(), KEEPS, Redirect(15001, 15053))
    old = {k: v for k, v in head.items() if k not in ("meta", "created", "journal")}
    assert plan_to_data(plan) == old
    assert json.dumps(plan_to_data(plan), sort_keys=True) == json.dumps(old, sort_keys=True)


def test_the_record_line_is_json_dumps_of_the_plan_whether_its_ops_are_cached_or_not() -> None:
    """`record_text` builds each op's JSON once per process: the line it writes is still
    `json.dumps` of the whole record with sorted keys, character for character, the first
    time an op is seen and every time after (the second plan shares most ops)."""
    one = plan_cut(fixture_state(), KEEPS, Redirect(15001, 15053))
    two = plan_cut(fixture_state(), KEEPS[:1], None)
    meta = {"target": "ns:x", "b": '\u00e9"\\'}
    for plan in (one, two, one, two):
        for journal in (True, False):
            data = {**plan_to_data(plan), "meta": meta, "created": 1733000000.25}
            if journal:
                data["journal"] = True
            want = json.dumps(data, sort_keys=True)
            assert record_text(plan, meta, 1733000000.25, journal=journal) == want
