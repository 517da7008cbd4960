"""The one driver <-> agent protocol (:mod:`vq_admin.core.protocol`).

(a) No driver module spells an agent verb or flag: an AST scan of
``vq_admin/`` (outside ``vq_admin/agent/``) fails on a string literal equal to
one in an argv context.  (b) Every verb round-trips: the protocol's builder
makes the argv, the real agent (``python -m vq_admin.agent``, in a temporary
directory) runs it, and the protocol's parser reads its answer.  The verbs
tested are the agent's argparse tree, so a new verb without a round trip
fails here.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

import agent_selftest
from support import GitRepo, git
from vq_admin.core import exits, protocol
from vq_admin.core.frames import FrameError, read_frames
from vq_admin.agent.allocation import new_attempt_name
from vq_admin.agent.cli import build_parser
from vq_admin.core.treeid import archive_identity

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "vq_admin"
AGENT = [sys.executable, "-m", "vq_admin.agent"]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def agent_options() -> set[str]:
    return {opt for sub in subcommands(build_parser()).values() for action in sub._actions
            for opt in action.option_strings if opt.startswith("--") and opt != "--help"}


# -- one table on both sides ---------------------------------------------------------------------

def test_the_agent_verb_table_is_the_protocol_verb_table():
    assert set(subcommands(build_parser())) == set(protocol.VERBS)
    assert len(set(protocol.VERBS)) == len(protocol.VERBS)
    assert set(protocol.FRAMED_VERBS) <= set(protocol.VERBS)
    assert set(protocol.PARSERS) == set(protocol.VERBS) - set(protocol.FRAMED_VERBS)


def test_the_shapes_say_what_the_answers_typed_dicts_say():
    """:data:`protocol.SHAPES` (checked at run time) and each answer's ``TypedDict`` (annotations only: the
    agent's start never imports ``typing``) both name a checked member and its type: they must agree."""
    tree = ast.parse(Path(protocol.__file__).read_text())
    members = {node.name: {item.target.id: ast.unparse(item.annotation) for item in node.body
                           if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
               for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef) and [ast.unparse(b) for b in node.bases] == ["TypedDict"]}
    answers: dict[str, str] = {}  # each parser's answer type, by the parser's name
    parsers: dict[str, str] = {}  # each verb's parser's name
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("parse_"):
            answers[node.name] = ast.unparse(node.returns)
        elif isinstance(node, ast.AnnAssign) and node.target.id.startswith("parse_"):
            answers[node.target.id] = ast.unparse(node.annotation.slice.elts[-1])
        elif isinstance(node, ast.AnnAssign) and node.target.id == "PARSERS":
            parsers = {getattr(protocol, k.id): v.id for k, v in zip(node.value.keys, node.value.values, strict=True)}
    runtime = {"str": str, "bool": bool, "int": int, "float": float, "List": list, "Dict": dict,
               **dict.fromkeys(members, dict)}
    assert set(parsers) == set(protocol.PARSERS) and set(protocol.SHAPES) <= set(parsers)
    for verb, shape in protocol.SHAPES.items():
        declared = members[answers[parsers[verb]]]
        for key, kind, _required in shape:
            assert key in declared, (verb, key)
            optional = declared[key].startswith("Optional[")
            annotation = declared[key][len("Optional["):-1] if optional else declared[key]
            assert runtime[annotation.split("[")[0]] is kind, (verb, key, declared[key], kind)


def test_every_agent_option_is_a_protocol_flag():
    assert agent_options() == set(protocol.FLAGS)


def test_the_exit_statuses_are_the_agent_s():
    from vq_admin.agent import cli, lease

    assert (cli.EXIT_FAILED, cli.EXIT_USAGE, cli.EXIT_MISMATCH, cli.EXIT_UNSAFE, cli.EXIT_HELD) == (
        exits.EXIT_FAILED, exits.EXIT_USAGE, exits.EXIT_MISMATCH, exits.EXIT_UNSAFE, exits.EXIT_HELD)
    assert lease.EXIT_HELD == exits.EXIT_HELD


def test_the_fast_verbs_of_the_console_entry_are_the_protocol_s():
    """agent/entry.py dispatches verify-readback, session and stage-receive before the verb table is imported, by the
    protocol's names (``argv[:1] == [NAME]``), never by a literal (the scan below also fails on one)."""
    from vq_admin.agent import entry

    tree = ast.parse((PACKAGE / "agent" / "entry.py").read_text())
    words = [node.comparators[0].elts[0] for node in ast.walk(tree)
             if isinstance(node, ast.Compare) and isinstance(node.comparators[0], ast.List)
             and node.comparators[0].elts]
    assert words and all(isinstance(word, ast.Name) for word in words), [ast.dump(w) for w in words]
    assert {getattr(entry, word.id) for word in words if isinstance(word, ast.Name)} == {
        protocol.VERIFY_READBACK, protocol.SESSION, protocol.STAGE_RECEIVE}
    assert entry.SESSION is protocol.SESSION and entry.VERIFY_READBACK is protocol.VERIFY_READBACK
    assert entry.STAGE_RECEIVE is protocol.STAGE_RECEIVE and entry.STAGE is protocol.STAGE


# -- (a) no driver module spells a verb or a flag ---------------------------------------------------

#: Where a literal equal to a verb is a name of something else: a JSON member of an answer or
#: request ({"lease": ...}, answer["identity"], "version" in answer, answer.get("lease"), a tuple of
#: member names such as a receipt's sections), a plan step's label (plan.add("stage-create", ...),
#: plan.get("stage-create")) or the driver's own argparse (action="version"); never an argv word.
LABEL_METHODS = {"get", "add", "pop"}
ARGPARSE_METHODS = {"add_argument", "add_parser"}


def _label_context(node: ast.AST, parent: ast.AST, statement: ast.AST) -> bool:
    if isinstance(parent, (ast.Tuple, ast.List)) and not _mentions_agent(statement) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) and not e.value.startswith("-")
            for e in parent.elts):
        return True  # a list of member names
    if isinstance(parent, ast.keyword):
        call = next((n for n in ast.walk(statement) if isinstance(n, ast.Call) and parent in n.keywords), None)
        return (call is not None and isinstance(call.func, ast.Attribute)
                and call.func.attr in ARGPARSE_METHODS)
    if isinstance(parent, ast.Dict) and node in parent.keys:
        return True
    if isinstance(parent, ast.Subscript) and node is parent.slice:
        return True
    if isinstance(parent, ast.Compare):
        return True
    return (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute)
            and parent.func.attr in LABEL_METHODS and parent.args[:1] == [node])


def _member_context(node: ast.AST, parent: ast.AST) -> bool:
    """On the agent's fast paths only a JSON member is a label: ``{"lease": ...}``, ``answer["lease"]``,
    ``request.get("lease")`` (a list, a comparison or an argument is a verb word there)."""
    if isinstance(parent, ast.Dict) and node in parent.keys:
        return True
    if isinstance(parent, ast.Subscript) and node is parent.slice:
        return True
    return (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute)
            and parent.func.attr in LABEL_METHODS and parent.args[:1] == [node])


def _mentions_agent(statement: ast.AST) -> bool:
    """The statement handles the agent's words (``host.agent``, ``agent``, ``update.agent(...)``)."""
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and node.id == "agent":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "agent":
            return True
    return False


#: The agent's fast paths, served before its verb table (agent/entry.py): they too take every verb and
#: option from the protocol, so a literal verb outside a label context, or any literal option, is found.
AGENT_FAST_PATHS = {("agent", "entry.py"), ("agent", "session.py"), ("agent", "verify_readback.py"),
                    ("agent", "lease.py")}


def driver_spellings(root: Path) -> list[str]:
    verbs, flags = set(protocol.VERBS), set(protocol.FLAGS)
    from vq_admin.cli import build_parser as driver_parser

    def options(parser: argparse.ArgumentParser) -> set[str]:
        found = {o for a in parser._actions for o in a.option_strings}
        for sub in subcommands(parser).values():
            found |= options(sub)
        return found

    shared = flags & options(driver_parser())  # also the driver's own options (--json, --host, ...)
    problems = []
    for path in sorted(root.rglob("*.py")):
        fast = path.relative_to(root).parts in AGENT_FAST_PATHS
        if (path.relative_to(root).parts[0] == "agent" and not fast) or path.relative_to(root).parts == (
                "core", "protocol.py"):
            continue  # the agent's own modules, and the protocol's one home
        tree = ast.parse(path.read_text(), str(path))
        parents: dict[ast.AST, ast.AST] = {}
        statements: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if node.value not in verbs and node.value not in flags:
                continue
            parent = parents.get(node)
            if parent is None or isinstance(parent, ast.JoinedStr):
                continue
            statement: ast.AST = node
            while not isinstance(statement, ast.stmt) and statement in parents:
                statement = parents[statement]
            statements[node] = statement
            where = f"{path.relative_to(root.parent)}:{node.lineno}: {node.value!r}"
            if node.value in verbs:
                if not (_member_context(node, parent) if fast else _label_context(node, parent, statement)):
                    problems.append(where)
            elif fast:
                problems.append(where)  # the agent's own option, spelled on its fast path
            elif node.value not in shared and not (node.value == protocol.PROGRAM and not _mentions_agent(statement)):
                problems.append(where)  # an option only the agent has
            elif _mentions_agent(statement):
                problems.append(where)  # a shared option next to the agent's words: an agent argv
            elif isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) \
                    and parent.func.attr == "index":
                problems.append(where)  # reading an agent argv back by its flags
    return problems


def test_no_driver_module_spells_an_agent_verb_or_flag():
    problems = driver_spellings(PACKAGE)
    assert not problems, "build agent argv with vq_admin.core.protocol:\n" + "\n".join(problems)


def test_the_scan_finds_a_spelled_verb_and_flag(tmp_path):
    """The scan is not vacuous: the patterns the call sites used before are found."""
    bad = tmp_path / "vq_admin"
    (bad / "agent").mkdir(parents=True)
    (bad / "lanes").mkdir()
    (bad / "agent" / "cli.py").write_text('VERB = "hash-file"\n')  # the agent's side may spell them
    (bad / "lanes" / "x.py").write_text(
        'def f(host, dest, argv, plan):\n'
        '    a = [*host.agent, "hash-file", dest]\n'
        '    b = host.agent + ["version", "--sinfo"]\n'
        '    c = [*host.agent, "install-file", "--dest", dest]\n'
        '    d = argv[argv.index("--lane") + 1]\n'
        '    e = ["x", "--archive-sha256", "y"]\n'
        '    plan.add("stage-create", "where", [])\n'
        '    g = reconcile(update, verb="detach-reconcile")\n'
        '    parser.add_argument("--version", action="version")\n'
        '    SECTIONS = ("stage", "lease", "activation")\n'
        '    return {"lease": 1}, ["vq", "admin", "--json"]\n')
    (bad / "agent" / "entry.py").write_text(  # the agent's fast paths: verbs and options from the protocol
        'def main(argv):\n'
        '    if argv[:1] == ["session"]:\n'
        '        return session(argv[1:], answer.get("lease"))\n')
    (bad / "agent" / "session.py").write_text('def main(argv):\n    return argv[:1] == ["--probe"]\n')
    found = [line.split(": ", 1)[1] for line in driver_spellings(bad)]
    assert sorted(found) == sorted(["'hash-file'", "'version'", "'--sinfo'", "'install-file'", "'--dest'",
                                    "'--lane'", "'--archive-sha256'", "'detach-reconcile'", "'session'",
                                    "'--probe'"])


# -- (b) every verb round-trips through the real agent ----------------------------------------------

def run(argv: list[str], tmp: Path, stdin: bytes = b"", env: dict[str, str] | None = None,
        ok: tuple[int, ...] = (0,)) -> bytes:
    assert argv[:len(AGENT)] == AGENT
    build_parser().parse_args(argv[len(AGENT):])  # the agent's own parser takes the built argv
    done = subprocess.run(argv, input=stdin, capture_output=True, cwd=tmp, timeout=300,
                          env=dict(os.environ, **(env or {}), PYTHONPATH=str(REPO)))
    assert done.returncode in ok, (argv, done.returncode, done.stderr)
    return done.stdout


class World:
    """One temporary directory with a git archive, a scratch root and a file to hash."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        repo = GitRepo(tmp / "src")
        self.sha = repo.commit("one", {"a.txt": "a\n", "build.sh": "#!/bin/sh\n"})
        self.archive = str(tmp / "source.tar")
        git(repo.path, "archive", "--format=tar", "-o", self.archive, self.sha)
        self.ident = archive_identity(self.archive)
        self.scratch = tmp / "scratch"
        self.scratch.mkdir(mode=0o755)
        self.file = tmp / "launcher"
        self.file.write_bytes(b"#!/bin/sh\nexit 0\n")
        self.file.chmod(0o755)
        self.bin = tmp / "bin"
        self.bin.mkdir()
        for name, text in (("sbatch", agent_selftest.FAKE_SBATCH.format(python=sys.executable)),
                           ("scontrol", agent_selftest.FAKE_SCONTROL), ("squeue", agent_selftest.FAKE_SQUEUE)):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)

    @property
    def words(self) -> dict[str, str]:
        return {"sha": self.sha, "archive_sha256": self.ident.archive_sha256,
                "tree_sha256": self.ident.tree_sha256, "git_tree": self.ident.git_tree}

    @property
    def archive_sha256(self) -> str:
        return hashlib.sha256(Path(self.archive).read_bytes()).hexdigest()

    @property
    def slurm_env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def stage(self) -> str:
        created = protocol.parse_stage_create(run(protocol.stage_create(
            AGENT, root=str(self.scratch), kind="runtime", name="prog", **self.words), self.tmp))
        protocol.parse_stage_receive(run(protocol.stage_receive(AGENT, stage=created["stage"]), self.tmp,
                                         stdin=Path(self.archive).read_bytes()))
        return created["stage"]


def holder() -> dict[str, Any]:
    return {"driver_host": "driver", "user": "me", "pid": os.getpid(), "since": "2026-01-01T00:00:00Z",
            "run_id": "r1"}


def rt_hash_file(w: World) -> None:
    answer = protocol.parse_hash_file(run(protocol.hash_file(AGENT, str(w.file)), w.tmp))
    assert answer["path"] == str(w.file) and answer["exists"]
    assert answer["sha256"] == hashlib.sha256(w.file.read_bytes()).hexdigest()
    missing = protocol.parse_hash_file(run(protocol.hash_file(AGENT, str(w.tmp / "none")), w.tmp, ok=(1,)))
    assert not missing["exists"] and "sha256" not in missing and missing["error"]


def rt_check_paths(w: World) -> None:
    answer = protocol.parse_check_paths(run(protocol.check_paths(AGENT, ["/bin/sh", str(w.file)]), w.tmp))
    assert answer["refused"] == [] and len(answer["checked"]) == 2


def rt_verify_readback(w: World) -> None:
    receipt = json.dumps({"active_path": str(w.file)})
    answer = protocol.parse_verify_readback(run(protocol.verify_readback(
        AGENT, [sys.executable, "-c", f"print({receipt!r})"]), w.tmp))
    assert answer["verify"]["exit_code"] == 0
    assert json.loads(protocol.verify_output(answer)) == {"active_path": str(w.file)}
    readback = answer.get("readback")
    assert readback is not None and readback["sha256"] == hashlib.sha256(w.file.read_bytes()).hexdigest()


def rt_stage_create(w: World) -> None:
    stage = w.stage()
    assert stage.startswith(str(w.scratch)) and os.path.isdir(stage)


def rt_stage_receive(w: World) -> None:
    stage = w.stage()
    assert os.path.getsize(os.path.join(stage, "source.tar")) == os.path.getsize(w.archive)


def rt_stage_verify(w: World) -> None:
    stage = w.stage()
    verdict = protocol.parse_stage_verify(run(protocol.stage_verify(AGENT, stage=stage, **w.words), w.tmp))
    assert verdict["verified"] and verdict["stage"] == stage and verdict["mismatches"] == []
    wrong = dict(w.words, git_tree="0" * 40)
    verdict = protocol.parse_stage_verify(run(protocol.stage_verify(AGENT, stage=stage, **wrong), w.tmp,
                                              ok=(exits.EXIT_MISMATCH,)))
    assert not verdict["verified"] and verdict["mismatches"]


def rt_stage_reclaim(w: World) -> None:
    stage = w.stage()
    answer = protocol.parse_stage_reclaim(run(protocol.stage_reclaim(
        AGENT, root=str(w.scratch), kind="runtime", name="prog", stage=stage, outcome=protocol.OUTCOME_SUCCESS),
        w.tmp))
    assert answer["removed"] == [os.path.basename(stage)] and not os.path.exists(stage)


def rt_identity(w: World) -> None:
    answer = protocol.parse_identity(run(protocol.identity(AGENT), w.tmp))
    from vq_admin import __version__

    assert answer["version"] == __version__ and answer["tree_sha256"]


def rt_version(w: World) -> None:
    answer = protocol.parse_version(run(protocol.version(AGENT), w.tmp))
    from vq_admin import __version__

    assert answer["version"] == __version__ and "sinfo" not in answer
    assert set(answer) == {"version", "python_version", "interpreter", "checksum"}
    build_parser().parse_args(protocol.version(AGENT, sinfo=True)[len(AGENT):])


def rt_install_file(w: World) -> None:
    dest = w.tmp / "installed"
    body = b"#!/bin/sh\necho installed\n"
    answer = protocol.parse_install_file(run(protocol.install_file(AGENT, dest=str(dest), mode="0750"), w.tmp,
                                             stdin=body))
    assert answer["dest"] == str(dest) and answer["changed"]
    assert answer["new_sha256"] == hashlib.sha256(body).hexdigest()
    assert dest.read_bytes() == body and dest.stat().st_mode & 0o777 == 0o750


class Framed:
    """A framed verb's whole captured stream: the JSON records by kind, the transcripts' bytes, and
    ``complete`` when the stream ended with its ``end`` record."""

    def __init__(self, stdout: bytes) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.transcripts = {"stdout": b"", "stderr": b""}
        self.complete = read_frames(io.BytesIO(stdout), self.records.__setitem__, self._data)
        self.summary = self.records.get("summary") or {}

    def _data(self, name: str, chunk: bytes) -> None:
        self.transcripts[name] += chunk


def _framed(w: World, argv: list[str]) -> Framed:
    return Framed(run(argv, w.tmp, env=w.slurm_env))


def _job(w: World, run_verb: str) -> tuple[str, Framed]:
    attempt = new_attempt_name()
    common: dict[str, Any] = dict(root=str(w.scratch), program="prog", attempt=attempt, timeout="120",
                                  archive=w.archive, archive_sha256=w.archive_sha256,
                                  env=[("VQ_RT", "yes")],
                                  command=[sys.executable, "-c", "import os; print('built', os.environ['VQ_RT'])"])
    if run_verb == protocol.ALLOC_RUN:
        argv = protocol.alloc_run(AGENT, sbatch_args=["--job-name=rt"], **common)
    else:
        argv = protocol.detach_run(AGENT, **common)
    answer = _framed(w, argv)
    assert answer.complete and answer.summary.get("exit_code") == 0, answer.records
    assert answer.transcripts["stdout"] == b"built yes\n"
    return attempt, answer


def rt_alloc_run(w: World) -> None:
    _job(w, protocol.ALLOC_RUN)


def rt_detach_run(w: World) -> None:
    _job(w, protocol.DETACH_RUN)


def _reconcile(w: World, run_verb: str, detached: bool) -> None:
    attempt, first = _job(w, run_verb)
    argv = protocol.reconcile(AGENT, detached=detached, root=str(w.scratch), program="prog", attempt=attempt,
                              timeout="5")
    verb = protocol.DETACH_RECONCILE if detached else protocol.ALLOC_RECONCILE
    assert argv[len(AGENT)] == verb
    again = _framed(w, argv)
    assert again.complete and again.summary.get("attempt") == attempt, again.records
    assert again.transcripts["stdout"] == first.transcripts["stdout"]
    if detached:  # the build's recorded exit status (a Slurm job's end needs the real scontrol)
        assert again.summary.get("exit_code") == 0, again.records


def rt_alloc_reconcile(w: World) -> None:
    _reconcile(w, protocol.ALLOC_RUN, detached=False)


def rt_detach_reconcile(w: World) -> None:
    _reconcile(w, protocol.DETACH_RUN, detached=True)


def _confirm(w: World) -> tuple[str, Framed]:
    """``confirm-run`` with a fake sbatch (which answers job 4242 and runs the job at once) and a fake scontrol
    (which knows no job): the supervisor's verdict arrives, failed for want of Slurm's own end state."""
    attempt = new_attempt_name()
    argv = protocol.confirm_run(AGENT, root=str(w.scratch), program="prog", attempt=attempt, timeout="60",
                                sbatch_args=["--time=5"], metrics=["steps=lower:0.1"], baseline=[("steps", "2")],
                                accept_regression=False, revert=[],
                                command=[sys.executable, "-c", "print('VQ-DEPLOY-METRIC steps=2')"])
    answer = _framed(w, argv)
    verdict = answer.summary.get("confirm")
    assert answer.complete and verdict["job_id"] == "4242" and verdict["metrics"] == {"steps": "2"}, answer.records
    assert verdict["passed"] is False and verdict["revert"] is None and verdict["regressed"] == [], verdict
    assert answer.transcripts["stdout"] == b"VQ-DEPLOY-METRIC steps=2\n"
    return attempt, answer


def rt_confirm_run(w: World) -> None:
    _confirm(w)


def rt_confirm_reconcile(w: World) -> None:
    attempt, first = _confirm(w)
    argv = protocol.confirm_reconcile(AGENT, root=str(w.scratch), program="prog", attempt=attempt, timeout="5")
    again = _framed(w, argv)
    assert again.complete and again.summary["confirm"] == first.summary["confirm"], again.records


def rt_lease(w: World) -> None:
    h = holder()
    argv = protocol.lease(AGENT, lane="runtime", host="login1", program="prog", **h)
    answer = protocol.parse_lease(run(argv, w.tmp))  # stdin closed at once: the lease ends with it
    assert answer["held"] and answer["lock"].startswith(os.environ["XDG_STATE_HOME"])
    assert answer["holder"]["run_id"] == h["run_id"]


def rt_session(w: World) -> None:
    request = {"protocol": protocol.SESSION_PROTOCOL,
               "lease": {"lane": "runtime", "host": "login1", "program": "prog", "holder": holder()},
               "check_paths": ["/bin/sh"]}
    answer = protocol.parse_session(run(protocol.session(AGENT), w.tmp, stdin=protocol.encode_request(request)))
    assert answer["lease"]["held"] and answer["lease"]["lock"]
    assert answer["check_paths"]["refused"] == []
    probe = protocol.session(AGENT) + protocol.session_probe(["a", "b"])
    assert build_parser().parse_args(probe[len(AGENT):]).probe == ["a", "b"]


def rt_census(w: World) -> None:
    bindir = w.tmp / "census-bin"
    bindir.mkdir()
    for name, text in (("squeue", agent_selftest.CENSUS_SQUEUE), ("scontrol", agent_selftest.CENSUS_SCONTROL)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"}
    for read, cached in ((1, 0), (0, 1)):
        answer = protocol.parse_census(run(protocol.census(AGENT), w.tmp, env=env))
        assert answer["complete"] and answer["error"] is None
        assert (answer["cost"]["scripts_read"], answer["cost"]["scripts_cached"]) == (read, cached)
        assert answer["groups"] == [{"words": [f"/apps/v/releases/{'a' * 40}/bin/python"], "jobs": [
            {"id": "7", "display": "7", "state": "PENDING", "user": "u"}]}]
    (bindir / "squeue").write_text("#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller' >&2\nexit 1\n")
    failed = protocol.parse_census(run(protocol.census(AGENT), w.tmp, env=env, ok=(exits.EXIT_FAILED,)))
    assert not failed["complete"] and failed["error"] and "Unable to contact" in failed["error"]


def rt_record(w: World) -> None:
    from vq_admin.agent import record

    empty = protocol.parse_record(run(protocol.record(AGENT, {"toy": 0}), w.tmp))
    assert empty["records"] == {"toy": {"entries": [], "last": 0}}
    record.append("toy", b"{}", b"SIG")
    record.append("toy", b"[]", None)
    found = protocol.parse_record(run(protocol.record(AGENT, {"toy": 1, None: 0}), w.tmp))["records"]
    assert [(e["seq"], e["statement"], e["sig"]) for e in found["toy"]["entries"]] == [(2, "[]", None)]
    assert found[protocol.HELPER_RECORD]["entries"] == []


def rt_record_quarantine(w: World) -> None:
    from vq_admin.agent import record

    def statement(program: str, kind: str = protocol.QUARANTINE_PREDICATE) -> bytes:
        text = protocol.encode({"_type": "https://in-toto.io/Statement/v1", "subject": [], "predicateType": kind,
                                "predicate": {"program": program, "action": "quarantine", "sha": "a" * 40}})
        return protocol.encode_request({"append": {"statement": text, "sig": "SIG"}})

    record.append("toy", b"{}", None)
    argv = protocol.record_quarantine(AGENT, program="toy", record_after=1)
    answer = protocol.parse_record_quarantine(run(argv, w.tmp, stdin=statement("toy")))
    assert answer["appended"]["seq"] == 2 and "append_error" not in answer
    assert [(e["seq"], e["sig"]) for e in answer["record"]["entries"]] == [(2, "SIG")]
    for wrong in (statement("other"), statement("toy", "https://slsa.dev/verification_summary/v1"), b"{}\n"):
        refused = protocol.parse_record_quarantine(run(argv, w.tmp, stdin=wrong, ok=(exits.EXIT_FAILED,)))
        assert "appended" not in refused and "bad append request" in refused["append_error"]
    assert record.read_after("toy", 0)["last"] == 2  # nothing refused was appended


ROUND_TRIPS: dict[str, Callable[[World], None]] = {
    protocol.HASH_FILE: rt_hash_file, protocol.CHECK_PATHS: rt_check_paths,
    protocol.VERIFY_READBACK: rt_verify_readback, protocol.STAGE_CREATE: rt_stage_create,
    protocol.STAGE_RECEIVE: rt_stage_receive, protocol.STAGE_VERIFY: rt_stage_verify,
    protocol.STAGE_RECLAIM: rt_stage_reclaim, protocol.IDENTITY: rt_identity, protocol.VERSION: rt_version,
    protocol.INSTALL_FILE: rt_install_file, protocol.ALLOC_RUN: rt_alloc_run,
    protocol.ALLOC_RECONCILE: rt_alloc_reconcile, protocol.DETACH_RUN: rt_detach_run,
    protocol.DETACH_RECONCILE: rt_detach_reconcile, protocol.LEASE: rt_lease, protocol.SESSION: rt_session,
    protocol.RECORD: rt_record, protocol.RECORD_QUARANTINE: rt_record_quarantine,
    protocol.CENSUS: rt_census, protocol.CONFIRM_RUN: rt_confirm_run, protocol.CONFIRM_RECONCILE: rt_confirm_reconcile,
}


@pytest.mark.parametrize("verb", sorted(subcommands(build_parser())))
def test_every_verb_round_trips_through_the_real_agent(verb, tmp_path):
    assert verb in ROUND_TRIPS, f"agent verb {verb} has no round trip in this test"
    ROUND_TRIPS[verb](World(tmp_path))


# -- the parsers refuse what their verb does not answer ----------------------------------------------

@pytest.mark.parametrize("verb", sorted(protocol.PARSERS))
@pytest.mark.parametrize("stdout", [b"", b"not json", b"[1, 2]", b"\xff\xfe"])
def test_a_malformed_answer_is_one_protocol_error_naming_the_verb(verb, stdout):
    with pytest.raises(protocol.ProtocolError) as caught:
        protocol.PARSERS[verb](stdout)
    assert caught.value.verb == verb and f"the agent's {verb} answer" in str(caught.value)


@pytest.mark.parametrize("verb, answer, member", [
    (protocol.HASH_FILE, {"path": "/x", "sha256": 5}, "sha256"),
    (protocol.STAGE_RECEIVE, {"stage": "/x", "bytes": True}, "bytes"),
    (protocol.STAGE_RECLAIM, {"removed": []}, "abandoned"),
    (protocol.IDENTITY, {"version": "1", "tree_sha256": ["x"]}, "tree_sha256"),
    (protocol.CENSUS, {"complete": True, "error": None}, "cost"),
    (protocol.RECORD_QUARANTINE, {"appended": "yes"}, "appended"),
    (protocol.SESSION, {"protocol": 1, "lease": {"held": "yes"}}, "held"),
    (protocol.VERIFY_READBACK, {"verify": {"exit_code": 0, "stdout": ""}, "readback_exit": "0"}, "readback_exit"),
])
def test_a_member_of_another_type_is_a_protocol_error_naming_it(verb, answer, member):
    with pytest.raises(protocol.ProtocolError, match=f"has no valid '{member}'"):
        protocol.PARSERS[verb](json.dumps(answer))


def test_a_null_optional_member_is_absent_and_the_rest_passes_as_the_agent_wrote_it():
    answer = {"path": "/x", "exists": False, "error": None, "regular": "whatever"}
    assert protocol.parse_hash_file(json.dumps(answer)) == answer


def test_a_malformed_framed_stream_is_a_frame_error():
    with pytest.raises(FrameError, match="unknown record 'bogus'"):
        read_frames(io.BytesIO(b"bogus record\n"), lambda kind, payload: None, lambda name, chunk: None)


def test_lacks_verb_reads_an_older_agent_s_usage_error():
    err = b"vq-admin-agent: error: argument verb: invalid choice: 'session' (choose from 'lease')\n"
    assert protocol.lacks_verb(protocol.SESSION, 2, b"", err)
    assert not protocol.lacks_verb(protocol.SESSION, 2, b"{}", err)
    assert not protocol.lacks_verb(protocol.SESSION, 1, b"", err)
    assert not protocol.lacks_verb(protocol.VERIFY_READBACK, 2, b"", err)


def test_the_protocol_module_is_cheap_and_standard_library_only():
    code = ("import sys\nb = set(sys.modules)\nimport vq_admin.core.protocol\n"
            "print(sorted(m for m in set(sys.modules) - b))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    loaded = set(ast.literal_eval(done.stdout.strip()))
    assert not {"typing", "dataclasses", "argparse"} & loaded, loaded
    assert {m for m in loaded if m.startswith("vq_admin")} == {"vq_admin", "vq_admin.core",
                                                              "vq_admin.core.protocol"}
