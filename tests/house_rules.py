"""The house rules of fedhet's code, read from the source (``tests/test_house_rules.py`` runs them).

Each rule is a function over a :class:`Tree` (the four packages' files, parsed once) returning
:class:`Violation` rows; :func:`check` runs them all.  The rules:

- ``toolkit-twin``: a second definition of a toolkit helper (seeds, devices, seeded RNG, network
  builders, the scaler and batch order: every public name of ``algorithms/toolkit.py``) or of
  the settings parser (``parse_settings``) outside its home, and a ``from_dict``/``from_cfg``
  parser on a ``*Config``/``*Settings`` class (settings have one parser);
- ``settings-dict``: a role (a function in an algorithm's ``roles.py``) reading its settings as
  a table: ``s.get(...)``, ``s[...]``, ``dict(s)``, ``**s``;
- ``crypto-parties``: ``crypto/`` importing ``parties/`` (crypto knows no party);
- ``runtime-algorithms``: the runtime (``parties/`` outside ``parties/ops/``), ``protocols/`` or
  ``crypto/`` importing an algorithm (only the operations layer wires them);
- ``ops-layer``: a module outside the operations layer (``parties/ops/``) importing it, or importing
  the web stack (plotly, jinja2, starlette, uvicorn: the ``report`` extra);
- ``private-import``: a private name (``_x``) imported from another fedhet module (in the library,
  the benchmarks and the tests), or, in the library, read as an attribute of an imported one;
- ``import-cycle``: modules that import each other, directly or round a loop (every import
  counts, a function's local ones too);
- ``party-untyped``: a ``party`` parameter in ``protocols/`` or ``algorithms/`` without an
  annotation (a party object is a ``PartyLike``; a party's name is a ``str``);
- ``bare-seed-tag``: a literal number as a seed-stream tag (``default_rng([seed, 7919])``,
  ``SeedSequence([seed, 8])``) instead of a named ``toolkit.Stream`` tag;
- ``peer-check``: in ``protocols/`` or ``algorithms/``, a function that receives (``.recv(``,
  ``.gather(``) and then raises ``ValueError``, ``PartyError``, ``RuntimeError`` or ``TypeError``:
  a check on a peer's message raises ``PeerFault`` (names the sender, with the message's evidence),
  ``PeersDisagree`` or ``ProtocolMismatch`` (name nobody); a failure that is truly the party's own
  (its memory, its own policy) says so with an ``# own:`` comment on the ``raise`` line or the one above.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("parties", "crypto", "protocols", "algorithms")
USERS = ("benchmarks", "tests")   # read for private imports only
TOOLKIT = "algorithms/toolkit.py"
SEEDS = "algorithms/streams.py"   # the named numpy streams (numpy only), re-exported by the toolkit
SETTINGS_HOME = "parties/settings.py"
SETTINGS_PARSERS = ("from_dict", "from_cfg", "from_table")
SETTINGS_CLASSES = ("Config", "Settings")
SETTINGS_NAMES = ("s", "cfg", "c", "settings", "config")


@dataclass(frozen=True)
class Violation:
    rule: str
    where: str     # file:line
    what: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.where}: {self.what}"


class Tree:
    """The ``.py`` files of the four packages below ``root`` (a checkout), parsed."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.files = self._parse(PACKAGES)   # the library
        self.users = self._parse(USERS)

    def _parse(self, folders: tuple[str, ...]) -> dict[str, ast.Module]:
        out = {}
        self.lines: dict[str, list[str]] = getattr(self, "lines", {})
        for pkg in folders:
            for f in sorted((self.root / pkg).rglob("*.py")):
                rel = f.relative_to(self.root).as_posix()
                text = f.read_text()
                out[rel] = ast.parse(text, filename=rel)
                self.lines[rel] = text.splitlines()
        return out

    @staticmethod
    def module_of(rel: str) -> str:
        parts = rel[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return "fedhet." + ".".join(parts)

    @staticmethod
    def is_package(rel: str) -> bool:
        return rel.endswith("/__init__.py")

    def modules(self) -> dict[str, str]:
        """module name -> file."""
        return {self.module_of(rel): rel for rel in self.files}


def _imports(tree: Tree, rel: str, mod: ast.Module) -> list[tuple[ast.AST, str, list[str]]]:
    """Every import of a file: (node, absolute module, names imported from it)."""
    me = tree.module_of(rel)
    base = me if tree.is_package(rel) else me.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(mod):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append((node, a.name, []))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node, target, [a.name for a in node.names]))
    return out


def _where(rel: str, node: ast.AST) -> str:
    return f"{rel}:{getattr(node, 'lineno', 0)}"


def toolkit_twins(tree: Tree) -> list[Violation]:
    homes: dict[str, str] = {"parse_settings": SETTINGS_HOME}
    for home in (TOOLKIT, SEEDS):
        for node in tree.files[home].body if home in tree.files else []:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                homes[node.name] = home
    out = []
    for rel, mod in tree.files.items():
        for node in ast.walk(mod):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                home = homes.get(node.name)
                if home is not None and home != rel:
                    out.append(Violation("toolkit-twin", _where(rel, node),
                                         f"{node.name!r} is defined again; its one definition is in {home}"))
            if isinstance(node, ast.ClassDef) and node.name.endswith(SETTINGS_CLASSES):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name in SETTINGS_PARSERS:
                        out.append(Violation(
                            "toolkit-twin", _where(rel, item),
                            f"{node.name}.{item.name} parses settings a second way; the one parser is "
                            f"parse_settings in {SETTINGS_HOME}"))
    return out


def _settings_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    for a in fn.args.args + fn.args.kwonlyargs:
        ann = ast.unparse(a.annotation) if a.annotation is not None else ""
        if a.arg in SETTINGS_NAMES or ann.endswith("Settings"):
            names.add(a.arg)
    return names


def settings_as_dict(tree: Tree) -> list[Violation]:
    out = []
    for rel, mod in tree.files.items():
        if not (rel.startswith("algorithms/") and rel.endswith("/roles.py")):
            continue
        for fn in ast.walk(mod):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            names = _settings_params(fn)
            for node in ast.walk(fn):
                hit = None
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "get" and isinstance(node.func.value, ast.Name)
                        and node.func.value.id in names):
                    hit = f"{node.func.value.id}.get(...)"
                elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in names:
                    hit = f"{node.value.id}[...]"
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict"
                      and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in names):
                    hit = f"dict({node.args[0].id})"
                elif isinstance(node, ast.Dict) and any(k is None and isinstance(v, ast.Name) and v.id in names
                                                        for k, v in zip(node.keys, node.values)):
                    hit = "**settings"
                if hit:
                    out.append(Violation("settings-dict", _where(rel, node),
                                         f"role {fn.name!r} reads its settings as a table ({hit}); "
                                         f"use the typed attribute"))
    return out


def crypto_imports_parties(tree: Tree) -> list[Violation]:
    out = []
    for rel, mod in tree.files.items():
        if not rel.startswith("crypto/"):
            continue
        for node, target, _ in _imports(tree, rel, mod):
            if target == "fedhet.parties" or target.startswith("fedhet.parties."):
                out.append(Violation("crypto-parties", _where(rel, node), f"crypto/ imports {target}"))
    return out


OPS = "parties/ops/"          # the operations layer (CLI, launcher, engines, report, board, export...)
WEB_STACK = ("plotly", "jinja2", "starlette", "uvicorn")   # the `report` extra: the operations layer's only


def _is_under(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def runtime_imports_algorithms(tree: Tree) -> list[Violation]:
    out = []
    for rel, mod in tree.files.items():
        if rel.startswith(OPS) or rel.startswith("algorithms/"):
            continue
        for node, target, _ in _imports(tree, rel, mod):
            if _is_under(target, "fedhet.algorithms"):
                out.append(Violation("runtime-algorithms", _where(rel, node),
                                     f"{rel.split('/')[0]}/ imports {target}; only the operations layer "
                                     f"({OPS}) wires the algorithms (the runtime finds one by its entry point)"))
    return out


def ops_layer(tree: Tree) -> list[Violation]:
    out = []
    for rel, mod in tree.files.items():
        if rel.startswith(OPS):
            continue
        for node, target, _ in _imports(tree, rel, mod):
            if _is_under(target, "fedhet.parties.ops"):
                out.append(Violation("ops-layer", _where(rel, node),
                                     f"{rel} imports {target}: nothing outside the operations layer imports it"))
            elif target.split(".")[0] in WEB_STACK:
                out.append(Violation("ops-layer", _where(rel, node),
                                     f"{rel} imports {target}: the web stack is the operations layer's (the "
                                     f"`report` extra); a party machine does not install it"))
    return out


def private_imports(tree: Tree) -> list[Violation]:
    modules = tree.modules()
    out = []
    for rel, mod in {**tree.files, **tree.users}.items():
        aliases: dict[str, str] = {}
        for node, target, names in _imports(tree, rel, mod):
            if not target.startswith("fedhet"):
                continue
            if isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.asname})
            for a in getattr(node, "names", []):
                if isinstance(node, ast.ImportFrom):
                    full = f"{target}.{a.name}"
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        out.append(Violation("private-import", _where(rel, node),
                                             f"imports the private name {a.name!r} from {target}"))
                    elif full in modules:
                        aliases[a.asname or a.name] = full
        if rel not in tree.files:
            continue   # a test may read a module's private constants (white-box); it may not import them
        for node in ast.walk(mod):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                out.append(Violation("private-import", _where(rel, node),
                                     f"reads the private name {node.attr!r} of {aliases[node.value.id]}"))
    return out


def import_cycles(tree: Tree) -> list[Violation]:
    modules = tree.modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for rel, mod in tree.files.items():
        me = tree.module_of(rel)
        for _, target, names in _imports(tree, rel, mod):
            for cand in [f"{target}.{n}" for n in names] or [target]:
                dest = cand if cand in modules else (target if target in modules else None)
                if dest is not None and dest != me:
                    graph[me].add(dest)
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [Violation("import-cycle", modules[c[0]], "these modules import each other: " + " <-> ".join(c))
            for c in sccs]


def untyped_parties(tree: Tree) -> list[Violation]:
    out = []
    for rel, mod in tree.files.items():
        if not rel.startswith(("protocols/", "algorithms/")):
            continue
        for fn in ast.walk(mod):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
                    if a.arg == "party" and a.annotation is None:
                        out.append(Violation("party-untyped", _where(rel, fn),
                                             f"{fn.name}(party, ...) has no annotation; a party is a PartyLike"))
    return out


_SEED_CALLS = ("default_rng", "SeedSequence")


def bare_seed_tags(tree: Tree) -> list[Violation]:
    out = []
    for rel, mod in tree.files.items():
        if rel in (TOOLKIT, SEEDS):
            continue
        for node in ast.walk(mod):
            if not isinstance(node, ast.Call):
                continue
            fname = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if fname not in _SEED_CALLS or not node.args or not isinstance(node.args[0], (ast.List, ast.Tuple)):
                continue
            for elt in node.args[0].elts:
                if isinstance(elt, ast.Constant) and isinstance(elt.value, int) and not isinstance(elt.value, bool):
                    out.append(Violation("bare-seed-tag", _where(rel, node),
                                         f"seed tag {elt.value} is a bare number; name it in toolkit.Stream "
                                         f"and draw with toolkit.stream_rng"))
    return out


_RECEIVES = ("recv", "gather")
_OWN_ERRORS = ("ValueError", "PartyError", "RuntimeError", "TypeError")


def peer_checks(tree: Tree) -> list[Violation]:
    out = []
    for rel, mod in tree.files.items():
        if not rel.startswith(("protocols/", "algorithms/")):
            continue
        lines = tree.lines[rel]
        for fn in ast.walk(mod):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            received = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Call)
                        and isinstance(n.func, ast.Attribute) and n.func.attr in _RECEIVES]
            if not received:
                continue
            for r in ast.walk(fn):
                if not isinstance(r, ast.Raise) or r.exc is None or r.lineno < min(received):
                    continue
                e = r.exc.func if isinstance(r.exc, ast.Call) else r.exc
                name = e.id if isinstance(e, ast.Name) else e.attr if isinstance(e, ast.Attribute) else ""
                near = " ".join(lines[max(0, r.lineno - 2):r.lineno])
                if name in _OWN_ERRORS and "# own:" not in near:
                    out.append(Violation("peer-check", _where(rel, r),
                                         f"{fn.name} receives, then raises {name}: a check on a peer's message "
                                         "raises PeerFault (or PeersDisagree / ProtocolMismatch); a failure "
                                         "of the party's own says so with an '# own:' comment"))
    return out


RULES = {
    "toolkit-twin": toolkit_twins,
    "settings-dict": settings_as_dict,
    "crypto-parties": crypto_imports_parties,
    "runtime-algorithms": runtime_imports_algorithms,
    "ops-layer": ops_layer,
    "private-import": private_imports,
    "import-cycle": import_cycles,
    "party-untyped": untyped_parties,
    "bare-seed-tag": bare_seed_tags,
    "peer-check": peer_checks,
}


def check(root: Path) -> list[Violation]:
    tree = Tree(root)
    return [v for rule in RULES.values() for v in rule(tree)]
