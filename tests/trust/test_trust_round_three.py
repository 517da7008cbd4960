"""Trust, round three (issue 34): everything ssh, git and Python will load for us, each attack run for real.

The administrator is this test process (root); the attacker is the unprivileged user of
``test_trust_round_two`` (its fixtures), acting through ``setpriv`` on a path the administrator made
writable by the attacker's group.  Each test asserts the exit code, the refusal's words, and that
the attacker's marker does not exist.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import AGENT, GitRepo, command_host, git, run_vq, write_config
from test_trust_round_two import (ATTACKER, Site, assert_only_the_refusal_recorded, assert_refused, attack,
                                  group_writable, shared, state_of)
from vq_admin.agent import pyz
from vq_admin.core import atomic, sshconfig

# -- 1. everything ssh will load ---------------------------------------------------------------------

EVIL_C = '#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) { fopen("%s", "w"); }\n'

#: One attack per entry of :data:`vq_admin.core.sshconfig.SSH_LOADS`: the lines put before the real
#: configuration (``{tools}``: a directory the attacker's group can write) and the path named.
SSH_ATTACKS = {
    "Include": ("Include {tools}/*.conf\n", "{tools}/*.conf"),
    "Match exec": ("Match exec \"{tools}/prog %h\"\n", "{tools}/prog"),
    "ProxyCommand": ("Host cluster\n    ProxyCommand {tools}/prog %h %p\n", "{tools}/prog"),
    "LocalCommand": ("Host cluster\n    PermitLocalCommand yes\n    LocalCommand {tools}/prog\n", "{tools}/prog"),
    "KnownHostsCommand": ("Host cluster\n    KnownHostsCommand {tools}/prog %H\n", "{tools}/prog"),
    "PKCS11Provider": ("Host cluster\n    PKCS11Provider {tools}/evil.so\n", "{tools}/evil.so"),
    "SecurityKeyProvider": ("Host cluster\n    SecurityKeyProvider {tools}/evil.so\n", "{tools}/evil.so"),
    "XAuthLocation": ("Host cluster\n    ForwardX11 yes\n    XAuthLocation {tools}/prog\n", "{tools}/prog"),
    "IdentityFile": ("Host cluster\n    IdentityFile {tools}/id\n", "{tools}/id"),
    "CertificateFile": ("Host cluster\n    CertificateFile {tools}/id-cert.pub\n", "{tools}/id-cert.pub"),
    "UserKnownHostsFile": ("Host cluster\n    UserKnownHostsFile {tools}/known\n", "{tools}/known"),
    "GlobalKnownHostsFile": ("Host cluster\n    GlobalKnownHostsFile {tools}/known\n", "{tools}/known"),
    "RevokedHostKeys": ("Host cluster\n    RevokedHostKeys {tools}/revoked\n", "{tools}/revoked"),
    "IdentityAgent": ("Host cluster\n    IdentityAgent {tools}/agent.sock\n", "{tools}"),
    "ControlPath": ("Host cluster\n    ControlMaster auto\n    ControlPath {tools}/%C\n", "{tools}"),
    "ProxyJump": ("Host cluster\n    ProxyJump jumphost\nHost jumphost\n    HostName 127.0.0.1\n"
                  "    PKCS11Provider {tools}/evil.so\n", "{tools}/evil.so"),
}


def test_every_entry_of_the_table_has_an_attack_and_a_row_in_the_security_page():
    options = [option for option, _, _ in sshconfig.SSH_LOADS]
    assert options == list(SSH_ATTACKS)
    page = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    rows = [f"| `{option}` | {kind} | {when} |" for option, kind, when in sshconfig.SSH_LOADS]
    assert all(row in page for row in rows), [row for row in rows if row not in page]


@pytest.mark.parametrize("option", list(SSH_ATTACKS))
def test_what_ssh_would_load_from_another_user_is_refused_before_ssh_runs(tmp_path, arena, attacker, real_sshd,
                                                                          option):
    tools = shared(arena / "tools", attacker)
    lines, named = (text.format(tools=tools) for text in SSH_ATTACKS[option])
    config = tmp_path / "ssh_config"
    config.write_text(lines + "\n" + Path(real_sshd.ssh_config).read_text())
    config.chmod(0o600)
    site = Site(tmp_path, arena, config)
    (tools / "prog").write_text(f"#!/bin/sh\ntouch {site.marker}\n")  # what ssh would run or load, as root
    (tools / "prog").chmod(0o755)
    (tools / "evil.c").write_text(EVIL_C % site.marker)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tools / "evil.so"), str(tools / "evil.c")], check=True)
    attack(f"touch {tools}/planted")  # the attacker can write there
    env = {"DISPLAY": ":0"}  # as in an ssh -X session: with ForwardX11, ssh runs xauth
    before = state_of(site.state)
    for verb in (("check",), ("update", site.program, "cluster", "--expected-sha", site.sha)):
        done = site.vq(*verb, env=env)
        assert_refused(done, option if option not in ("Include", "Match exec") else named, named)
        assert not site.marker.exists() and not site.deployed.exists()
    assert_only_the_refusal_recorded(before, site.state)  # refused in the lane: its receipt, nothing else


def test_include_glob_matching_nothing_in_a_sticky_directory_is_refused_at_check(tmp_path, arena, real_sshd):
    sticky = arena / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    config = tmp_path / "ssh_config"
    config.write_text(f"Include {sticky}/*.conf\n" + Path(real_sshd.ssh_config).read_text())
    config.chmod(0o600)
    site = Site(tmp_path, arena, config)
    assert_refused(site.vq("check"), f"Include {sticky}/*.conf does not exist and directory {sticky} (mode 1777)")


# -- 2, 5. the agent: judged before it runs, run isolated ----------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def shared_venv(arena: Path, gid: int) -> Path:
    """A venv whose site-packages the attacker's group can write, holding vq_admin through a ``.pth``
    (as an editable install does): ``agent = "<venv>/bin/python -m vq_admin.agent"`` needs its site."""
    venv = arena / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "vq-admin.pth").write_text(f"{REPO}\n{REPO / 'hookspecs'}\n")
    group_writable(site, gid)
    return venv


@pytest.mark.parametrize("plant", ["zz.pth", "xxhash.py"])
def test_a_module_planted_in_the_agents_site_packages_never_runs(tmp_path, arena, attacker, real_sshd, plant):
    venv = shared_venv(arena, attacker)
    site = Site(tmp_path, arena, real_sshd.ssh_config)
    write_config(site.config, site.config.read_text().replace(f'agent = "{AGENT}"',
                                                              f'agent = "{venv}/bin/python -m vq_admin.agent"'))
    payload = f"import os; open({str(site.marker)!r}, 'w')" if plant.endswith(".pth") else \
        f"open({str(site.marker)!r}, 'w')\ndef xxh3_64(): pass\n"
    sitedir = next((venv / "lib").glob("python3*/site-packages"))
    attack(f"printf '%s\\n' \"{payload}\" > {sitedir}/{plant}")
    before = state_of(site.state)
    for verb in (("update", site.program, "cluster", "--expected-sha", site.sha),
                 ("verify", site.program, "cluster", "--expected-sha", site.sha), ("check", "--connect")):
        done = site.vq(*verb)
        text = done.stdout + done.stderr
        assert done.exit_code in (77, 1), text  # verify and check --connect: the host's row says refused
        assert f"{sitedir} is group-writable" in text, text  # check --connect: its row, cut at 300 characters
        assert "nothing was run" in text or verb[0] == "check", text
        assert not site.marker.exists() and not site.deployed.exists()
    assert_only_the_refusal_recorded(before, site.state)


@pytest.mark.parametrize("plant", ["zz.pth", "xxhash.py"])
def test_the_single_file_agent_never_reads_a_writable_site_packages(tmp_path, arena, attacker, real_sshd, plant):
    """``agent = "<venv>/bin/python <dir>/vq-admin-agent.pyz"``, that venv's site-packages group-writable: the
    archive runs ``-I -S``, so nothing planted there is ever read (the run goes on)."""
    venv = shared_venv(arena, attacker)
    archive = pyz.build(str(tmp_path / "vq-admin-agent.pyz"))
    site = Site(tmp_path, arena, real_sshd.ssh_config)
    write_config(site.config, site.config.read_text().replace(f'agent = "{AGENT}"',
                                                              f'agent = "{venv}/bin/python {archive}"'))
    sitedir = next((venv / "lib").glob("python3*/site-packages"))
    attack(f"echo \"import os, sys; open('{site.marker}', 'w').write(repr(sys.argv))\" > {sitedir}/{plant}")
    done = site.update()
    assert not site.marker.exists(), site.marker.read_text()
    assert done.exit_code != 77 and site.deployed.exists(), done.stdout + done.stderr  # it ran, isolated


def test_a_group_writable_login_home_user_site_is_never_read(tmp_path, arena, attacker):
    """``transport = "local"`` with HOME group-writable: the agent runs ``-I``, no user site at all."""
    home = shared(arena / "home", attacker)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    usersite = home / ".local" / "lib" / version / "site-packages"
    marker = arena / "pwned"
    attack(f"mkdir -p {usersite} && echo \"import os; open('{marker}', 'w')\" > {usersite}/zz.pth")
    repo = GitRepo(tmp_path / "repo")
    sha = repo.commit("A")
    verify = arena / "verify.sh"
    verify.write_text("#!/bin/sh\nexit 3\n")
    verify.chmod(0o755)
    config = write_config(tmp_path / "admin.toml", command_host(
        "trust3", scratch=tmp_path, repo=repo.path, update="/bin/true", verify=str(verify), transport="local"))
    done = run_vq("update", "trust3", "cluster", "--expected-sha", sha, config=config, state=tmp_path / "state",
                  env={"HOME": str(home)})
    assert "Traceback" not in done.stderr
    assert not marker.exists(), done.stderr


def test_an_agent_in_a_group_writable_directory_is_refused_before_it_runs(tmp_path, arena, attacker, real_sshd):
    tools = shared(arena / "agent", attacker)
    agent = tools / "vq-admin-agent"
    shutil.copy(AGENT, agent)
    site = Site(tmp_path, arena, real_sshd.ssh_config)
    write_config(site.config, site.config.read_text().replace(f'agent = "{AGENT}"', f'agent = "{agent}"'))
    attack(f"printf '#!/bin/sh\\ntouch {site.marker}\\n' > {agent}.new && mv -f {agent}.new {agent} && "
           f"chmod 755 {agent}")
    before = state_of(site.state)
    done = site.update()
    text = assert_refused(done, f"{agent} is owned by {ATTACKER}")
    assert "nothing was run" in text and not site.marker.exists()  # true: the judge refused it, it never ran
    assert_only_the_refusal_recorded(before, site.state)


# -- 3. nothing vq-admin writes can be redirected ------------------------------------------------------


def test_a_symlink_planted_at_every_name_the_agent_builder_writes_is_never_followed(tmp_path, arena, attacker,
                                                                                    monkeypatch):
    sticky = arena / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    victim = arena / "victim"
    victim.write_text("precious\n")
    out = sticky / "vq-admin-agent.pyz"
    monkeypatch.setattr(atomic, "temp_name", lambda name: f".tmp.{os.path.basename(name)}.planted")
    attack(f"ln -s {victim} {sticky}/.tmp.vq-admin-agent.pyz.planted && ln -s {victim} {out}")
    with pytest.raises(FileExistsError):
        pyz.build(str(out))  # the temporary name is taken: never opened through the link
    assert victim.read_text() == "precious\n" and out.is_symlink()
    monkeypatch.undo()
    pyz.build(str(out))  # a fresh temporary name, renamed over the planted link (never written through)
    assert victim.read_text() == "precious\n" and not out.is_symlink() and out.read_bytes().startswith(b"#!")


# -- 4. provider install SRC ---------------------------------------------------------------------------


def test_provider_install_of_another_users_file_is_refused(tmp_path, arena, attacker):
    drop = shared(arena / "drop", attacker)
    src = drop / "deploy"
    attack(f"printf '#!/bin/sh\\ntrue\\n' > {src}")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    config = write_config(tmp_path / "admin.toml", f'[hosts.cluster]\nfleet_role = "managed"\ntransport = "local"\n'
                                                   f'agent = "{AGENT}"\n')
    done = run_vq("provider", "install", str(src), "--host", "cluster", "--dest", str(bindir / "deploy"),
                  config=config, state=tmp_path / "state")
    assert done.exit_code == 77, done.stderr
    assert f"SRC: file {src} is owned by {ATTACKER}" in done.stderr and "nothing was installed" in done.stderr
    assert not (bindir / "deploy").exists()


# -- 8. git alternates ---------------------------------------------------------------------------------


def test_alternates_into_a_group_writable_directory_are_refused_by_name(tmp_path, arena, attacker, real_sshd):
    borrowed = GitRepo(arena / "borrowed")
    borrowed.commit("A")
    store = Path(borrowed.path) / ".git" / "objects"
    group_writable(store, attacker)
    site = Site(tmp_path, arena, real_sshd.ssh_config)
    info = Path(site.repo.path) / ".git" / "objects" / "info"
    info.mkdir(exist_ok=True)
    (info / "alternates").write_text(f"{store}\n")
    before = state_of(site.state)
    done = site.update()
    assert_refused(done, "objects/info/alternates", f"directory {store} is group-writable")
    assert not site.deployed.exists()
    assert_only_the_refusal_recorded(before, site.state)
    env = {"GIT_ALTERNATE_OBJECT_DIRECTORIES": str(store)}
    (info / "alternates").unlink()
    assert_refused(site.vq("update", site.program, "cluster", "--expected-sha", site.sha, env=env),
                   "GIT_ALTERNATE_OBJECT_DIRECTORIES", f"directory {store} is group-writable")
    assert git(site.repo.path, "rev-parse", "HEAD").strip() == site.sha


# -- 7. messages ---------------------------------------------------------------------------------------


def test_a_newline_and_a_long_value_are_escaped_and_shortened_in_every_message(tmp_path):
    config = write_config(tmp_path / "admin.toml", '[hosts.cluster]\nfleet_role = "managed"\ntransport = "local"\n')
    long = "y" * 120_000
    for args in (("status", "--state-dir", f"{tmp_path}/a\nfake: line"),
                 ("provider", "install", f"{tmp_path}/a\nfake: line", "--host", "cluster", "--dest", "/x/y"),
                 ("update", long), ("status", "--state-dir", "/" + long),
                 ("provider", "install", "/" + long, "--host", "cluster", "--dest", "/x/y")):
        done = run_vq(*args, config=config, state=tmp_path / "state")
        text = done.stdout + done.stderr
        assert "Traceback" not in text and "\nfake: line" not in text and len(text) < 3000, text[:500]
        assert "\\x0afake: line" in text or " characters)" in text, text[:500]
