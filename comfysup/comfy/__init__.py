"""How to talk to one ComfyUI server, of either version (0.3.64 and 0.38): the lowest layer of comfysup.

It knows nothing of jobs, queues, the config or the runner, and imports nothing else of comfysup (the import
contract in pyproject.toml says so). Every answer of ComfyUI is untrusted input: its shape is checked by
``wire`` before anything reads it, and every read is bounded in time (``deadline``) and size.

- ``http``: ``ComfyClient``, the HTTP calls (POST /prompt, /history, /queue, /interrupt, /upload/image,
  /view, /object_info, /system_stats, /features, the 0.38 jobs API) on one kept-alive connection
  (``transport``, on http.client);
- ``events``: ``EventStream``, the WebSocket of one client id; ``frames``: its frames, read from one buffer;
- ``wire``: the shape of every answer and message; ``history``: reading a history entry;
- ``runs``: what a client knows its server was given; ``errors``: what went wrong, sorted for the failure
  table; ``probe``: is a server up (GET /system_stats); ``deadline``: deadlines that interrupt blocking reads.
"""

from comfysup.comfy.errors import (
    ComfyError,
    Failure,
    MalformedAnswer,
    PermanentError,
    PromptRejected,
    ServerUnavailable,
    SocketLost,
    describe_rejection,
    execution_failure,
    is_oom,
)
from comfysup.comfy.events import EventStream
from comfysup.comfy.http import CLIENT_PREFIX, ComfyClient, new_client_id
from comfysup.comfy.runs import KnownRuns, QueueEntry

__all__ = ["CLIENT_PREFIX", "ComfyClient", "ComfyError", "EventStream", "Failure", "KnownRuns", "MalformedAnswer",
           "PermanentError", "PromptRejected", "QueueEntry", "ServerUnavailable", "SocketLost", "describe_rejection",
           "execution_failure", "is_oom", "new_client_id"]
