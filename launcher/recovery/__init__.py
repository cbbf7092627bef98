"""What the launcher does about a fault: the evidence and the blame, the decisions
(``policy.py``, pure), exclusions and their ledger, requeue and the time limit, hot spares and
evacuation, level 0, stragglers, the node watch, and the exit codes of each verdict."""
