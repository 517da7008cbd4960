# -*- coding: utf-8 -*-
# Copyright: vq-admin maintainers; BSD-3-Clause (see LICENSE of vq-admin)
"""Shared by the vq.admin modules: find C(vq) on the driver, run C(vq admin VERB ... --json), read its one
JSON document, and map its outcome onto Ansible's changed/failed."""

import json
import os
import re

COMMON_ARGS = dict(
    vq=dict(type="str", default="vq"),
    config=dict(type="path"),
    state_dir=dict(type="path"),
)

#: The name rule of hosts and programs: vq_admin.core.identifiers.NAME_RULE (tests/test_ansible.py checks it).
NAME_RULE = "[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
NAME_RE = re.compile(r"\A%s\Z" % NAME_RULE)

#: The outcomes that are not failures, and whether they changed anything.
CHANGED = {"ok": True, "already-current": False}


class Vq(object):
    """The installed C(vq) of the driver, for one module run on one C(host)."""

    def __init__(self, module):
        self.module = module
        self.host = module.params["host"]
        if not self.host:
            module.fail_json(msg="host is required (it defaults to the inventory host name only through the "
                                 "vq.admin action plugin)")
        for key in ("host", "program"):  # each becomes a word of vq's command line: never an option
            value = module.params.get(key)
            if value is not None and not NAME_RE.match(value):
                module.fail_json(msg="%s %r is not a name (%s); nothing was run" % (key, value[:200], NAME_RULE))
        name = module.params["vq"]
        self.path = name if os.sep in name else module.get_bin_path(name)
        if not self.path or not os.access(self.path, os.X_OK):
            module.fail_json(msg="vq is not installed on the driver (%s not found or not executable): install "
                                 "vq-admin there, or give its path as vq" % name)

    def run(self, *words):
        """C(vq admin WORDS --json [--config ..] [--state-dir ..]): its document (an envelope), or a one-line
        failure when C(vq) printed none (too old, or not vq-admin).  The operands after C(--) in WORDS stay
        after it (the options go before), so no name is ever read as an option."""
        words = list(words)
        operands = words[words.index("--"):] if "--" in words else []
        argv = [self.path, "admin"] + words[:len(words) - len(operands)] + ["--json"]
        for key, option in (("config", "--config"), ("state_dir", "--state-dir")):
            if self.module.params[key]:
                argv.append(option + "=" + self.module.params[key])  # attached: a value is never an option
        argv += operands
        rc, out, err = self.module.run_command(argv)
        try:
            doc = json.loads(out)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("vq-admin/"):
            tail = (err.strip().splitlines() or ["no output"])[-1]
            msg = ("%s is too old for this collection or is not vq-admin: 'vq admin %s --json' printed no "
                   "vq-admin JSON document (exit %s: %s)" % (self.path, words[0], rc, tail))
            self.module.fail_json(msg=msg, exit_code=rc, cmd=argv)
        return doc

    def check_mode_result(self, changed, **extra):
        """Check mode's end, once the read-only questions are answered: C(vq admin check --connect HOST) first
        (the host and its build hosts reachable, each scratch_root there as a run would find it), failing the
        task as a run would fail; then exit with C(changed) and C(outcome) and C(exit_code) null, since
        nothing ran."""
        reached = self.run("check", "--connect", "--", self.host)
        if reached.get("outcome") != "ok":
            self.finish(reached)
        self.module.exit_json(changed=changed, outcome=None, exit_code=None, receipt=None, **extra)

    def finish(self, doc, **extra):
        """Exit with *doc*'s outcome: C(ok) changed, C(already-current) not; anything else failed, with the
        first error line as C(msg). C(outcome), C(exit_code) and the document (C(receipt)) are returned."""
        outcome = doc.get("outcome")
        result = dict(extra, outcome=outcome, exit_code=doc.get("exit_code"), receipt=doc)
        if outcome in CHANGED:
            self.module.exit_json(changed=CHANGED[outcome], **result)
        errors = doc.get("errors") or ["vq admin ended %s (exit %s)" % (outcome, doc.get("exit_code"))]
        self.module.fail_json(msg=(errors[0].splitlines() or [outcome])[0], **result)


def lane_words(params, *targets, **options):
    """The C(update) command line of a lane: the options the module was given (each value attached with C(=)),
    then C(--) and TARGETS."""
    words = ["update"]
    if params.get("expected_sha"):
        words.append("--expected-sha=" + params["expected_sha"])
    if params.get("tag"):
        words.append("--tag=" + params["tag"])
    if params.get("cluster_install"):
        words.append("--cluster-install")
    for arg in params.get("update_script_args") or ():
        words.append("--update-script-arg=" + arg)
    if params.get("wait_lock") is not None:
        words.append("--wait-lock=%g" % params["wait_lock"])
    if options.get("dry_run"):
        words.append("--dry-run")
    return words + ["--"] + list(targets)
