"""``vq admin completion bash|zsh``: print the completion script of ``vq`` and ``vq-admin``."""

from __future__ import annotations

import argparse
import sys


def run(args: argparse.Namespace) -> int:
    from ..completion import all_scripts

    sys.stdout.write(all_scripts(args.shell))
    return 0
