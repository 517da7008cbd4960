"""One module per verb of ``vq admin`` (``provider`` and ``completion``: :mod:`vq_admin.provider_install`,
:mod:`vq_admin.conformance.cli`, :mod:`vq_admin.completion`)."""
