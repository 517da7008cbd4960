"""The host's record (CONTRACT section 12), driver side: its entries as documents
(:mod:`.statement`), signing and checking them (:mod:`.signing`), and this driver's view of each
host's record (:mod:`.view`).  The agent keeps the record on the login host (:mod:`vq_admin.agent.record`)."""
