"""The progress view's *watch* callback reaches the command over ssh, as it does locally.

``SshTransport.run`` once lacked the ``watch`` parameter, so a deploy on a
terminal (where the live progress view is on) over ssh raised ``TypeError``
before anything ran; ``mypy --strict`` found the incompatible override.
"""

from __future__ import annotations

from vq_admin.ssh.transport import LocalTransport, SshTransport


def test_ssh_run_passes_watch_the_capture_files_then_none(fp):
    fp.register(["/usr/bin/ssh", fp.any()], returncode=0, stdout="built\n")
    calls: list[tuple[int, ...]] = []
    t = SshTransport("cluster", None, None)
    t.shell_checked = True  # the login-shell probe is tested for real in tests/trust/
    result = t.run(["/site/deploy"], timeout=10, watch=lambda *fds: calls.append(fds))
    assert result.exit_code == 0 and result.stdout == b"built\n"
    assert len(calls) == 2 and len(calls[0]) == 2 and calls[1] == ()


def test_local_run_passes_watch_the_capture_files_then_none():
    calls: list[tuple[int, ...]] = []
    result = LocalTransport().run(["true"], timeout=10, watch=lambda *fds: calls.append(fds))
    assert result.exit_code == 0
    assert len(calls) == 2 and len(calls[0]) == 2 and calls[1] == ()
