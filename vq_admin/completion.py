"""Shell completion for ``vq admin`` and ``vq-admin``, generated from the argument tree.

``shtab`` turns :func:`vq_admin.cli.build_parser` into bash and zsh scripts:
verbs, nested verbs and options come from the parser itself; host and
program names come from the configuration file, read by the shell with one
``sed`` when a HOST or PROGRAM is being completed (``$VQ_ADMIN_CONFIG``, else
``${XDG_CONFIG_HOME:-~/.config}/vq/admin.toml``; table headers
``[hosts.NAME]`` and ``[hosts.NAME.scheduler_runtime_deployments.PROGRAM]``).
No Python runs at completion time.

* ``vq admin completion bash|zsh`` prints the script for both commands, for
  ``source <(vq admin completion bash)`` or ``eval "$(vq admin completion zsh)"``;
* ``pip install`` puts one file per command under
  ``share/bash-completion/completions/`` (``vq``, ``vq-admin``: bash-completion
  loads them by command name) and ``share/zsh/site-functions/`` (``_vq``,
  ``_vq-admin``).  Those files are generated into ``completions/`` of the
  source tree by ``python -m vq_admin.completion --write completions`` and
  committed; ``tests/test_completion.py`` checks them against the parser.

``shtab`` is imported only here, for the ``completion`` verb and the writer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cli import Parser

SHELLS = ("bash", "zsh")
#: command -> shtab's root prefix (distinct, so both scripts can be loaded in one shell).
COMMANDS = {"vq-admin": "vq-admin", "vq": "vqcli"}
#: The installed file of each command, per shell (relative to completions/).
FILES = {("bash", "vq-admin"): "bash/vq-admin", ("bash", "vq"): "bash/vq",
         ("zsh", "vq-admin"): "zsh/_vq-admin", ("zsh", "vq"): "zsh/_vq"}

# Reads the names from the configuration's table headers: plain names, or quoted ones (which may hold dots).
_NAMES = r"""
_vq_admin_config_names() {
  local cfg="${VQ_ADMIN_CONFIG:-${XDG_CONFIG_HOME:-$HOME/.config}/vq/admin.toml}"
  [ -r "$cfg" ] || return 0
  case "$1" in
    hosts) sed -n \
      -e 's/^[[:space:]]*\[[[:space:]]*hosts\.\([A-Za-z0-9][A-Za-z0-9_-]*\)[[:space:]]*\].*/\1/p' \
      -e 's/^[[:space:]]*\[[[:space:]]*hosts\."\([A-Za-z0-9][A-Za-z0-9._-]*\)"[[:space:]]*\].*/\1/p' "$cfg" ;;
    programs) sed -n \
      -e 's/^[[:space:]]*\[[[:space:]]*hosts\.\([A-Za-z0-9_-]*\|"[A-Za-z0-9._-]*"\)\.scheduler_runtime_deployments\.\([A-Za-z0-9][A-Za-z0-9_-]*\)[[:space:]]*\].*/\2/p' \
      -e 's/^[[:space:]]*\[[[:space:]]*hosts\.\([A-Za-z0-9_-]*\|"[A-Za-z0-9._-]*"\)\.scheduler_runtime_deployments\."\([A-Za-z0-9][A-Za-z0-9._-]*\)"[[:space:]]*\].*/\2/p' \
      "$cfg" | sort -u ;;
  esac
}
""".strip("\n")  # noqa: E501 - sed expressions kept whole

PREAMBLE = {
    "bash": _NAMES + r"""
_vq_admin_hosts() { compgen -W "$(_vq_admin_config_names hosts)" -- "$1"; }
_vq_admin_programs() { compgen -W "$(_vq_admin_config_names programs)" -- "$1"; }
# [PROGRAM] HOST: after a program only hosts; after a host nothing more
_vq_admin_targets() {
  local prev="${COMP_WORDS[COMP_CWORD-1]}" programs hosts nl=$'\n'
  programs=$(_vq_admin_config_names programs); hosts=$(_vq_admin_config_names hosts)
  if [[ "$nl$hosts$nl" == *"$nl$prev$nl"* ]]; then return 0; fi
  if [[ "$nl$programs$nl" == *"$nl$prev$nl"* ]]; then compgen -W "$hosts" -- "$1"; return; fi
  compgen -W "$programs $hosts" -- "$1"
}
""".rstrip("\n"),
    "zsh": _NAMES + r"""
_vq_admin_hosts() { local -a names; names=(${(f)"$(_vq_admin_config_names hosts)"}); compadd -a names; }
_vq_admin_programs() { local -a names; names=(${(f)"$(_vq_admin_config_names programs)"}); compadd -a names; }
_vq_admin_targets() {  # [PROGRAM] HOST: after a program only hosts; after a host nothing more
  local -a programs hosts; local prev=${words[CURRENT-1]}
  programs=(${(f)"$(_vq_admin_config_names programs)"}); hosts=(${(f)"$(_vq_admin_config_names hosts)"})
  (( ${hosts[(Ie)$prev]} )) && return 1
  (( ${programs[(Ie)$prev]} )) && { compadd -a hosts; return; }
  compadd -a programs hosts
}
""".rstrip("\n"),
}

#: metavar -> the preamble function that completes it.
_NAME_COMPLETERS = {"HOST": "_vq_admin_hosts", "PROGRAM": "_vq_admin_programs", "[PROGRAM] HOST": "_vq_admin_targets"}


def _annotate(parser: Parser) -> None:
    """Give every HOST / PROGRAM / PATH / DIR argument of the tree its completer (shtab's ``.complete``)."""
    import shtab

    completers: dict[object, object] = {"PATH": shtab.FILE, "SRC": shtab.FILE, "DIR": shtab.DIRECTORY}
    completers.update((metavar, {"bash": name, "zsh": name}) for metavar, name in _NAME_COMPLETERS.items())
    for action in (action for member in parser.family for action in member.arguments):
        if action.metavar in completers:
            action.complete = completers[action.metavar]  # type: ignore[attr-defined]


def parser_for(command: str) -> argparse.ArgumentParser:
    """The argument tree as *command* (``vq-admin``, or ``vq`` whose one verb is ``admin``) sees it."""
    from .cli import build_parser

    admin = build_parser("vq-admin" if command == "vq-admin" else "vq admin")
    _annotate(admin)
    if command == "vq-admin":
        return admin
    parser = argparse.ArgumentParser(prog="vq", add_help=False)
    sub = parser.add_subparsers(dest="_vq")
    sub.add_parser("admin", help="administer the vq helper and managed runtimes")
    sub.choices["admin"] = admin
    return parser


def script(shell: str, command: str) -> str:
    """The completion script of *command* for *shell*."""
    import shtab

    if shell not in SHELLS:
        raise ValueError(f"shell must be one of {', '.join(SHELLS)}")
    text = shtab.complete(parser_for(command), shell=shell, root_prefix=COMMANDS[command],
                          preamble=PREAMBLE[shell])
    header = (f"# {command} completion for {shell}, generated from vq_admin.cli.build_parser() by "
              f"vq_admin.completion (shtab {shtab.__version__}).\n")
    if shell == "zsh":  # the #compdef line must stay first
        first, _, rest = text.partition("\n")
        return f"{first}\n{header}{rest}"
    return header + text


def all_scripts(shell: str) -> str:
    """Both commands' scripts for *shell*, to source or eval in one go."""
    return "\n".join(script(shell, command) for command in COMMANDS)


def run(args: argparse.Namespace) -> int:
    """``vq admin completion bash|zsh``: :func:`all_scripts` on stdout."""
    sys.stdout.write(all_scripts(args.shell))
    return 0


def write(directory: Path) -> list[Path]:
    """(Re)generate the installed files under *directory* (the tree's ``completions/``)."""
    written = []
    for (shell, command), name in FILES.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(script(shell, command), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vq_admin.completion",
                                     description="write the completion files that pip installs")
    parser.add_argument("--write", metavar="DIR", required=True, help="the source tree's completions/ directory")
    args = parser.parse_args(argv)
    for path in write(Path(args.write)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
