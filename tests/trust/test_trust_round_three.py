"""Trust, round three (issue 34): everything ssh, git and Python will load for us, each attack run for real.

The administrator is this test process (root); the attacker is the unprivileged user of
``test_trust_round_two`` (its fixtures), acting through ``setpriv`` on a path the administrator made
writable by the attacker's group.  Each test asserts the exit code, the refusal's words, and that
the attacker's marker does not exist.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from test_trust_round_two import (ATTACKER, Site, arena, assert_only_the_refusal_recorded, assert_refused,  # noqa: F401
                                  attack, attacker, shared, state_of)
from vq_admin.core import sshconfig

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
