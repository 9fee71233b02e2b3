"""The checker's look at jobs that brought an input image: each output of a done one must be its
input inverted, pixel for pixel, by the rule the integration tests hold fake_comfy to (tests/input_images.py):
not another job's input, not a stale upload under a reused name, not a cached result of other bytes. The
input is the user's own file, kept by the harness: evidence independent of the queue's asset store."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from input_images import expected_inverse

from fake_comfy.uploads import NotAnImage, decode_png

if TYPE_CHECKING:
    from chaos.checker import Evidence, Report, _Job


def check_inverted(evidence: Evidence, jobs: dict[str, _Job], report: Report) -> None:
    """Each done job with an input image: every recorded output is its input inverted, pixel for pixel, by
    the rule the integration tests hold fake_comfy to (tests/input_images.py)."""
    report.figures["jobs_with_inputs"] = len(evidence.inputs)
    checked = 0
    for job_id, source in evidence.inputs.items():
        job = jobs.get(job_id)
        if job is None or job.state != "done":
            continue
        _w, _h, _c, original = decode_png(source.read_bytes())
        want = bytes(expected_inverse(v) for v in original)
        for out in job.outputs:
            path = evidence.store / job_id / out["name"]
            try:  # an output in a bucket is read from the objects the run left there
                data = ((evidence.objects or {})[out["path"]] if str(out.get("path", "")).startswith("s3://")
                        else path.read_bytes())
                _w, _h, _c, got = decode_png(data)
            except (OSError, KeyError, NotAnImage, ValueError, zlib.error) as exc:
                report.wrong_outputs.append(f"{job_id}: {out['name']} unreadable: {exc}")
                continue
            if got != want:
                wrong = sum(a != b for a, b in zip(got, want, strict=False)) + abs(len(got) - len(want))
                report.wrong_outputs.append(f"{job_id}: {out['name']}: {wrong} of {len(want)} samples are not "
                                            f"the inverse of {source.name}")
        checked += 1
    report.figures["outputs_checked_against_inputs"] = checked
