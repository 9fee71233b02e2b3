"""The RabbitMQ front door: jobs in from a queue, results out to two exchanges.

- :mod:`~comfysup.broker.consumer`: each message is one jobs.jsonl line, validated by comfysup.jobs as
  ``submit`` validates, inserted idempotently by job id, and acknowledged only after the insert committed;
  an invalid one is published to the invalid-jobs destination with its reason, confirmed, then acknowledged.
- :mod:`~comfysup.broker.outbox`: the broker outbox (rows the queue writes in the transaction that ends a
  job) published with confirms to ``done_exchange`` / ``dead_exchange``, message_id = job id, persistent.
- :mod:`~comfysup.broker.publish`: ``comfysup submit --to rabbitmq``.
- :mod:`~comfysup.broker.connection`: pika connections, declarations and reconnection with backoff.

The layer sits just below the commands: it is a translation into the queue (jobs, queue) that reuses the
webhook body (observability) and is handed to the supervisor as a child to fork, so no lower layer knows a
broker exists.
"""
