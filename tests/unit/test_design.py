"""The design checks of docs/architecture.md#design-checks, read from the source tree.

Every check walks `egress/` and `netcut/` as they are: no module, function or class is listed
here by hand, so a new file is checked the day it is added. Each check is one test, and each
says what it found when it fails (`file:line name`), so the fix starts from the message.

Run them all with `python -m pytest tests/unit/test_design.py -q`.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("egress", "netcut")

# Limits (docs/architecture.md#design-checks).
MAX_POSITIONAL = 6
MAX_FUNCTION_LINES = 80
# A method whose signature is a framework's, which it overrides, says so on its `def` line (or
# the line above) with this marker and the overridden name: its positional parameters are the
# framework's, not ours to choose.
FRAMEWORK_MARKER = re.compile(r"#\s*framework-signature:\s*(\S+)")
BANNED_MODULE_NAMES = {"steps", "control", "operate", "ops", "utils", "helpers"}


@dataclass(frozen=True)
class Module:
    path: Path
    name: str  # dotted, a package's `__init__` as the package
    tree: ast.Module
    source: str

    @property
    def where(self) -> str:
        return str(self.path.relative_to(ROOT))

    @property
    def package(self) -> str:
        """The package a relative import in this module starts from."""
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


@cache
def modules() -> tuple[Module, ...]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            source = path.read_text()
            found.append(Module(path, name, ast.parse(source, str(path)), source))
    return tuple(found)


@cache
def module_names() -> frozenset[str]:
    return frozenset(m.name for m in modules())


def is_project(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def absolute(module: Module, node: ast.ImportFrom) -> str:
    """The dotted module an `import from` reads from."""
    if not node.level:
        return node.module or ""
    base = module.package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def report(found: list[str]) -> str:
    return f"{len(found)} found:\n" + "\n".join(found)


# ------------------------------------------------------------------------------ the checks


def except_refused(ms: tuple[Module, ...] | None = None) -> list[str]:
    """Handlers of `Refused` in the proxy: a refusal is an action carried out by a driver."""
    found = []
    for m in ms or modules():
        if not m.name.startswith("egress.proxy"):
            continue
        for i, line in enumerate(m.source.splitlines(), 1):
            if re.search(r"except\b.*\bRefused\b", line):
                found.append(f"{m.where}:{i}")
    return found


def test_at_most_one_place_handles_refused() -> None:
    found = except_refused()
    assert len(found) <= 1, report(found)


ACTIONS_MODULE = "egress.proxy.core.actions"
EXECUTOR = ("egress.proxy.drive.executor", "Executor.carry_out")


@cache
def action_classes() -> frozenset[str]:
    """The action types: the classes `core/actions.py` defines (the `Action` union's)."""
    for module in modules():
        if module.name == ACTIONS_MODULE:
            return frozenset(n.name for n in module.tree.body if isinstance(n, ast.ClassDef))
    raise AssertionError(f"{ACTIONS_MODULE} defines the actions")


def action_names(module: Module) -> dict[str, str]:
    """The names this module binds to an action class (`Refuse as Refusal`: Refusal)."""
    names = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom) and absolute(module, node) == ACTIONS_MODULE:
            for alias in node.names:
                if alias.name in action_classes():
                    names[alias.asname or alias.name] = alias.name
    if module.name == ACTIONS_MODULE:
        names.update((n, n) for n in action_classes())
    return names


def _classes_named(node: ast.expr, names: dict[str, str]) -> set[str]:
    """The action classes an `isinstance` second argument or a comparison names."""
    return {names[n.id] for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in names}


def action_tests(function: ast.AST, names: dict[str, str]) -> tuple[int, bool]:
    """How many tests of a value against action classes `function` makes (`isinstance`,
    `x.__class__ is C`, a `match` case), and whether it has a `match` over them."""
    tests, matches = 0, False
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance":
            tests += bool(len(node.args) == 2 and _classes_named(node.args[1], names))
        elif isinstance(node, ast.Compare):
            tests += bool(_classes_named(ast.Tuple(node.comparators), names))
        elif isinstance(node, ast.Match):
            named = [c for c in node.cases if _classes_named(_pattern_classes(c.pattern), names)]
            tests += len(named)
            matches = matches or bool(named)
    return tests, matches


def _pattern_classes(pattern: ast.pattern) -> ast.expr:
    """The class names a `case` pattern tests, as one expression to search."""
    found: list[ast.expr] = [n.cls for n in ast.walk(pattern) if isinstance(n, ast.MatchClass)]
    return ast.Tuple(found)


def top_functions(
    module: Module,
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method, by qualified name (nested ones are their outer's)."""
    for node in module.tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}", item


def action_dispatches(ms: tuple[Module, ...] | None = None) -> list[str]:
    """Functions in `egress/proxy` but the executor's `carry_out` that dispatch over action
    types: two or more tests of an action's class, or a `match` over them (one test,
    `isinstance(step, Refuse)`, narrows; two choose what to carry out)."""
    found = []
    for m in ms or modules():
        names = action_names(m) if m.name.startswith("egress.proxy") else {}
        if not names:
            continue
        for qualname, function in top_functions(m):
            if (m.name, qualname) == EXECUTOR:
                continue
            tests, matches = action_tests(function, names)
            if tests >= 2 or matches:
                found.append(f"{m.where}:{function.lineno} {qualname}: {tests} action tests")
    return found


def test_one_executor_carries_actions_out() -> None:
    """docs/architecture.md#one-executor: no driver dispatches actions of its own."""
    found = action_dispatches()
    assert not found, report(found)


def test_the_executor_is_one_exhaustive_match_ending_in_a_raise() -> None:
    """`carry_out` is a `match` naming every action type, whose last case raises: an action
    no case names is a bug that says so (mitmproxy's `server_event`)."""
    module = next(m for m in modules() if m.name == EXECUTOR[0])
    carry_out = dict(top_functions(module))[EXECUTOR[1]]
    matches = [n for n in ast.walk(carry_out) if isinstance(n, ast.Match)]
    assert len(matches) == 1, f"{module.where}: carry_out has {len(matches)} match statements"
    cases = matches[0].cases
    named = {ast.unparse(c.pattern.cls) for c in cases if isinstance(c.pattern, ast.MatchClass)}
    assert named == action_classes(), f"carry_out names {sorted(named)}"
    last = cases[-1]
    assert isinstance(last.pattern, ast.MatchAs), "no `case _`"
    assert last.pattern.pattern is None, "no `case _`"
    assert [type(s) for s in last.body] == [ast.Raise], "the last case must raise"
    raised = last.body[0]
    assert isinstance(raised, ast.Raise)
    assert raised.exc is not None
    assert ast.unparse(raised.exc).startswith("RuntimeError(")


RECORD_FIELDS_OWNER = "egress.proxy.core.exchange"
RECORD_NAME = re.compile(r"rec(ord)?s?$|_rec(ord)?$", re.IGNORECASE)


@cache
def record_class() -> tuple[str, frozenset[str]]:
    """The module that defines `AccessRecord`, and the fields its `__slots__` declare."""
    for module in modules():
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == "AccessRecord":
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == "__slots__":
                        return module.name, frozenset(ast.literal_eval(stmt.value))
    raise AssertionError("AccessRecord declares its fields in __slots__")


def last_name(node: ast.expr) -> str:
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def record_writes(ms: tuple[Module, ...] | None = None) -> list[str]:
    """Stores into an `AccessRecord` field outside the exchange, the record's one writer.

    An access record is recognised by its name (`rec`, `record`, `self.record`, ...):
    `record_names_say_so` keeps every annotated or constructed one named that way."""
    defined_in, fields = record_class()
    found = []
    for m in ms or modules():
        if m.name in (RECORD_FIELDS_OWNER, defined_in):
            continue
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
                if node.attr in fields and RECORD_NAME.search(last_name(node.value)):
                    found.append(f"{m.where}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("setattr"):
                if node.args and RECORD_NAME.search(last_name(node.args[0])):
                    found.append(f"{m.where}:{node.lineno} {ast.unparse(node)}")
    return found


def test_access_record_fields_are_written_only_by_the_exchange() -> None:
    found = record_writes()
    assert not found, report(found)


def test_record_names_say_so() -> None:
    """Whatever holds an `AccessRecord` (annotated so, or made by `AccessRecord(...)`) is named
    like one, which is how `record_writes` recognises it."""
    found = []
    for m in modules():
        for node in ast.walk(m.tree):
            held: list[str] = []
            if isinstance(node, ast.arg) and holds_a_record(node.annotation):
                held.append(node.arg)
            elif isinstance(node, ast.AnnAssign) and holds_a_record(node.annotation):
                held.append(last_name(node.target))
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                if ast.unparse(node.value.func).endswith("AccessRecord"):
                    held += [last_name(t) for t in node.targets]
            found += [
                f"{m.where}:{getattr(node, 'lineno', 0)} {name}"
                for name in held
                if name != "self" and not RECORD_NAME.search(name)
            ]
    assert not found, report(found)


def holds_a_record(annotation: ast.expr | None) -> bool:
    """`AccessRecord` or `AccessRecord | None`, not a container of records."""
    text = ast.unparse(annotation) if annotation is not None else ""
    return bool(re.fullmatch(r"(AccessRecord)( \| None)?|None \| AccessRecord", text))


CONN_OWNER = "egress.proxy.net.conn"
CONN_NAME = re.compile(r"(^|_)conn$")


def conn_writes(ms: tuple[Module, ...] | None = None) -> list[str]:
    """Assignments to (or deletions of) an attribute of a `Conn` outside `net/conn.py`: a
    connection changes state through its own methods, named for what happened
    (`conn.request_ended(now)`, `conn.cut_by(End.REVOKED)`), so its state is written in one
    module (issue 33).

    A `Conn` is recognised by its name (`conn`, `self.conn`, `client_conn`, ...):
    `test_conn_names_say_so` keeps every annotated or constructed one named that way."""
    found = []
    for m in ms or modules():
        if m.name == CONN_OWNER:
            continue
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
                if CONN_NAME.search(last_name(node.value)):
                    found.append(f"{m.where}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("setattr"):
                if node.args and CONN_NAME.search(last_name(node.args[0])):
                    found.append(f"{m.where}:{node.lineno} {ast.unparse(node)}")
    return found


def test_conn_state_is_written_only_by_its_own_methods() -> None:
    found = conn_writes()
    assert not found, report(found)


def held_conns(ms: tuple[Module, ...] | None = None) -> list[str]:
    """Names that hold a `Conn` (annotated `Conn` or `Conn | None`, made by `Conn(...)`, or
    the loop variable over a set of them) but are not named like one."""
    found = []
    for m in ms or modules():
        for node in ast.walk(m.tree):
            held: list[str] = []
            if isinstance(node, ast.arg) and holds_a_conn(node.annotation):
                held.append(node.arg)
            elif isinstance(node, ast.AnnAssign) and holds_a_conn(node.annotation):
                held.append(last_name(node.target))
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                if ast.unparse(node.value.func).endswith("Conn"):
                    held += [last_name(t) for t in node.targets]
            elif isinstance(node, ast.For | ast.comprehension):
                source = ast.unparse(node.iter)
                if re.search(r"\bconns\b|\.evicted\b", source):
                    held += [last_name(t) for t in ast.walk(node.target) if isinstance(t, ast.Name)]
            found += [
                f"{m.where}:{getattr(node, 'lineno', 0)} {name}"
                for name in held
                if name != "self" and not CONN_NAME.search(name)
            ]
    return found


def test_conn_names_say_so() -> None:
    """Whatever holds a `Conn` is named like one, which is how `conn_writes` recognises it."""
    found = [f for f in held_conns() if not f.startswith("egress/proxy/net/conn.py")]
    assert not found, report(found)


def test_the_conn_checks_see_loops_and_setattr() -> None:
    source = (
        "def f(self):\n"
        "    for c in [c for c in self.context.conns]:\n"
        "        setattr(c, 'end', 'x')\n"
        "    setattr(self.conn, 'end', 'x')\n"
        "    del client_conn.task\n"
    )
    module = fake_module(source, "egress.proxy.fake")
    assert held_conns((module,)) == ["egress/proxy/fake.py:2 c", "egress/proxy/fake.py:0 c"]
    assert conn_writes((module,)) == [
        "egress/proxy/fake.py:4 setattr(self.conn, 'end', 'x')",
        "egress/proxy/fake.py:5 client_conn.task",
    ]


def test_the_response_check_sees_a_driver_reading_a_response() -> None:
    source = (
        "def on_upstream(self, x, up):\n"
        "    parsed = wire.parse_response_head(up.buf, request_method='GET')\n"
        "    step = x.response(parsed[0].status)\n"
        "    return response_step(200)\n"
    )
    assert response_decisions((fake_module(source, "egress.proxy.drive.fake"),)) == [
        "egress/proxy/drive/fake.py:2 wire.parse_response_head",
        "egress/proxy/drive/fake.py:3 x.response",
        "egress/proxy/drive/fake.py:4 response_step",
    ]


def holds_a_conn(annotation: ast.expr | None) -> bool:
    """`Conn` or `Conn | None` (quoted or not), not a container of them."""
    text = ast.unparse(annotation).strip("'\"") if annotation is not None else ""
    return bool(re.fullmatch(r"(Conn)( \| None)?|None \| Conn", text))


RESPONSE_READER = "egress.proxy.core.reader"
# what reading a response head and deciding from it takes: the reader's alone (and the
# exchange's, for the 1xx/101 step it records)
RESPONSE_CALLS = {
    "parse_response_head": RESPONSE_READER,
    "response": RESPONSE_READER,  # `Exchange.response(status)`
    "passthrough_response_head": RESPONSE_READER,
    "forward_response_headers": RESPONSE_READER,
    "response_step": RECORD_FIELDS_OWNER,
}
RESPONSE_NAME = re.compile(r"^resp(onse)?(_head)?$")


def response_decisions(ms: tuple[Module, ...] | None = None) -> list[str]:
    """Places outside the response reader (`proxy/core/reader.py`) that read a response head
    or decide from it: a call of what parses, steps or rewrites one, or a read of a response
    head's `status`, `keep_alive` or `connection_tokens`. 1xx, 101, keep-alive and pooling
    are decided once, for both drivers (issue 33 item 2); the codec defines the parsers."""
    found = []
    for m in ms or modules():
        if not m.name.startswith("egress.proxy.") or m.name == RESPONSE_READER:
            continue
        if m.name.startswith("egress.proxy.codec"):
            continue
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call):
                name = last_name(node.func)
                if name in RESPONSE_CALLS and RESPONSE_CALLS[name] != m.name:
                    found.append(f"{m.where}:{node.lineno} {ast.unparse(node.func)}")
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                if node.attr in ("status", "keep_alive", "connection_tokens") and (
                    RESPONSE_NAME.search(last_name(node.value))
                ):
                    found.append(f"{m.where}:{node.lineno} {ast.unparse(node)}")
    return found


def test_response_decisions_live_in_the_reader() -> None:
    found = response_decisions()
    assert not found, report(found)


def private_imports(ms: tuple[Module, ...] | None = None) -> list[str]:
    """`_private` names a module takes from another project module (h11's shape: private
    modules with public names, re-exported by the package; never a sibling's `_name`)."""
    found = []
    for m in ms or modules():
        imported_modules: set[str] = set()
        for node in ast.walk(m.tree):
            if isinstance(node, ast.ImportFrom):
                source = absolute(m, node)
                if not is_project(source):
                    continue
                for alias in node.names:
                    if f"{source}.{alias.name}" in module_names():
                        imported_modules.add(alias.asname or alias.name)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{m.where}:{node.lineno} {alias.name} from {source}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if is_project(alias.name):
                        imported_modules.add(alias.asname or alias.name.split(".")[0])
                        for part in alias.name.split("."):
                            if part.startswith("_") and part != "__init__":
                                found.append(f"{m.where}:{node.lineno} {alias.name}")
        for node in ast.walk(m.tree):
            # `module._name`, for a module imported as a whole
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and ast.unparse(node.value).split(".")[0] in imported_modules
            ):
                found.append(f"{m.where}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_private_name_crosses_a_module() -> None:
    found = private_imports()
    assert not found, report(found)


def format_skips(ms: tuple[Module, ...] | None = None) -> list[str]:
    found = []
    for m in ms or modules():
        for i, line in enumerate(m.source.splitlines(), 1):
            if re.search(r"#\s*fmt:\s*(skip|off)", line):
                found.append(f"{m.where}:{i}")
    return found


def test_no_format_skips() -> None:
    """The formatter's layout everywhere: a table that needs hand layout is data."""
    found = format_skips()
    assert not found, report(found)


def project_bases(m: Module, cls: ast.ClassDef) -> list[str]:
    return [ast.unparse(b) for b in cls.bases if is_project_class(m, b)]


def is_project_class(m: Module, base: ast.expr) -> bool:
    """Is `base` the project's own class: defined in the module, or imported from (a module
    of) `egress` or `netcut`?"""
    local = {n.name for n in m.tree.body if isinstance(n, ast.ClassDef)}
    origin: dict[str, str] = {}
    for node in ast.walk(m.tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                origin[alias.asname or alias.name] = absolute(m, node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                origin[alias.asname or alias.name.split(".")[0]] = alias.name
    head = ast.unparse(base).split("[")[0].split(".")[0]
    return head in local or is_project(origin.get(head, ""))


def multiple_bases(ms: tuple[Module, ...] | None = None) -> list[str]:
    found = []
    for m in ms or modules():
        for node in ast.walk(m.tree):
            if isinstance(node, ast.ClassDef):
                bases = project_bases(m, node)
                if len(bases) > 1:
                    found.append(f"{m.where}:{node.lineno} {node.name}({', '.join(bases)})")
    return found


def test_no_class_has_two_project_bases() -> None:
    """Composition, not mixins: a class owns its parts (httpcore's one override point)."""
    found = multiple_bases()
    assert not found, report(found)


@cache
def comments(m: Module) -> dict[int, str]:
    tokens = tokenize.generate_tokens(io.StringIO(m.source).readline)
    return {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}


def framework_signature(m: Module, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The framework method `fn` overrides, as its marker names it, or None."""
    first = fn.decorator_list[0].lineno if fn.decorator_list else fn.lineno
    for line in range(first - 1, fn.body[0].lineno):
        match = FRAMEWORK_MARKER.search(comments(m).get(line, ""))
        if match:
            return match.group(1)
    return None


def positional(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool = False) -> int:
    """Parameters a caller may pass by position; a method's `self` or `cls` is not one."""
    count = len(fn.args.posonlyargs) + len(fn.args.args)
    static = any(ast.unparse(d) == "staticmethod" for d in fn.decorator_list)
    return count - 1 if method and count and not static else count


def methods(tree: ast.AST) -> set[int]:
    """`id`s of the functions defined directly in a class body."""
    return {
        id(fn)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for fn in cls.body
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def long_signatures(ms: tuple[Module, ...] | None = None) -> list[str]:
    found = []
    for m in ms or modules():
        in_class = methods(m.tree)
        for fn in functions(m.tree):
            count = positional(fn, id(fn) in in_class)
            if count > MAX_POSITIONAL and not framework_signature(m, fn):
                found.append(f"{m.where}:{fn.lineno} {fn.name} {count}")
    return found


def test_no_function_takes_more_than_six_positional_parameters() -> None:
    """More than six: keyword-only parameters, or a small frozen dataclass (smokescreen's
    `DecideArgs`)."""
    found = long_signatures()
    assert not found, report(found)


def test_framework_markers_name_an_override() -> None:
    """A marker excuses only a method of a class with a base from outside the project, and
    names that base's method."""
    found = []
    for m in modules():
        for cls in ast.walk(m.tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            foreign = [b for b in cls.bases if not is_project_class(m, b)]
            for fn in cls.body:
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                named = framework_signature(m, fn)
                if named is None:
                    continue
                if not foreign or not named.endswith(f".{fn.name}"):
                    found.append(f"{m.where}:{fn.lineno} {fn.name}: {named}")
    for m in modules():
        methods = {
            id(fn)
            for cls in ast.walk(m.tree)
            if isinstance(cls, ast.ClassDef)
            for fn in cls.body
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        for fn in functions(m.tree):
            if id(fn) not in methods and framework_signature(m, fn):
                found.append(f"{m.where}:{fn.lineno} {fn.name}: not a method")
    assert not found, report(found)


def is_argparse_builder(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A function that only builds an argument parser: most of its statements declare
    arguments or subcommands. Those read best as one list, so the length limit spares them."""
    calls = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in {"add_argument", "add_parser", "add_mutually_exclusive_group"}
    ]
    statements = [n for n in ast.walk(fn) if isinstance(n, ast.stmt)]
    return len(calls) * 2 >= len(statements) - 1


def long_functions(ms: tuple[Module, ...] | None = None) -> list[str]:
    found = []
    for m in ms or modules():
        for fn in functions(m.tree):
            length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            if length > MAX_FUNCTION_LINES and not is_argparse_builder(fn):
                found.append(f"{m.where}:{fn.lineno} {fn.name} {length}")
    return found


def test_no_function_is_over_eighty_lines() -> None:
    """Split into named steps (a sequence as data where it is one); argparse builders are one
    list of arguments and are spared."""
    found = long_functions()
    assert not found, report(found)


def test_the_builder_exception_sees_builders_only() -> None:
    args = "".join(f"    p.add_argument('--a{i}')\n" for i in range(90))
    builder = fake_module("def b(p):\n" + args)
    worker = fake_module("def w(p):\n    p.add_argument('--a')\n" + "    x = 1\n" * 90)
    assert long_functions((builder,)) == []
    assert long_functions((worker,)) == ["egress/fake.py:1 w 92"]


def subpackage_docstrings(ms: tuple[Module, ...] | None = None) -> list[str]:
    found = []
    for m in ms or modules():
        if m.path.name != "__init__.py" or "." not in m.name:
            continue
        doc = " ".join((ast.get_docstring(m.tree) or "").split())
        if not doc.endswith(".") or ". " in doc:
            found.append(f"{m.where}: {doc!r}")
    return found


def test_every_subpackage_says_what_it_holds_in_one_sentence() -> None:
    found = subpackage_docstrings()
    assert not found, report(found)


def banned_names(ms: tuple[Module, ...] | None = None) -> list[str]:
    return [
        m.where
        for m in ms or modules()
        if m.name.rpartition(".")[2] in BANNED_MODULE_NAMES or m.path.stem in BANNED_MODULE_NAMES
    ]


def test_no_module_is_named_for_no_concept() -> None:
    """`utils`, `helpers`, `steps` and the like say nothing of what they own."""
    found = banned_names()
    assert not found, report(found)


def differ_by_suffix(a: str, b: str) -> bool:
    """Do two module names differ only by a suffix? One extends the other (`flow`/`flows`,
    `target`/`targetref`), or they share all but a short ending (`listener`/`listening`,
    `state`/`status`)."""
    a, b = sorted((a, b), key=len)
    if b.startswith(a):
        return True
    common = len(next((p for p in _prefixes(a) if b.startswith(p)), ""))
    return common >= 4 and common >= len(a) - 2


def _prefixes(name: str) -> Iterator[str]:
    return (name[:n] for n in range(len(name), 0, -1))


def suffix_twins(ms: tuple[Module, ...] | None = None) -> list[str]:
    found = []
    folders: dict[Path, list[str]] = {}
    for m in ms or modules():
        stem = m.path.stem if m.path.name != "__init__.py" else m.path.parent.name
        folder = m.path.parent if m.path.name != "__init__.py" else m.path.parent.parent
        folders.setdefault(folder, []).append(stem)
    for folder, stems in sorted(folders.items()):
        stems = sorted(set(stems) - {"__init__", "__main__"})
        for i, a in enumerate(stems):
            for b in stems[i + 1 :]:
                if differ_by_suffix(a, b):
                    found.append(f"{folder.relative_to(ROOT)}: {a} / {b}")
    return found


def test_no_two_modules_in_a_folder_differ_only_by_a_suffix() -> None:
    found = suffix_twins()
    assert not found, report(found)


@pytest.mark.parametrize(
    ("a", "b", "twins"),
    [
        ("flow", "flows", True),
        ("target", "targetref", True),
        ("listener", "listening", True),
        ("state", "status", True),
        ("state", "statedump", True),
        ("log", "logfile", True),
        ("read", "redact", False),
        ("format", "follow", False),
        ("request", "response", False),
        ("resolve", "records", False),
    ],
)
def test_the_suffix_rule(a: str, b: str, twins: bool) -> None:
    assert differ_by_suffix(a, b) is twins


# --- size limits (issue 33) ---------------------------------------------------------------

# docs/architecture.md#design-checks: a module is one concept, a class one owner of state;
# no allowance (the last, core/exchange.py, was split: its legal sequence in core/sequence.py,
# its kept decision in core/kept.py), so a module or class over its limit fails at once.
MAX_MODULE_LINES = 450
MAX_CLASS_METHODS = 25  # `def`s and `async def`s in the class body


def module_lengths(ms: tuple[Module, ...] | None = None) -> dict[str, int]:
    return {m.where: len(m.source.splitlines()) for m in ms or modules()}


def class_methods(ms: tuple[Module, ...] | None = None) -> dict[str, tuple[int, int]]:
    """`path:Class` -> (its line, how many methods its body defines), nested classes too."""
    found = {}
    for m in ms or modules():
        for node in ast.walk(m.tree):
            if isinstance(node, ast.ClassDef):
                count = sum(
                    isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in node.body
                )
                found[f"{m.where}:{node.name}"] = (node.lineno, count)
    return found


def long_modules(ms: tuple[Module, ...] | None = None) -> list[str]:
    return [
        f"{where}: {lines} lines"
        for where, lines in module_lengths(ms).items()
        if lines > MAX_MODULE_LINES
    ]


def crowded_classes(ms: tuple[Module, ...] | None = None) -> list[str]:
    found = []
    for key, (line, count) in class_methods(ms).items():
        if count > MAX_CLASS_METHODS:
            where, _, name = key.rpartition(":")
            found.append(f"{where}:{line} {name}: {count} methods")
    return found


def test_no_module_is_over_450_lines() -> None:
    """Split by concept, one module one concept (a folder says what its modules are); the
    old import path re-exports what callers took from it."""
    found = long_modules()
    assert not found, report(found)


def test_no_class_has_over_25_methods() -> None:
    """A class that many methods owns more than one thing: give each its own class."""
    found = crowded_classes()
    assert not found, report(found)


def test_the_size_limits_are_inclusive() -> None:
    """450 lines and 25 methods are within the limits; one more is not."""
    at = fake_module("x = 1\n" * MAX_MODULE_LINES)
    methods = "".join(f"    def m{i}(self): ...\n" for i in range(MAX_CLASS_METHODS))
    full = fake_module("class C:\n" + methods)
    assert long_modules((at,)) == []
    assert crowded_classes((full,)) == []
    over = fake_module("class C:\n" + methods + "    async def more(self): ...\n")
    assert crowded_classes((over,)) == ["egress/fake.py:1 C: 26 methods"]


def fake_module(source: str, name: str = "egress.fake") -> Module:
    path = ROOT / (name.replace(".", "/") + ".py")
    return Module(path, name, ast.parse(source), source)


def renamed_classes(ms: tuple[Module, ...] | None = None) -> list[str]:
    """A class of the project imported under another name (`Refuse as Verdict`): one concept,
    one name, so a reader never meets the same class twice under two names (or two classes
    under one)."""
    found = []
    for m in ms or modules():
        if not m.name.startswith("egress.proxy"):
            continue
        for node in ast.walk(m.tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            ours = node.level > 0 or (node.module or "").split(".")[0] in PACKAGES
            for alias in node.names:
                renamed = alias.asname not in (None, alias.name)
                if ours and renamed and alias.name[:1].isupper() and not alias.name.isupper():
                    found.append(f"{m.where}:{node.lineno} {alias.name} as {alias.asname}")
    return found


def proxy_class_names(ms: tuple[Module, ...] | None = None) -> list[str]:
    """Two classes of `egress/proxy` with one name (there were two `Refuse`s: the gate's
    verdict and the action that carries it out)."""
    seen: dict[str, str] = {}
    found = []
    for m in ms or modules():
        if not m.name.startswith("egress.proxy"):
            continue
        for node in m.tree.body:
            if isinstance(node, ast.ClassDef):
                if node.name in seen:
                    found.append(f"{m.where}:{node.lineno} {node.name} (also {seen[node.name]})")
                seen.setdefault(node.name, m.where)
    return found


def test_one_name_per_concept() -> None:
    found = renamed_classes() + proxy_class_names()
    assert not found, report(found)


OFFENCES = {
    "except_refused": "try:\n    pass\nexcept Refused:\n    pass\n",
    "record_writes": "def f(rec):\n    rec.status = 1\n",
    "conn_writes": "def f(self):\n    self.conn.phase = 'idle'\n    self.conn.request_ended(0)\n",
    "held_conns": "def f(c: Conn, conn: Conn | None):\n    for conn in self.conns:\n        pass\n",
    "response_decisions": "def f(resp, up, x):\n    return resp.keep_alive and up.keep_alive\n",
    "private_imports": "from egress.proxy.core.record import _x\n",
    "renamed_classes": "from egress.proxy.core.gate import Verdict as Refusal, OK as OK\n",
    "format_skips": "x = 1  # fmt: skip\n",
    "multiple_bases": "class B: ...\nclass C: ...\nclass A(B, C): ...\n",
    "long_signatures": "def f(a, b, c, d, e, f, g): ...\n",
    "long_functions": "def f():\n" + "    x = 1\n" * 80,
    "long_modules": "x = 1\n" * (MAX_MODULE_LINES + 1),
    "crowded_classes": "class C:\n"
    + "".join(f"    def m{i}(self): ...\n" for i in range(MAX_CLASS_METHODS + 1)),
    "action_dispatches": (
        "from egress.proxy.core.actions import Dial, Refuse as Refusal\n"
        "def drive(action):\n"
        "    if isinstance(action, Dial):\n"
        "        pass\n"
        "    elif action.__class__ is Refusal:\n"
        "        pass\n"
        "def narrow(action):\n"
        "    assert isinstance(action, Dial)\n"
    ),
}


@pytest.mark.parametrize("check", sorted(OFFENCES))
def test_each_check_would_see_an_offence(check: str) -> None:
    """The checks are only as good as what they can see: each is shown one offence."""
    found = globals()[check]((fake_module(OFFENCES[check], "egress.proxy.fake"),))
    assert len(found) == 1, found


def test_the_tree_checks_would_see_an_offence() -> None:
    package = fake_module('"""Two sentences. Not one."""\n', "egress.fake.__init__")
    package = Module(ROOT / "egress/fake/__init__.py", "egress.fake", package.tree, "")
    assert subpackage_docstrings((package,)) == [
        "egress/fake/__init__.py: 'Two sentences. Not one.'"
    ]
    assert banned_names((fake_module("", "egress.proxy.utils"),)) == ["egress/proxy/utils.py"]
    twins = (fake_module("", "netcut.flow"), fake_module("", "netcut.flows"))
    assert suffix_twins(twins) == ["netcut: flow / flows"]


def test_a_framework_marker_excuses_an_override_only() -> None:
    source = (
        "from inspect_ai.util import SandboxEnvironment\n"
        "class S(SandboxEnvironment):\n"
        "    # framework-signature: inspect_ai.util.SandboxEnvironment.exec\n"
        "    def exec(self, a, b, c, d, e, f, g): ...\n"
    )
    assert long_signatures((fake_module(source),)) == []
    assert long_signatures((fake_module(source.replace("# framework-signature", "#")),))


def test_the_layering_tests_check_the_pure_folders_whole() -> None:
    """`proxy/core/`, `proxy/codec/` and `netcut/plan/` are pure by folder: the layering tests
    (test_layering.py, test_netcut_imports.py) check every module in them, listed by none."""
    import test_layering
    import test_netcut_imports

    for folder in ("proxy/core", "proxy/codec"):
        assert folder in test_layering.PURE_FOLDERS
        for path in (ROOT / "egress" / folder).rglob("*.py"):
            assert path in test_layering.IN_FOLDERS, path
    assert set(test_netcut_imports.PLAN) == set((ROOT / "netcut" / "plan").glob("*.py"))


# --- no reference to a file that no longer exists (issue 33) ---------------------------------

# Files of other projects the code and docs cite by name (a model, a peer, a framework).
EXTERNAL_FILES = frozenset({"_state.py", "os.py", "egress.py", "proxy.py"})


def test_no_reference_to_a_python_file_that_does_not_exist() -> None:
    """A `name.py` named in egress/, netcut/ or docs/ is one of ours (or a listed external
    file): renames leave no stale pointers behind (`steps.py`, `wire.py`, `auditfmt` did)."""
    ours = {
        p.name for d in ("egress", "netcut", "tests", "bench") for p in (ROOT / d).rglob("*.py")
    } | {p.name for p in ROOT.glob("*.py")}  # setup.py
    found = []
    for folder in ("egress", "netcut", "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".md"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for name in re.findall(r"`(?:[\w./-]*/)?([\w-]+\.py)`", line):
                    if name not in ours and name not in EXTERNAL_FILES:
                        found.append(f"{path.relative_to(ROOT)}:{number} {name}")
    assert not found, report(found)


def test_test_files_have_unique_names() -> None:
    """pytest imports test files by basename (no packages under tests/): two with one name
    stop the whole run at collection (tests/unit and tests/integration both had
    test_no_lookup.py)."""
    seen: dict[str, Path] = {}
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            found.append(f"{path.relative_to(ROOT)} and {seen[path.name].relative_to(ROOT)}")
        seen[path.name] = path
    assert not found, report(found)


# --- no import cycle (issue 33) ----------------------------------------------------------------


def imports_of(module: Module, known: frozenset[str]) -> set[str]:
    """The project modules `module` imports: every `import`, at the top, inside a function or
    under `if TYPE_CHECKING:` (a type-only import is a dependency of the design all the same),
    relative ones resolved. `from package import name` is an import of `package.name` when
    that is a module, else of `package`; a module's parent packages are not its imports.
    `known`: the project's modules."""
    found: set[str] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if is_project(a.name))
        elif isinstance(node, ast.ImportFrom):
            source = absolute(module, node)
            if not is_project(source):
                continue
            for alias in node.names:
                inner = f"{source}.{alias.name}"
                found.add(inner if inner in known else source)
    return {name for name in found if name in known and name != module.name}


def import_cycles(ms: tuple[Module, ...] | None = None) -> list[tuple[str, ...]]:
    """Every cycle of the import graph, as its strongly connected component (Tarjan's
    algorithm, iterative), each sorted, in sorted order."""
    ms = ms or modules()
    known = frozenset(m.name for m in ms)
    graph = {m.name: sorted(imports_of(m, known)) for m in ms}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[tuple[str, ...]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            edges = [e for e in graph[node] if e in graph]
            if i < len(edges):
                work.append((node, i + 1))
                child = edges[i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(tuple(sorted(component)))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(cycles)


def describe_cycle(cycle: tuple[str, ...], ms: tuple[Module, ...] | None = None) -> str:
    """A cycle's modules, and which of them imports which inside it."""
    by_name = {m.name: m for m in ms or modules()}
    ties = [
        f"  {name} -> {other}"
        for name in cycle
        for other in sorted(imports_of(by_name[name], frozenset(cycle)))
    ]
    return " <-> ".join(cycle) + "\n" + "\n".join(ties)


# Cycles known on main and left to another branch: each is named, and must still exist (a cycle
# removed is struck from here, so none can come back unseen).
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}


def test_no_import_cycle() -> None:
    """Dependencies point one way (docs/architecture.md#design-checks): a pure core never
    imports its shell, a component never imports what owns it; type-only imports count."""
    found = [describe_cycle(c) for c in import_cycles() if c not in KNOWN_CYCLES]
    assert not found, report(found)


def test_every_known_cycle_still_exists() -> None:
    gone = sorted(set(KNOWN_CYCLES) - set(import_cycles()))
    assert not gone, f"strike these from KNOWN_CYCLES: {gone}"


def test_the_cycle_check_sees_type_only_and_relative_imports() -> None:
    a = fake_module(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "egress.fake.a",
    )
    b = fake_module("def f():\n    from egress.fake import a\n", "egress.fake.b")
    c = fake_module("import egress.fake.a\n", "egress.fake.c")
    assert import_cycles((a, b, c)) == [("egress.fake.a", "egress.fake.b")]
    assert "egress.fake.a -> egress.fake.b" in describe_cycle(
        ("egress.fake.a", "egress.fake.b"), (a, b)
    )


PROXY_MODULE = "egress.proxy.server"


def parts_holding_the_proxy(ms: tuple[Module, ...] | None = None) -> list[str]:
    """Modules of `egress/proxy` that import `server.py`: a part of the proxy is handed what it
    needs (the `ProxyContext`, callables), never `EgressProxy` (issue 33)."""
    ms = ms or modules()
    known = frozenset(m.name for m in ms) | {PROXY_MODULE}
    return [
        m.where
        for m in ms
        if m.name.startswith("egress.proxy.")
        and m.name != PROXY_MODULE
        and PROXY_MODULE in imports_of(m, known)
    ]


def test_no_part_of_the_proxy_holds_the_proxy() -> None:
    found = parts_holding_the_proxy()
    assert not found, report(found)


def test_the_holding_check_sees_a_type_only_import() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..server import EgressProxy\n"
    )
    part = fake_module(source, "egress.proxy.telemetry.fake")
    assert parts_holding_the_proxy((part,)) == ["egress/proxy/telemetry/fake.py"]


def test_the_class_name_check_sees_a_twin() -> None:
    one = fake_module("class Refuse: ...\n", "egress.proxy.core.gate")
    two = fake_module("class Refuse: ...\n", "egress.proxy.core.actions")
    assert proxy_class_names((one, two)) == [
        "egress/proxy/core/actions.py:1 Refuse (also egress/proxy/core/gate.py)"
    ]


# --- each module has its test file (issue 33) --------------------------------------------------

# A module `<package>/<folders>/name.py` has its tests in a file `tests/**/test_name.py`, or,
# where two modules share a name, `tests/**/test_<folder>_name.py` with one of the folders it
# is in (`test_audit_writer.py` for `egress/audit/writer.py`, `test_netcut_cli.py` for
# `netcut/cli.py`), so the tests of a module are found from its name. A package's
# `__init__.py`, a `__main__.py` and a module that only re-exports (imports, a docstring,
# `__all__`) have none of their own (docs/architecture.md#design-checks).
#
# The modules with no test file of their own when this check came (110 of 164; 92 once tests
# already written were in files named for their modules, and a few pure modules had their
# own), each run by others' tests, the integration tests mostly. The list
# only shrinks: a module that gets its test file must be struck from it
# (`test_the_untested_list_only_shrinks`), and a new module is never added to it.
UNTESTED_MODULES = frozenset(
    {
        "egress/audit/backlog.py",
        "egress/audit/commands.py",
        "egress/audit/deliver.py",
        "egress/audit/digest.py",
        "egress/audit/disk.py",
        "egress/audit/handover.py",
        "egress/audit/log.py",
        "egress/audit/outage.py",
        "egress/audit/read.py",
        "egress/audit/redact.py",
        "egress/audit/render.py",
        "egress/audit/sections.py",
        "egress/audit/timebounds.py",
        "egress/boundary/checks.py",
        "egress/boundary/cutting.py",
        "egress/boundary/execution.py",
        "egress/boundary/gateway.py",
        "egress/boundary/lifecycle.py",
        "egress/boundary/passing.py",
        "egress/boundary/plan.py",
        "egress/boundary/sandboxes.py",
        "egress/check.py",
        "egress/cli.py",
        "egress/errors.py",
        "egress/integrations/harbor.py",
        "egress/integrations/hb_inspect.py",
        "egress/integrations/hb_policy.py",
        "egress/integrations/inspect.py",
        "egress/integrations/netns_sandbox.py",
        "egress/integrations/shared.py",
        "egress/integrations/verifiers.py",
        "egress/integrations/vf_hook.py",
        "egress/integrations/vf_runtime.py",
        "egress/options.py",
        "egress/policy/transcribe.py",
        "egress/policy/verifiers.py",
        "egress/proxy/context.py",
        "egress/proxy/core/actions.py",
        "egress/proxy/drive/callback.py",
        "egress/proxy/drive/coroutine.py",
        "egress/proxy/drive/fastpath.py",
        "egress/proxy/drive/tunnel.py",
        "egress/proxy/endpoints.py",
        "egress/proxy/heap.py",
        "egress/proxy/modes/connect.py",
        "egress/proxy/modes/forwarder.py",
        "egress/proxy/modes/http.py",
        "egress/proxy/net/conn.py",
        "egress/proxy/net/dialer.py",
        "egress/proxy/net/listener.py",
        "egress/proxy/net/netns.py",
        "egress/proxy/net/pool.py",
        "egress/proxy/net/relay.py",
        "egress/proxy/net/resolve.py",
        "egress/proxy/net/stepped.py",
        "egress/proxy/runtime.py",
        "egress/proxy/server.py",
        "egress/proxy/telemetry/admin.py",
        "egress/proxy/telemetry/insight.py",
        "egress/proxy/telemetry/observe.py",
        "egress/proxy/tenants.py",
        "egress/reload.py",
        "egress/thread.py",
        "netcut/api.py",
        "netcut/argtypes.py",
        "netcut/collect.py",
        "netcut/direct/iptables.py",
        "netcut/direct/kernelstate.py",
        "netcut/direct/probe.py",
        "netcut/direct/rtnl.py",
        "netcut/direct/shellface.py",
        "netcut/direct/sockdestroy.py",
        "netcut/direct/worker.py",
        "netcut/errors.py",
        "netcut/flow.py",
        "netcut/helper/container.py",
        "netcut/helper/dump.py",
        "netcut/helper/image.py",
        "netcut/helper/mode.py",
        "netcut/helper/run.py",
        "netcut/helper/script.py",
        "netcut/helper/session.py",
        "netcut/iptables_shell.py",
        "netcut/iptables_text.py",
        "netcut/modes.py",
        "netcut/netfilter.py",
        "netcut/plan/changes.py",
        "netcut/plan/model.py",
        "netcut/plan/planner.py",
        "netcut/plan/status.py",
        "netcut/resolve.py",
        "netcut/targetref.py",
    }
)


def reexports_only(m: Module) -> bool:
    """A module with no code of its own: imports, its docstring and `__all__` only."""
    for node in m.tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else []
        if targets and all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            continue
        return False
    return True


def names_of_its_tests(m: Module) -> frozenset[str]:
    """The names a test file of `m` may have: `test_name.py`, `test_<folder>_name.py`."""
    folders = m.path.relative_to(ROOT).parts[:-1]
    stem = m.path.stem
    return frozenset({f"test_{stem}.py", *(f"test_{folder}_{stem}.py" for folder in folders)})


def existing_test_files() -> frozenset[str]:
    return frozenset(p.name for p in (ROOT / "tests").rglob("test_*.py"))


def modules_without_a_test_file(
    ms: tuple[Module, ...] | None = None, tests: frozenset[str] | None = None
) -> list[str]:
    tests = existing_test_files() if tests is None else tests
    return [
        m.where
        for m in ms or modules()
        if m.path.name not in ("__init__.py", "__main__.py")
        and not reexports_only(m)
        and not names_of_its_tests(m) & tests
    ]


def test_every_module_has_its_test_file() -> None:
    found = [w for w in modules_without_a_test_file() if w not in UNTESTED_MODULES]
    assert not found, report(found)


def test_the_untested_list_only_shrinks() -> None:
    """A listed module that has its test file now, or that is gone, is struck from the list:
    it cannot go stale, and cannot be used again."""
    stale = sorted(UNTESTED_MODULES - set(modules_without_a_test_file()))
    assert not stale, f"strike these from UNTESTED_MODULES: {stale}"


def test_the_test_file_check_sees_a_module_without_one() -> None:
    ms = (
        fake_module("def f(): ...\n", "egress.audit.writer"),
        fake_module("def f(): ...\n", "netcut.cli"),
        fake_module("def f(): ...\n", "egress.proxy.core.gate"),
        fake_module("from .gate import f\n__all__ = ['f']\n", "egress.proxy.codec.http1"),
        fake_module("def f(): ...\n", "egress.proxy.fake.__init__"),
    )
    tests = frozenset({"test_audit_writer.py", "test_netcut_cli.py", "test_http1_gate.py"})
    assert modules_without_a_test_file(ms, tests) == ["egress/proxy/core/gate.py"]
