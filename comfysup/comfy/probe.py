"""Is a ComfyUI server up? GET /system_stats, answered as a person reads it (the supervisor's readiness check
and `comfysup health`)."""

from __future__ import annotations


def readiness(url: str, timeout_seconds: float = 1.0) -> str:
    """Readiness: ComfyUI answers GET /system_stats only once it has loaded and bound its port. Empty when it
    answered, else what went wrong as a person reads it: a refused connection is ``connection refused``,
    never a timeout (requests' ConnectTimeout is also a ConnectionError, so it is told apart first).
    requests is imported here, when first asked (by the supervisor): `comfysup work` and its runners never
    ask, and never load requests."""
    import requests

    try:
        response = requests.get(f"{url}/system_stats", timeout=timeout_seconds)
    except requests.ConnectTimeout:
        return f"GET /system_stats: no connection within {timeout_seconds:g} s"
    except requests.ConnectionError as exc:
        text = str(exc)
        if "refused" in text.lower():
            return "GET /system_stats: connection refused"
        if "timed out" in text.lower():  # a read timeout surfaces as a ConnectionError from urllib3's retry
            return f"GET /system_stats: timed out after {timeout_seconds:g} s"
        return f"GET /system_stats: cannot connect ({text[:200]})"
    except requests.Timeout:
        return f"GET /system_stats: timed out after {timeout_seconds:g} s"
    except requests.RequestException as exc:
        return f"GET /system_stats: {str(exc)[:200]}"
    return "" if response.status_code == 200 else f"GET /system_stats: HTTP {response.status_code}"


def answers(url: str, timeout_seconds: float = 1.0) -> bool:
    return not readiness(url, timeout_seconds)
