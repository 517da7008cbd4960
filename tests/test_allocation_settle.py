"""The settle rule for allocation transcripts, driven by a writer process the
test controls and an injected clock (no real sleeps).

Each ``sleep`` of the settle loop advances the fake clock and lets the
writer process perform the writes scheduled before the next observation,
so "what the filesystem shows at observation k" is exact.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vq_admin.agent import allocation, settle
from vq_admin.core.frames import FrameWriter, read_frames

WRITER = r"""
import os, sys
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "append":
        with open(args[0], "ab") as fh:
            fh.write(("%s\n" % args[1]).encode() * int(args[2]))
    elif cmd == "touch":
        open(args[0], "ab").close()
    elif cmd == "mkdir":
        os.mkdir(args[0])
    sys.stdout.write("ok\n")
    sys.stdout.flush()
"""


class Writer:
    """A separate process that writes transcript files only when told to."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def do(self, *command: str) -> None:
        self.proc.stdin.write(" ".join(command) + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "ok\n"

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def writer():
    w = Writer()
    yield w
    w.close()


class Script:
    """Fake clock + sleep; before observation k (1-based) runs ``steps[k]`` in the writer."""

    def __init__(self, writer: Writer, steps: dict[int, list[tuple[str, ...]]]):
        self.writer, self.steps = writer, steps
        self.now = 0.0
        self.observation = 1
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self.observation += 1
        for command in self.steps.get(self.observation, []):
            self.writer.do(*command)

    def kw(self) -> dict:
        return {"clock": self.clock, "sleep": self.sleep}


def observer(directory: Path) -> settle.DirectoryObserver:
    """The observer of *directory*, held open as the agent holds its attempt (closed at exit)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    OPEN.append(fd)
    return settle.DirectoryObserver(fd)


OPEN: list[int] = []


@pytest.fixture(autouse=True)
def _close_observed() -> object:
    yield
    while OPEN:
        os.close(OPEN.pop())


def run_settle(directory: Path, writer: Writer, steps: dict[int, list[tuple[str, ...]]]):
    script = Script(writer, steps)
    for command in steps.get(1, []):
        writer.do(*command)
    return settle.settle(observer(directory), **script.kw()), script


def paths(directory: Path) -> tuple[str, str]:
    return str(directory / "stdout"), str(directory / "stderr")


def test_output_complete_before_return_settles_after_exactly_three(tmp_path, writer):
    out, err = paths(tmp_path)
    result, script = run_settle(tmp_path, writer, {1: [("append", out, "built", "3"), ("append", err, "warn", "1")]})
    assert result.settled and result.reason is None
    assert result.observations == 3
    assert script.now == pytest.approx(2.0) and script.sleeps == [1.0, 1.0]
    assert result.last[0].size == len("built\n") * 3 and result.last[1].size == len("warn\n")


def test_output_growing_past_the_tenth_is_unstable(tmp_path, writer):
    out, err = paths(tmp_path)
    steps = {k: [("append", out, f"line{k}", "1")] for k in range(1, 12)}
    steps[1].append(("touch", err))
    result, script = run_settle(tmp_path, writer, steps)
    assert not result.settled and result.reason == "unstable"
    assert result.observations == 10
    assert script.now == pytest.approx(9.0)
    # what was read at the tenth observation: ten lines (the eleventh came later)
    assert result.last[0].size == sum(len(f"line{k}\n") for k in range(1, 11))


def test_files_appearing_at_the_fourth_observation_settle(tmp_path, writer):
    out, err = paths(tmp_path)
    result, _ = run_settle(tmp_path, writer, {4: [("append", out, "late", "2"), ("touch", err)]})
    assert result.settled
    assert result.observations == 6  # 4, 5 and 6 identical


def test_growth_that_stops_settles_three_after_the_last_change(tmp_path, writer):
    out, err = paths(tmp_path)
    steps = {1: [("append", out, "a", "1"), ("touch", err)], 2: [("append", out, "b", "1")],
             4: [("append", err, "c", "1")]}
    result, _ = run_settle(tmp_path, writer, steps)
    assert result.settled and result.observations == 6  # 4, 5 and 6 identical; 2 and 3 were not enough


def test_empty_files_are_empty(tmp_path, writer):
    out, err = paths(tmp_path)
    result, script = run_settle(tmp_path, writer, {1: [("touch", out), ("touch", err)]})
    assert not result.settled and result.reason == "empty"
    assert result.observations == 10 and script.now == pytest.approx(9.0)


def test_a_removed_directory_is_unavailable(tmp_path):
    """The attempt is observed through the directory held open: removed meanwhile, its files are missing."""
    gone = tmp_path / "attempt"
    gone.mkdir()
    observe = observer(gone)
    gone.rmdir()
    result = settle.settle(observe, **Script(None, {}).kw())
    assert not result.settled and result.reason == "unavailable"
    assert result.observations == 10
    assert all(state.error == "missing" for state in result.last)


def test_one_missing_file_is_unavailable_even_when_the_other_is_stable(tmp_path, writer):
    out, _err = paths(tmp_path)
    result, _ = run_settle(tmp_path, writer, {1: [("append", out, "x", "5")]})
    assert result.reason == "unavailable" and result.observations == 10


def test_unreadable_file_is_unavailable(tmp_path):
    (tmp_path / "stdout").write_text("x\n")
    (tmp_path / "stderr").mkdir()  # not a regular file
    script = Script(None, {})
    result = settle.settle(observer(tmp_path), **script.kw())
    assert result.reason == "unavailable" and result.last[1].error == "not a regular file"


def test_symlinked_transcript_is_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("not yours\n")
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    os.symlink(secret, attempt / "stdout")
    (attempt / "stderr").write_text("e\n")
    script = Script(None, {})
    result = settle.settle(observer(attempt), **script.kw())
    assert result.reason == "unavailable" and result.last[0].size is None


def test_checksums_are_streamed_xxh3_64(tmp_path):
    import xxhash

    data = os.urandom(3 * settle.CHUNK + 17)
    (tmp_path / "stdout").write_bytes(data)
    (tmp_path / "stderr").write_bytes(b"")
    state = observer(tmp_path)()[0]
    assert state.size == len(data) and state.digest == xxhash.xxh3_64(data).hexdigest()


def test_observations_start_one_interval_apart_even_when_slow():
    """Observation k starts at k seconds; a slow observation is not followed by a full extra second."""
    now = [0.0]
    starts = []

    def observe():
        starts.append(now[0])
        now[0] += 0.4  # hashing takes 0.4 s
        return (settle.FileState(1, "a"), settle.FileState(0, "b"))

    def sleep(seconds):
        now[0] += seconds

    result = settle.settle(observe, clock=lambda: now[0], sleep=sleep)
    assert result.settled and starts == [0.0, 1.0, 2.0]


# -- the deployment's exit status is preserved, settled or not -------------------------

FAKE_SBATCH = r"""#!{python}
import os, sys
args = sys.argv[1:]
attempt = os.path.dirname([a for a in args if not a.startswith("-")][0])  # the job writes its transcripts there
with open(os.environ["FAKE_SBATCH_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
print("4242", flush=True)
if os.environ.get("FAKE_WRITE") == "before":
    with open(os.path.join(attempt, "stdout"), "w") as fh:
        fh.write("VQ-DEPLOY-METRIC built=1\n")
    open(os.path.join(attempt, "stderr"), "w").close()
sys.exit(int(os.environ["FAKE_EXIT"]))
"""
FAKE_SCONTROL = "#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n"


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH.format(python=sys.executable)), ("scontrol", FAKE_SCONTROL),
                       ("sacct", "#!/bin/sh\nexit 1\n")):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SBATCH_LOG", str(tmp_path / "sbatch.log"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return scratch


def attempt_dir(scratch: Path) -> Path:
    found = list((scratch / ".vq-admin" / "runtime-deploy" / "prog").glob("deploy.*"))
    assert len(found) == 1
    return found[0]


SCENARIOS = {
    # name: (FAKE_WRITE, writer steps keyed by observation, expected reason, expected observations)
    "complete-before-return": ("before", {}, None, 3),
    "growing": ("", {k: [("append", "{d}/stdout", f"l{k}", "1"), ("touch", "{d}/stderr")] for k in range(1, 12)},
                "unstable", 10),
    "appears-at-fourth": ("", {4: [("append", "{d}/stdout", "late", "1"), ("touch", "{d}/stderr")]}, None, 6),
    "empty": ("", {1: [("touch", "{d}/stdout"), ("touch", "{d}/stderr")]}, "empty", 10),
    "missing": ("", {}, "unavailable", 10),
}


@pytest.mark.parametrize("exit_code", [0, 3])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_exit_status_is_preserved_in_every_settle_outcome(fake_slurm, writer, monkeypatch, tmp_path,
                                                          scenario, exit_code):
    write, steps, reason, observations = SCENARIOS[scenario]
    monkeypatch.setenv("FAKE_WRITE", write)
    monkeypatch.setenv("FAKE_EXIT", str(exit_code))
    holder: dict[str, Path] = {}

    def resolve(command):
        if "d" not in holder:
            holder["d"] = attempt_dir(fake_slurm)
        return tuple(word.format(d=holder["d"]) for word in command)

    class Steps(dict):  # resolved lazily: the attempt directory exists only once run() made it
        def get(self, k, default=None):
            return [resolve(c) for c in steps.get(k, [])]

    script = Script(writer, Steps())
    started = []

    def clock():  # settle reads the clock once before its first observation: step 1 happens then
        if not started:
            started.append(True)
            for command in script.steps.get(1):
                writer.do(*command)
        return script.clock()

    out_r, out_w = os.pipe()
    frames = FrameWriter(out_w)
    summary = allocation.run(str(fake_slurm), "prog", ["/bin/true"], {}, ["--time=5"], 30.0, frames,
                             settle_kw={"clock": clock, "sleep": script.sleep})
    os.close(out_w)
    records: dict[str, dict] = {}
    data: dict[str, bytes] = {"stdout": b"", "stderr": b""}

    def on_data(name, chunk):
        data[name] += chunk

    with os.fdopen(out_r, "rb") as stream:
        assert read_frames(stream, records.__setitem__, on_data)
    for got in (summary, records["summary"]):
        assert got["exit_code"] == exit_code and got["sbatch_exit_code"] == exit_code
        assert got["settle"]["reason"] == reason and got["settle"]["observations"] == observations
        assert got["settle"]["settled"] is (reason is None)
        assert got["job_id"] == "4242"
    assert (holder.get("d") or attempt_dir(fake_slurm)).joinpath("job").read_text() == "4242\n"
    if scenario == "complete-before-return":
        assert data["stdout"] == b"VQ-DEPLOY-METRIC built=1\n"


def test_sbatch_gets_parsable_wait_and_the_configured_args(fake_slurm, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_WRITE", "before")
    monkeypatch.setenv("FAKE_EXIT", "0")
    out_r, out_w = os.pipe()
    summary = allocation.run(str(fake_slurm), "prog", ["/site/bin/deploy", "--x"], {"A": "b c"},
                             ["--time=04:00:00", "--cpus-per-task=8"], 30.0, FrameWriter(out_w),
                             settle_kw={"clock": lambda: 0.0, "sleep": lambda s: None})
    os.close(out_w)
    os.close(out_r)
    d = Path(summary["attempt_dir"])
    logged = (tmp_path / "sbatch.log").read_text().split()
    assert logged == ["--parsable", "--wait", "--job-name=vq-deploy-prog", "--time=04:00:00", "--cpus-per-task=8",
                      "--output=/dev/null", "--error=/dev/null", f"{d}/job.py", f"{d}/argv.json",
                      hashlib.sha256((d / "argv.json").read_bytes()).hexdigest()]
    assert json.loads((d / "argv.json").read_text()) == {"argv": ["/site/bin/deploy", "--x"], "env": {"A": "b c"}}
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    script = (d / "job.py").read_text()
    assert script.startswith(f"#!{sys.executable} -I\n") and "subprocess" not in script and "system(" not in script


def test_job_script_runs_the_argv_without_a_shell(tmp_path):
    word = "a b'c $HOME `id` ;|&"
    spec = tmp_path / "argv.json"
    spec.write_text(json.dumps({"argv": [sys.executable, "-c",
                                         "import os, sys; print(sys.argv[1]); print(os.environ['V'])",
                                         word], "env": {"V": word}}))
    job = tmp_path / "job.py"
    job.write_bytes(allocation.job_script())
    job.chmod(0o700)
    digest = hashlib.sha256(spec.read_bytes()).hexdigest()
    done = subprocess.run([str(job), str(spec), digest], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (tmp_path / "stderr").read_text()
    # the job writes its transcripts itself, into its attempt directory (Slurm's own are /dev/null)
    assert done.stdout == "" and (tmp_path / "stdout").read_text() == f"{word}\n{word}\n"
    assert stat.S_IMODE((tmp_path / "stdout").stat().st_mode) == 0o600
    spec.write_text(json.dumps({"argv": ["/nonexistent/deploy"], "env": {}}))
    digest = hashlib.sha256(spec.read_bytes()).hexdigest()
    done = subprocess.run([str(job), str(spec), digest], capture_output=True, text=True, timeout=60)
    # a second start (a requeued job) appends to its own transcripts
    assert done.returncode == 127 and "cannot run /nonexistent/deploy" in (tmp_path / "stderr").read_text()
    assert (tmp_path / "stdout").read_text() == f"{word}\n{word}\n"


def test_job_script_reads_its_argv_through_the_bounded_reader(tmp_path):
    """argv.json is parsed by the one bounded JSON reader: a key given twice is refused (86), nothing runs."""
    spec = tmp_path / "argv.json"
    spec.write_text('{"argv": ["/bin/true"], "argv": ["/bin/false"], "env": {}}')
    job = tmp_path / "job.py"
    job.write_bytes(allocation.job_script())
    job.chmod(0o700)
    digest = hashlib.sha256(spec.read_bytes()).hexdigest()
    done = subprocess.run([str(job), str(spec), digest], capture_output=True, text=True, timeout=60)
    stderr = (tmp_path / "stderr").read_text()
    assert done.returncode == allocation.JOB_TAMPERED, stderr
    assert stderr.startswith(allocation.JOB_TAMPERED_MARK) and "more than once" in stderr
    assert "the provider was not run" in stderr
