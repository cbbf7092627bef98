"""What happened to a job, from its events: the report (``report.py``) and its command
(``cli.py``), plot and input fields, the badput by cause, the job's metrics, and the job log's
lines (``joblog.py``)."""
