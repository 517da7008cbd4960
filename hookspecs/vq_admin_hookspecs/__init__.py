"""The vq-admin provider contract.

Everything a provider package needs is importable from here::

    from vq_admin_hookspecs import hookimpl, ProviderCommand, RuntimeRequest
"""

from vq_admin_identifiers import FULL_SHA_RE, NAME_RE, SHA256_RE, TAG_RE

from .markers import ENTRY_POINT_GROUP, PROJECT_NAME, hookimpl, hookspec
from .records import (
    EvidenceError,
    HelperIdentity,
    HelperRequest,
    ProviderCommand,
    PruneReport,
    PruneRequest,
    RuntimeRequest,
    VerifyReceipt,
    is_full_sha,
    parse_single_json_object,
)
from .slots import Slot, is_list_slot, is_slot
from .specs import HOOK_NAMES

__all__ = [
    "ENTRY_POINT_GROUP",
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
    "FULL_SHA_RE",
    "NAME_RE",
    "SHA256_RE",
    "TAG_RE",
    "EvidenceError",
    "HelperIdentity",
    "HelperRequest",
    "ProviderCommand",
    "PruneReport",
    "PruneRequest",
    "RuntimeRequest",
    "VerifyReceipt",
    "is_full_sha",
    "parse_single_json_object",
    "HOOK_NAMES",
    "Slot",
    "is_list_slot",
    "is_slot",
]
__version__ = "1.2.0"
