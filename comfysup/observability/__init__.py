"""What people and other programs see of a running comfysup: metrics, the status page, webhooks.

It reads the queue and the supervisor's state file and never changes a job's state; the monitor process
(``monitor.py``) serves all of it beside the supervisor. Nothing here imports ``supervisor`` or
``commands``: they depend on it, not the other way round (see docs/architecture.md).
"""
