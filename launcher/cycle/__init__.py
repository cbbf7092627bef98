"""What a cycle is before it runs: its plan (``plan.py``: the allocation, the nodes' ranks, the
ft_launcher command line), the ranks' environment, the in-process plan, the feature cache, and
the progress a cycle makes (``progress.py``, read from checkpoints and step reports)."""
