"""The kernel log: its sources (``sources``), line parsing (``parse``, ``rdma``) and the saved
position (``position``)."""
