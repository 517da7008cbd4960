"""The agent's own tests, standard library only, for any Python from 3.8 up.

Run by tests/test_agent_pythons.py under every interpreter the machine has,
against the single-file ``vq-admin-agent.pyz`` and against the tree::

    python3.8 -I tests/agent_selftest.py --agent PATH   # PATH: a .pyz or the tree root

``-I`` keeps the interpreter's own site-packages (and PYTHONPATH) out, so
only the standard library and the agent under test are importable.  Verbs
are exercised through the agent's command line in a fresh process, as the
driver runs them; ``sbatch`` and ``scontrol`` are PATH stand-ins written by
the test (the real Slurm runs are in tests/test_allocation_real.py).
"""

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

AGENT = ""


def agent_argv(*args):
    if AGENT.endswith(".pyz"):
        return [sys.executable, "-I", AGENT, *args]
    boot = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from vq_admin.agent.cli import main; sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-I", "-c", boot, AGENT, *args]


def run_agent(*args, env=None, stdin=b""):
    return subprocess.run(agent_argv(*args), input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=env, timeout=120)


def xxhash_importable():
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return False
    return True


class Imports(unittest.TestCase):
    def test_every_agent_module_imports(self):
        import pkgutil

        import vq_admin.agent as agent
        import vq_admin.core as core

        names = sorted(f"{package.__name__}.{m.name}" for package in (core, agent)
                       for m in pkgutil.iter_modules(package.__path__) if m.name != "__main__")
        self.assertIn("vq_admin.agent.settle", names)
        self.assertIn("vq_admin.core.securepath", names)
        for name in names:
            __import__(name)
        # nothing of the driver side came along
        loaded = [m for m in sys.modules if m.startswith("vq_admin.")
                  and not m.startswith(("vq_admin.agent", "vq_admin.core"))]
        self.assertEqual(loaded, [])
        for third_party in ("pluggy", "plumbum", "filelock", "vq_admin_hookspecs"):
            self.assertNotIn(third_party, sys.modules)


class Checksum(unittest.TestCase):
    def test_default_is_xxh3_when_importable_else_blake2b(self):
        from vq_admin.core import checksum

        want = checksum.XXH3 if xxhash_importable() else checksum.BLAKE2B
        self.assertEqual(checksum.default_algorithm(), want)
        h = checksum.new(checksum.BLAKE2B)
        h.update(b"abc")
        self.assertEqual(h.hexdigest(), hashlib.blake2b(b"abc", digest_size=8).hexdigest())
        with self.assertRaises(ValueError):
            checksum.new("md5")


class Verbs(unittest.TestCase):
    def test_version(self):
        done = run_agent("version")
        self.assertEqual(done.returncode, 0, done.stderr)
        got = json.loads(done.stdout)
        self.assertEqual(got["python_version"], ".".join(map(str, sys.version_info[:3])))
        self.assertEqual(got["checksum"], "xxh3_64" if xxhash_importable() else "blake2b")

    def test_identity(self):
        done = run_agent("identity", "--json")
        self.assertEqual(done.returncode, 0, done.stderr)
        got = json.loads(done.stdout)
        self.assertEqual(got["record"], "missing")
        if AGENT.endswith(".pyz"):
            with open(AGENT, "rb") as fh:
                self.assertEqual(got["tree_sha256"], hashlib.sha256(fh.read()).hexdigest())
            self.assertEqual(got["scope"], "zipapp")
        else:
            self.assertEqual(got["scope"], "package")

    def test_hash_file_and_install_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            dest = os.path.join(tmp, "bin", "tool")
            os.mkdir(os.path.dirname(dest), 0o755)
            done = run_agent("install-file", "--dest", dest, "--mode", "0755", stdin=b"#!/bin/sh\necho hi\n")
            self.assertEqual(done.returncode, 0, done.stderr)
            with open(dest, "rb") as fh:
                self.assertEqual(fh.read(), b"#!/bin/sh\necho hi\n")
            done = run_agent("hash-file", dest)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertEqual(json.loads(done.stdout)["sha256"], hashlib.sha256(b"#!/bin/sh\necho hi\n").hexdigest())
            self.assertEqual(run_agent("hash-file", os.path.join(tmp, "nothing")).returncode, 1)

    def test_usage_error_is_2(self):
        self.assertEqual(run_agent("no-such-verb").returncode, 2)

    def test_census_reads_a_script_once(self):
        with tempfile.TemporaryDirectory() as tmp:
            bindir = os.path.join(tmp, "bin")
            os.mkdir(bindir)
            for name, text in (("squeue", CENSUS_SQUEUE), ("scontrol", CENSUS_SCONTROL)):
                with open(os.path.join(bindir, name), "w") as fh:
                    fh.write(text)
                os.chmod(os.path.join(bindir, name), 0o755)
            env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
                       XDG_STATE_HOME=os.path.join(tmp, "state"))
            for read, cached in ((1, 0), (0, 1)):
                done = run_agent("census", env=env)
                self.assertEqual(done.returncode, 0, done.stderr)
                got = json.loads(done.stdout)
                self.assertEqual((got["cost"]["scripts_read"], got["cost"]["scripts_cached"]), (read, cached))
                self.assertEqual(got["groups"], [{"words": ["/apps/v/releases/" + "a" * 40 + "/bin/python"],
                                                  "jobs": [{"id": "7", "display": "7", "state": "PENDING",
                                                            "user": "u"}]}])


class FastPaths(unittest.TestCase):
    """The session answers through the console entry (vq_admin.agent.entry.run, the tree) or the verb
    table (the .pyz)."""

    def test_session_answers_and_releases(self):
        with tempfile.TemporaryDirectory() as tmp:
            state = os.path.join(tmp, "state")  # the lease lives in the agent's state directory
            os.mkdir(state, 0o700)
            launcher = os.path.join(tmp, "python")
            with open(launcher, "wb") as fh:
                fh.write(b"#!/bin/sh\n")
            request = {"protocol": 1,
                       "lease": {"lane": "runtime", "host": "h", "program": "p", "holder": {"run_id": "r"}},
                       "shell_probe": {"argv": True, "expected": "a|b c|"},
                       "verify": {"argv": ["echo", json.dumps({"active_path": launcher})], "timeout": 60}}
            if AGENT.endswith(".pyz"):
                argv = agent_argv("session", "--probe", "a", "b c")
            else:
                boot = "import sys; sys.path.insert(0, sys.argv.pop(1)); from vq_admin.agent.entry import run; run()"
                argv = [sys.executable, "-I", "-c", boot, AGENT, "session", "--probe", "a", "b c"]
            done = subprocess.run(argv, input=json.dumps(request).encode() + b"\n", stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=120, env=dict(os.environ, XDG_STATE_HOME=state))
            self.assertEqual(done.returncode, 0, done.stderr)
            first, rest = [json.loads(line) for line in done.stdout.splitlines()]  # lease first, then the rest
            self.assertEqual(first["protocol"], 1)
            self.assertTrue(first["shell"]["posix"] and first["lease"]["held"])
            self.assertEqual(rest["verify"]["readback"]["sha256"], hashlib.sha256(b"#!/bin/sh\n").hexdigest())
            locks = os.path.join(state, "vq-admin-agent", "locks")
            self.assertEqual([n for n in os.listdir(locks) if n.endswith(".holder")], [])  # released


class Settle(unittest.TestCase):
    def test_settles_on_three_identical_observations(self):
        from vq_admin.agent import settle

        with tempfile.TemporaryDirectory() as tmp:
            for name, data in (("stdout", b"out\n"), ("stderr", b"")):
                with open(os.path.join(tmp, name), "wb") as fh:
                    fh.write(data)
            now = [0.0]
            fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
            self.addCleanup(os.close, fd)
            result = settle.settle(settle.DirectoryObserver(fd, algorithm="blake2b"),
                                   clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
            self.assertTrue(result.settled)
            self.assertEqual(result.observations, 3)
            self.assertEqual(result.to_dict()["checksum"], "blake2b")
            self.assertEqual(result.last[0].digest, hashlib.blake2b(b"out\n", digest_size=8).hexdigest())

    def test_empty_and_missing(self):
        from vq_admin.agent import settle

        with tempfile.TemporaryDirectory() as tmp:
            now = [0.0]
            kw = dict(clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
            fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
            self.addCleanup(os.close, fd)
            self.assertEqual(settle.settle(settle.DirectoryObserver(fd), **kw).reason, "unavailable")
            for name in ("stdout", "stderr"):
                open(os.path.join(tmp, name), "wb").close()
            self.assertEqual(settle.settle(settle.DirectoryObserver(fd), **kw).reason, "empty")


class Frames(unittest.TestCase):
    def test_round_trip(self):
        from vq_admin.core.frames import FrameWriter, read_frames

        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "stdout"), "wb") as fh:
                fh.write(b"x" * 5000)
            r, w = os.pipe()
            writer = FrameWriter(w)
            writer.record("summary", {"a": 1})
            dfd = os.open(tmp, os.O_RDONLY)
            try:
                sent = writer.stream_file("out", dfd, "stdout", None, "blake2b")
            finally:
                os.close(dfd)
            writer.record("end", {"sent": {"stdout": sent}})
            os.close(w)
            records, data = {}, []
            with os.fdopen(r, "rb") as stream:
                ended = read_frames(stream, records.__setitem__, lambda name, chunk: data.append(chunk))
            self.assertTrue(ended)
            self.assertEqual(b"".join(data), b"x" * 5000)
            self.assertEqual(sent["checksum"], "blake2b")
            self.assertEqual(sent["digest"], hashlib.blake2b(b"x" * 5000, digest_size=8).hexdigest())


class SecurePath(unittest.TestCase):
    def test_other_writable_directory_is_refused_and_sticky_is_not(self):
        from vq_admin.core import securepath

        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o700)
            bad = os.path.join(tmp, "bad")
            os.mkdir(bad)
            os.chmod(bad, 0o777)
            problem = securepath.path_problem(os.path.join(bad, "x"), what="test path", missing_ok=True)
            self.assertIsNotNone(problem)
            self.assertIn("other-writable", problem)
            os.chmod(bad, 0o1777)
            self.assertIsNone(securepath.path_problem(os.path.join(bad, "x"), what="test path", missing_ok=True))


FAKE_SBATCH = """#!{python}
# stand-in for sbatch --parsable --wait: run the job script at once, its stdout/stderr to --output/--error
# (/dev/null: the job opens its own transcripts in its attempt directory)
import subprocess, sys
args = sys.argv[1:]
out = [a.split("=", 1)[1] for a in args if a.startswith("--output=")][0]
err = [a.split("=", 1)[1] for a in args if a.startswith("--error=")][0]
first = [i for i, a in enumerate(args) if not a.startswith("-")][0]
script, job_args = args[first], args[first + 1:]
print("4242", flush=True)
with open(out, "wb") as o, open(err, "wb") as e:
    code = subprocess.call([sys.executable, "-I", script, *job_args], stdout=o, stderr=e)
sys.exit(code)
"""
FAKE_SCONTROL = """#!/bin/sh
echo "slurm_load_jobs error: Invalid job id specified" >&2
exit 1
"""
FAKE_SQUEUE = """#!/bin/sh
echo "RUNNING|None"
"""


#: squeue and scontrol as the census runs them: one pending batch job whose stored script names a launcher.
CENSUS_SQUEUE = """#!/bin/sh
for word; do last=$word; done
t=${last%%,*}; t=${t#JobID:0}
printf '7%s7%sPENDING%su%s2026-11-30T10:00:00%s1%sc1%s/home/u/job.sh%s/home/u%s/o%s/e%s/dev/null%s\\n' \\
  "$t" "$t" "$t" "$t" "$t" "$t" "$t" "$t" "$t" "$t" "$t" "$t"
"""
CENSUS_SCONTROL = """#!/bin/sh
printf '#!/bin/sh\\n/apps/v/releases/%s/bin/python run.py\\n' aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
"""


class AllocRun(unittest.TestCase):
    def test_alloc_run_streams_the_transcript_with_the_checksum_it_names(self):
        from vq_admin.core.frames import read_frames

        with tempfile.TemporaryDirectory() as tmp:
            bindir = os.path.join(tmp, "bin")
            os.mkdir(bindir)
            for name, text in (("sbatch", FAKE_SBATCH.format(python=sys.executable)), ("scontrol", FAKE_SCONTROL),
                               ("squeue", FAKE_SQUEUE)):
                with open(os.path.join(bindir, name), "w") as fh:
                    fh.write(text)
                os.chmod(os.path.join(bindir, name), 0o755)
            root = os.path.join(tmp, "scratch")
            os.mkdir(root, 0o755)
            env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"))
            job = [sys.executable, "-c", "import sys, time; print('built ok', flush=True); time.sleep(1.5); "
                   "sys.stderr.write('warn\\n'); sys.exit(3)"]
            done = subprocess.run(agent_argv("alloc-run", "--root", root, "--program", "prog", "--timeout", "60",
                                             "--progress", "1", "--", *job), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env, timeout=120)
            self.assertEqual(done.returncode, 0, done.stderr)
            records, data, progress = {}, {"stdout": b"", "stderr": b""}, []

            def on_data(name, chunk):
                data[name] += chunk

            def on_record(kind, value):
                records[kind] = value
                if kind == "progress":
                    progress.append(value)

            self.assertTrue(read_frames(io.BytesIO(done.stdout), on_record, on_data))
            waits = [p for p in progress if p["phase"] == "wait"]
            self.assertTrue(waits, progress)
            self.assertEqual((waits[0]["job_id"], waits[0]["state"]), ("4242", "RUNNING"))
            settles = [p["observation"] for p in progress if p["phase"] == "settle"]
            self.assertEqual(settles, [1, 2, 3])
            summary = records["summary"]
            self.assertEqual(summary["job_id"], "4242")
            self.assertEqual(summary["exit_code"], 3)
            self.assertTrue(summary["settle"]["settled"], summary["settle"])
            algorithm = "xxh3_64" if xxhash_importable() else "blake2b"
            self.assertEqual(summary["settle"]["checksum"], algorithm)
            self.assertEqual(data, {"stdout": b"built ok\n", "stderr": b"warn\n"})
            sent = records["end"]["sent"]["stdout"]
            self.assertEqual(sent["checksum"], algorithm)
            if algorithm == "blake2b":
                self.assertEqual(sent["digest"], hashlib.blake2b(b"built ok\n", digest_size=8).hexdigest())
            self.assertEqual(sent["settled_digest"], sent["digest"])


def main(argv=None):
    global AGENT
    parser = argparse.ArgumentParser()
    parser.add_argument("--agent", required=True, help="vq-admin-agent.pyz, or the tree root holding vq_admin/")
    args, rest = parser.parse_known_args(argv)
    AGENT = os.path.abspath(args.agent)
    sys.path.insert(0, AGENT)
    sys.dont_write_bytecode = True
    program = unittest.main(module=__name__, argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
