"""What an attempt's trace keeps for the API from ComfyUI's messages, watched on the socket or read from
a /history entry (an adopted or polled run): the nodes served from the cache (``outputs_reused``) and a node's
``execution_error`` (the job's ``error``: node, class, exception, traceback)."""

from __future__ import annotations

from comfysup.runner.trace import MAX_ERROR_CHARS, Trace

WORKFLOW = {"1": {"class_type": "EmptyImage"}, "2": {"class_type": "ImageToMask"}, "3": {"class_type": "Save"}}
ERROR = {"prompt_id": "p", "node_id": "2", "node_type": "ImageToMask", "exception_type": "IndexError",
         "exception_message": "index 3 is out of bounds\n", "traceback": ["  File \"a.py\", line 1\n", "    x[3]\n"]}


def test_an_execution_error_on_the_socket_is_kept_whole() -> None:
    trace = Trace.start(WORKFLOW, 1.0)
    trace.on_event("execution_error", ERROR, 2.0)
    assert trace.as_dict()["error"] == {"node_id": "2", "class_type": "ImageToMask", "exception_type": "IndexError",
                                        "message": "index 3 is out of bounds\n",
                                        "traceback": "  File \"a.py\", line 1\n    x[3]\n"}


def test_a_history_entry_gives_the_cached_nodes_and_the_error_once() -> None:
    trace = Trace.start(WORKFLOW, 1.0)
    trace.on_event("execution_cached", {"nodes": ["1"]}, 2.0)  # seen on the socket, then read again below
    entry = {"status": {"status_str": "error", "messages": [
        ["execution_start", {"prompt_id": "p"}], ["execution_cached", {"nodes": ["1"], "prompt_id": "p"}],
        ["execution_error", {**ERROR, "node_type": None, "traceback": "not a list"}], "garbage", ["x"]]}}
    trace.from_history(entry, 3.0)
    stored = trace.as_dict()
    assert stored["cached"] == ["1"]
    assert stored["error"]["class_type"] == "ImageToMask" and stored["error"]["traceback"] is None


def test_a_run_without_failure_or_cache_keeps_neither_and_a_huge_text_is_bounded() -> None:
    trace = Trace.start(WORKFLOW, 1.0)
    trace.from_history({"status": {"status_str": "success", "messages": []}}, 2.0)
    assert "error" not in trace.as_dict() and trace.as_dict()["cached"] == []
    trace.on_event("execution_error", {**ERROR, "exception_message": "x" * (MAX_ERROR_CHARS * 2)}, 3.0)
    assert len(trace.as_dict()["error"]["message"]) == MAX_ERROR_CHARS
