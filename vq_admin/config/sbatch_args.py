"""Which ``update_allocation.sbatch_args`` vq-admin passes to ``sbatch``: an allow-list.

A deny-list cannot keep up with how ``sbatch`` reads its options
(``getopt_long``): short options take attached values and cluster
(``-o/tmp/x``, ``-Wo/tmp/x``), and any unique prefix of a long option is
that option (``--out=/tmp/x`` is ``--output``).  So only options that cannot
redirect the job's output or input, change the user, group, working
directory or environment, run extra copies, or change the cluster are
allowed, each named in full, and a value is always attached (``--time=04:00:00``,
``-t04:00:00``): a value in the next entry could swallow the option after it.

:func:`sbatch_arg_problem` returns why one entry is refused, or ``None``.
"""

from __future__ import annotations

#: Options vq-admin sets itself (never from the configuration).
OWN = {"--wait", "--parsable", "--output", "--error", "--wrap", "--job-name"}
OWN_SHORT = {"W", "o", "e", "J"}

#: Allowed long options: name -> True when it takes a value, False when it is a flag.
LONG = {
    "account": True, "acctg-freq": True, "begin": True, "comment": True, "constraint": True,
    "contiguous": False, "core-spec": True, "cores-per-socket": True, "cpu-freq": True, "cpus-per-gpu": True,
    "cpus-per-task": True, "deadline": True, "delay-boot": True, "dependency": True, "distribution": True,
    "exclude": True, "exclusive": None, "extra-node-info": True, "gpu-bind": True, "gpu-freq": True,
    "gpus": True, "gpus-per-node": True, "gpus-per-socket": True, "gpus-per-task": True, "gres": True,
    "gres-flags": True, "hint": True, "hold": False, "kill-on-invalid-dep": True, "licenses": True, "mem": True,
    "mem-bind": True, "mem-per-cpu": True, "mem-per-gpu": True, "mincpus": True, "network": True, "nice": None,
    "no-kill": None, "no-requeue": False, "nodelist": True, "nodes": True, "ntasks": True,
    "ntasks-per-core": True, "ntasks-per-gpu": True, "ntasks-per-node": True, "ntasks-per-socket": True,
    "overcommit": False, "oversubscribe": False, "partition": True, "prefer": True, "priority": True,
    "qos": True, "reservation": True, "sockets-per-node": True, "spread-job": False, "switches": True,
    "thread-spec": True, "threads-per-core": True, "time": True, "time-min": True, "tmp": True,
    "use-min-nodes": False, "wckey": True,
}
#: Allowed short options: letter -> True when it takes a value, False when it is a flag.
SHORT = {"A": True, "C": True, "c": True, "d": True, "G": True, "H": False, "k": False, "L": True, "m": True, "N": True,
         "n": True, "O": False, "p": True, "q": True, "s": False, "S": True, "t": True, "w": True, "x": True}

ALLOWED_HINT = ("allowed: resource, time, partition, account and placement options such as --time=04:00:00, "
                "--partition=NAME, --cpus-per-task=8, --mem=16G, written out in full with the value attached")


def sbatch_arg_problem(arg: str) -> str | None:
    """``None`` when *arg* is one allowed sbatch option with its value attached."""
    if not arg.startswith("-") or arg in ("-", "--") or any(c in arg for c in "\n\r\0"):
        return f"{arg!r} is not an sbatch option (each entry starts with '-', e.g. \"--time=04:00:00\")"
    return _long_problem(arg) if arg.startswith("--") else _short_problem(arg)


def _long_problem(arg: str) -> str | None:
    name, eq, value = arg[2:].partition("=")
    if "--" + name in OWN:
        return f"{arg!r} is set by vq-admin itself"
    if name not in LONG:
        own = [o for o in OWN if o.startswith("--" + name)] if name else []
        if own:
            return f"{arg!r} abbreviates {own[0]}, which is set by vq-admin itself"
        return f"{arg!r} is not an sbatch option vq-admin passes ({ALLOWED_HINT})"
    if LONG[name] is True and not value:  # no "=" leaves the value empty too
        return f"{arg!r} needs its value attached (--{name}=VALUE)"
    return f"{arg!r}: --{name} takes no value" if LONG[name] is False and eq else None


def _short_problem(arg: str) -> str | None:
    letter, value = arg[1], arg[2:]
    if letter in OWN_SHORT:
        return f"{arg!r} is set by vq-admin itself (-{letter})"
    if letter not in SHORT:
        return f"{arg!r} is not an sbatch option vq-admin passes ({ALLOWED_HINT})"
    if SHORT[letter]:
        return None if value else f"{arg!r} needs its value attached (-{letter}VALUE)"
    for other in value:  # flags cluster (-kO); every letter must be an allowed flag
        if other in OWN_SHORT:
            return f"{arg!r} clusters -{other}, which is set by vq-admin itself"
        if SHORT.get(other) is not False:
            return f"{arg!r} clusters -{other}, which is not a flag vq-admin passes ({ALLOWED_HINT})"
    return None
