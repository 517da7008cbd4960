"""``vq-admin-agent``: the scheduler-side helper's verbs.

The driver runs these on a login or build host over ssh.  Each verb prints
one JSON object on stdout.  Exit status: 0 done, 1 failed (message on
stderr), 2 usage, 3 an identity did not match, 4 an unsafe path was refused.

Standard library only, and nothing of the driver side is imported: the agent
must run on a host that has only this package's files.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys

from . import safedirs, stage
from .treeid import file_sha256

EXIT_FAILED, EXIT_USAGE, EXIT_MISMATCH, EXIT_UNSAFE = 1, 2, 3, 4


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def cmd_hash_file(args: argparse.Namespace) -> int:
    path = args.path
    try:
        st = os.stat(path)
        real = os.path.realpath(path)
        lst = os.lstat(path)
    except OSError as exc:
        _emit({"path": path, "exists": False, "error": exc.strerror})
        return EXIT_FAILED
    if not stat.S_ISREG(st.st_mode):
        _emit({"path": path, "exists": True, "regular": False, "error": "not a regular file"})
        return EXIT_FAILED
    _emit({
        "path": path,
        "exists": True,
        "regular": True,
        "is_symlink": stat.S_ISLNK(lst.st_mode),
        "realpath": real,
        "size": st.st_size,
        "executable": bool(st.st_mode & 0o111),
        "sha256": file_sha256(path),
    })
    return 0


def cmd_stage_create(args: argparse.Namespace) -> int:
    identity = {
        "SOURCE-SHA": args.sha,
        "ARCHIVE-SHA256": args.archive_sha256,
        "SOURCE-TREE-SHA256": args.tree_sha256,
        "GIT-TREE": args.git_tree,
    }
    _emit(stage.create(args.root or os.path.expanduser("~"), args.kind, args.name, identity))
    return 0


def cmd_stage_receive(args: argparse.Namespace) -> int:
    _emit(stage.receive(args.stage, sys.stdin.buffer))
    return 0


def cmd_stage_verify(args: argparse.Namespace) -> int:
    result = stage.verify(args.stage, {
        "SOURCE-SHA": args.sha,
        "ARCHIVE-SHA256": args.archive_sha256,
        "SOURCE-TREE-SHA256": args.tree_sha256,
        "GIT-TREE": args.git_tree,
    })
    _emit(result)
    return 0 if result["verified"] else EXIT_MISMATCH


def cmd_stage_reclaim(args: argparse.Namespace) -> int:
    root = args.root or os.path.expanduser("~")
    _emit(stage.reclaim(root, args.kind, args.name, args.stage, args.outcome == "success", args.keep_failed))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vq-admin-agent", description="vq scheduler-side helper verbs")
    sub = parser.add_subparsers(dest="verb", required=True)

    p = sub.add_parser("hash-file", help="SHA-256 of the file at PATH (following symlinks)")
    p.add_argument("path")
    p.set_defaults(func=cmd_hash_file)

    def identity_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--sha", required=True)
        p.add_argument("--archive-sha256", required=True)
        p.add_argument("--tree-sha256", required=True)
        p.add_argument("--git-tree", required=True)

    p = sub.add_parser("stage-create", help="create a fresh stage with its identity files")
    p.add_argument("--root", help="scratch root (default: home directory)")
    p.add_argument("--kind", choices=stage.KINDS, required=True)
    p.add_argument("--name", required=True)
    identity_args(p)
    p.set_defaults(func=cmd_stage_create)

    p = sub.add_parser("stage-receive", help="write the archive read from stdin into a stage")
    p.add_argument("--stage", required=True)
    p.set_defaults(func=cmd_stage_receive)

    p = sub.add_parser("stage-verify", help="prove a staged archive's identity")
    p.add_argument("--stage", required=True)
    identity_args(p)
    p.set_defaults(func=cmd_stage_verify)

    p = sub.add_parser("stage-reclaim", help="remove a succeeded stage or cap failed ones")
    p.add_argument("--root")
    p.add_argument("--kind", choices=stage.KINDS, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--stage", required=True)
    p.add_argument("--outcome", choices=("success", "failed"), required=True)
    p.add_argument("--keep-failed", type=int, default=3)
    p.set_defaults(func=cmd_stage_reclaim)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except safedirs.UnsafePath as exc:
        print(f"vq-admin-agent: refused: {exc}", file=sys.stderr)
        return EXIT_UNSAFE
    except OSError as exc:
        print(f"vq-admin-agent: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
