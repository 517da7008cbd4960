"""The attacker of the trust tests (a second local user) and its arena, shared by every round's file."""

from test_trust_round_two import arena, attacker  # noqa: F401  (fixtures)
