"""comfysup: run ComfyUI in production — a durable queue, one supervised server per GPU, exactly-once jobs."""

__version__ = "0.1.0"
