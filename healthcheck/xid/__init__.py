"""Xid lines by their code: decodes of the line's own text (``decode``), the applications' Xid
history (``history``), the generated Xid table of docs/health.md (``table``). The policy data they
read is ``healthcheck/xid_policies/``, loaded by ``healthcheck/policy.py``."""
