"""Words of a command line (docs/security.md): every word from input that lands in an argv is refused by
the one name rule or placed after ``--``; no process is started to find out."""

from __future__ import annotations

import msgspec
import pytest

from vq_admin.core.identifiers import JOB_ID_RE
from vq_admin.document import FullSha, Sha256
from vq_admin.launcher.references import QueuedJob
from vq_admin.record.statement import DRIVER_ID_RE, DriverId

#: Values an inventory, a configuration file or a scheduler's output could hand vq-admin.
HOSTILE = ["-oProxyCommand=touch /tmp/pwned", "--all", "-x", "a\n", "a\nb", "a\0b", "x" * 120_000, ""]

SHA = "a" * 40


# -- the patterns a document is checked with: anchored, so a trailing newline never passes ----------------

@pytest.mark.parametrize(("kind", "good"), [(FullSha, SHA), (Sha256, "b" * 64), (DriverId, "u@h/0123abcd")])
def test_document_patterns_refuse_a_trailing_newline(kind, good):
    assert msgspec.convert(good, kind) == good
    for bad in (good + "\n", "\n" + good, good + "\0"):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, kind)
    assert not DRIVER_ID_RE.match("u@h/0123abcd\n")


@pytest.mark.parametrize("job_id", ["12\n", "-1", "--all", "١٢", "12;x", "", "1" * 21, "12 13"])
def test_a_job_id_is_ascii_digits_only(job_id):
    assert not JOB_ID_RE.match(job_id)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"id": job_id, "display": job_id, "state": "PENDING", "user": "u"}, QueuedJob)


def test_sbatch_parsable_and_the_census_share_the_job_id_rule():
    from vq_admin.agent import census, slurmjob

    assert slurmjob.PARSABLE_RE.match("123;cluster").group(1) == "123"
    assert not slurmjob.PARSABLE_RE.match("١٢٣")
    token = "\x1f"
    good = ["12", "12", "PENDING", "u", "2026-01-01T00:00:00", "1"] + ["x"] * (len(census.FIELDS) - 6)
    assert census._listing(("".join(f + token for f in good)).encode(), token)
    for job in ("١٢", "-1", "12\n"):
        fields = [job, *good[1:]]
        with pytest.raises(census.CensusFailed):
            census._listing(("".join(f + token for f in fields)).encode(), token)
