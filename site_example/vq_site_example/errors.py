"""Exit codes of ``vq-site-example`` and the one exception that carries them.

vq-admin records a deployment's exit status exactly as returned, so these
codes are part of this provider's documented interface (see README.md).
"""

#: Done: the release is built, validated and ``current`` points at it
#: (deploy/install), or a receipt was printed (verify).
EXIT_OK = 0
#: A step ran and failed (unpack, build, validation, activation); ``current``
#: is unchanged.
EXIT_FAILED = 1
#: Bad command line, or a root layout this verb does not handle; nothing ran.
EXIT_USAGE = 2
#: The staged archive's identity is missing or differs from the request;
#: nothing was unpacked.
EXIT_IDENTITY = 3
#: Another deploy holds ``ROOT/.deploy.lock``; nothing ran.
EXIT_LOCKED = 75


class SiteError(Exception):
    """A refusal or failure with its exit code; the message is for operators."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def usage(message: str) -> SiteError:
    """A usage error (exit 2)."""
    return SiteError(EXIT_USAGE, message)


def failed(message: str) -> SiteError:
    """A failed step (exit 1)."""
    return SiteError(EXIT_FAILED, message)


def identity(message: str) -> SiteError:
    """An identity mismatch (exit 3)."""
    return SiteError(EXIT_IDENTITY, message)
