"""``comfysup init``: write a commented config.toml for this machine.

Values are written with tomli-w, one key at a time, so each can carry its comment; the comments are the
reference for every key (the example config.toml at the top of the repository is made by this).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import tomli_w

from comfysup.config import SECTIONS, Config, build_config
from comfysup.errors import UsageError
from comfysup.gpus import discover
from comfysup.records import values as values_of

DOCS: dict[str, dict[str, str]] = {
    "queue": {
        "": "The durable job queue.",
        "path": "SQLite file of the queue (relative paths are relative to this file). Keep it on a local disk.",
        "url": "postgresql://user@host/db to share one queue between machines; empty: use path.",
        "busy_timeout_seconds": "How long a write waits for another process's lock before it fails.",
        "checkpoint_seconds": "How often the write-ahead log is checkpointed, so it stays small.",
    },
    "store": {
        "": "The result store: <dir>/<job id>/<files>.",
        "dir": "Where finished jobs' files are kept.",
        "max_file_mb": "Largest output file accepted from ComfyUI, in MiB.",
        "max_job_mb": "All of one job's output files together, in MiB.",
        "max_files_per_job": "Output files of one job; a history naming more is treated as malformed.",
        # object storage
        "url": "s3://bucket/prefix: outputs go to <prefix>/<job id>/<name> in that bucket (dir is then only the "
               "staging folder); \"\": they stay in dir.",
        "endpoint_url": "The S3 service's address (http://127.0.0.1:8333 for SeaweedFS or MinIO); \"\": AWS.",
        "region": "The bucket's region; \"\": from the environment or the AWS profile.",
        "profile": "AWS profile to take credentials from; \"\": the default chain (AWS_* variables, ~/.aws, a role).",
        "access_key_id": "Access key (better: $COMFYSUP_STORE_ACCESS_KEY_ID); \"\": the default chain.",
        "secret_access_key": "Its secret (better: $COMFYSUP_STORE_SECRET_ACCESS_KEY). Never shown or logged.",
        "url_ttl_seconds": "How long the presigned URLs every door hands out stay valid; 0: the s3:// location only.",
        "multipart_threshold_mb": "Outputs larger than this are uploaded in parts of this size, in MiB.",
        "staging_max_gb": "With url: what jobs waiting for the bucket may hold in the staging folder, in GiB; "
                          "when reached, no new job is claimed until uploads free room. 0: no bound.",
        "upload_give_up_hours": "With url: dead-letter a job whose outputs could not be uploaded for this many "
                                "hours; 0: wait out any outage.",
        "upload_base_delay_seconds": "The uploader's first wait after a failed upload (full jitter), in seconds.",
        "upload_max_delay_seconds": "The uploader's longest wait while the bucket does not answer, in seconds.",
    },
    "assets": {
        "": "Input files of jobs ({\"file\": ...} in set), stored once per content (BLAKE3).",
        "dir": "Where they are kept; empty: next to the queue (SQLite) or in the database (PostgreSQL).",
        "max_file_mb": "Largest input file submit accepts, in MiB (ComfyUI's upload limit is 100).",
        "max_job_mb": "All input files of one job together, in MiB.",
        "server_cache_mb": "Inputs kept in each launched server's input folder, in MiB (least recently used go).",
        "input_roots": "Folders besides the jobs file's own that submit may read {\"file\": ...} inputs from.",
        "url": "s3://bucket/prefix: inputs are stored there ([store]'s service and credentials), shared by every "
               "machine of the queue; \"\": dir or the database.",
    },
    "inputs": {
        "": "Input files fetched at submit: {\"url\": \"https://...\"} and {\"s3\": \"s3://bucket/key\"}, bounded by "
            "[assets] max_file_mb.",
        "allow_private": "Allow input URLs on loopback, link-local and private addresses and metadata names "
                         "(also after a redirect).",
        "timeout_seconds": "Longest wait to connect, and for the next bytes of an answer.",
        "max_seconds": "Longest a whole download may take, and all of one job's downloads together.",
        "max_redirects": "Redirects followed, each destination checked like the URL; 0: none.",
        "s3_endpoint_url": "S3 service of s3:// inputs (MinIO, SeaweedFS, R2, ...); empty: AWS. Credentials: "
                           "AWS_* variables, the AWS profile, an instance role.",
        "s3_region": "Region of s3:// inputs; empty: the profile's or AWS_DEFAULT_REGION.",
        "s3_buckets": "Buckets an s3:// input may name; empty: any from comfysup submit, none through RabbitMQ "
                      "or the API.",
    },
    "comfyui": {
        "": "The ComfyUI servers that comfysup launches, one per GPU.",
        "main": "ComfyUI's main.py (fake_comfy/main.py runs the bundled fake, for trying comfysup out).",
        "python": "The Python that runs ComfyUI (its virtual environment); empty: the one running comfysup.",
        "listen": "Address the servers listen on. ComfyUI has no authentication: keep it on loopback.",
        "private_network": "Allow a non-loopback listen address (only on a network where every host is "
                           "trusted).",
        "base_port": "Port of the first server; slot i listens on base_port + i.",
        "base_directory": "Each server gets <base_directory>/<slot> as its --base-directory.",
        "extra_args": "More arguments for every ComfyUI server, e.g. [\"--highvram\"].",
        "gpus": "\"auto\" (every GPU NVML finds, honouring CUDA_VISIBLE_DEVICES), a list of CUDA indices "
                "like [0, 2], \"cpu:N\" for N servers with --cpu, or \"none\" to launch no server and supervise "
                "only the [[servers]] (runners, metrics, status page, webhooks).",
        "startup_seconds": "How long a server may take to answer /system_stats after it starts.",
        "extra_model_paths_config": "A shared extra_model_paths.yaml given to every server; empty: none.",
        "models_manifest": "A models.toml of [[models]] entries (as below), joined to this file's; empty: none.",
        "models_cache": "Where model files are kept once per content (may be shared by machines); empty: "
                        "model-cache beside the queue file.",
        "warmup": "An API-format workflow each launched server runs after every (re)start before its slot takes a "
                  "job (a failing one is a failed start); empty: none.",
        "warmup_timeout_seconds": "How long a warm-up may run before the start counts as failed.",
        "idle_vram_free_mb": "With NVML: VRAM (MiB) a server may hold while it runs no job; above it comfysup "
                             "asks it to POST /free, then restarts it if that did not help. 0: not watched.",
    },
    "runner": {
        "": "How each job is run: attempts, backoff, timeouts, leases.",
        "attempts": "Attempts per job before it is dead-lettered (transient failures only are retried).",
        "base_delay_seconds": "Backoff before retry n is random(0, min(max, base * 2^(n-1))) (full jitter).",
        "max_delay_seconds": "Upper bound of the backoff.",
        "jitter": "false: wait the whole backoff instead of a random part of it (for tests).",
        "timeout_seconds": "A job still running after this is interrupted and counted as a failed attempt.",
        "poll_seconds": "How often /history is read while a job runs (the WebSocket is not trusted alone).",
        "lease_seconds": "A claim not renewed for this long is handed to another runner.",
        "heartbeat_seconds": "How often a running job's lease is renewed; shorter than lease_seconds.",
        "max_queue": "A runner claims only while its server holds fewer prompts of other clients than this.",
        "grace_seconds": "On SIGTERM, how long running jobs may finish before they are interrupted.",
        "http_timeout_seconds": "Timeout of every HTTP call to ComfyUI.",
        "leave_queue_seconds": "An interrupted prompt still in its server's queue after this is stuck: comfysup "
                               "run restarts that server, comfysup work stops using it until its queue empties.",
        "affinity_max_wait_seconds": "A runner prefers jobs that load the models its server ran last (no reload), "
                                     "but no job waits longer than this beyond strict priority order; 0: strict "
                                     "order. Priority always comes first.",
        "preview_seconds": "How often a running job's latest preview image is written to the queue (the API's SSE "
                           "preview events; only the latest is kept); 0: previews are not kept.",
        "queue_ahead": "Keep one more job waiting in the server's queue behind the running prompt, so the GPU "
                       "never waits for the client between two prompts (never while another server idles); "
                       "false: post only to a free server.",
    },
    "supervisor": {
        "": "comfysup run: keeping servers and runners alive.",
        "runner_timeout_seconds": "A runner silent this long is killed and its job released; shorter than "
                                  "[runner] lease_seconds minus heartbeat_seconds, longer than "
                                  "http_timeout_seconds.",
        "recycle_after_jobs": "Restart a server after this many jobs (0: never).",
        "recycle_rss_mb": "Restart a server whose process tree uses more memory than this, in MiB (0: never).",
        "max_quick_failures": "A server that fails this many times in a row, each soon after starting, is "
                              "marked failed.",
        "quick_failure_seconds": "A server exit within this many seconds of its start counts as a quick "
                                 "failure.",
        "restart_max_delay_seconds": "Upper bound of the growing delay between server restarts.",
        "log_max_mb": "Size of each server's log file before it is rotated, in MiB.",
    },
    "metrics": {
        "": "comfysup run: Prometheus /metrics and a read-only status page at /.",
        "max_workflow_labels": "Distinct workflow label values in the metrics; past this a new one counts as "
                               "\"other\".",
        "listen": "HOST:PORT of the endpoint, loopback unless [comfyui] private_network; port 0 takes any free "
                  "port; \"\" serves nothing.",
        "refresh_seconds": "How often the status page reloads itself.",
        "max_connections": "Connections held at once (served by a few threads or waiting); one more gets 503.",
        "header_timeout_seconds": "The longest a client may take to send its request line and headers.",
        "body_timeout_seconds": "The longest a client may take to accept the next bytes of an answer.",
    },
    "webhooks": {
        "": "When a job ends (done, dead or cancelled), its record is POSTed to its callback_url or to url.",
        "url": "Where every job's record goes when its line has no callback_url; \"\": nowhere.",
        "secret": "HMAC-SHA256 key of the X-Comfysup-Signature header (see the README); \"\": unsigned.",
        "attempts": "Tries per delivery before it is given up (visible in comfysup show and in metrics).",
        "base_delay_seconds": "Backoff before try n is random(0, min(max, base * 2^(n-1))).",
        "max_delay_seconds": "Upper bound of the backoff.",
        "timeout_seconds": "Timeout of each POST.",
        "allow_private": "Allow webhooks to this machine, link-local and private addresses and cloud metadata "
                         "names (checked at submit and on the connected socket).",
    },
    "api": {
        "": "The Comfy API v2 (/api/v2/jobs, /api/v2/assets): code written for Comfy Cloud with comfy-sdk "
            "submits here. Served by comfysup run, or alone by comfysup api.",
        "listen": "HOST:PORT of the API; a non-loopback address needs a token; port 0 takes any free port; "
                  "\"\" serves none.",
        "token": "Bearer token every request must carry; \"\": none (loopback only). Never logged.",
        "max_queued": "Jobs not yet ended above which a submit gets 429 queue_full and Retry-After (0: no bound).",
        "max_event_streams": "Event streams (/api/v2/jobs/{id}/events) open at once; one more gets 429 "
                             "too_many_streams. Each costs a socket and a few KiB, not a ComfyUI connection.",
        "max_upload_mb": "The largest request body (an asset upload), in MiB.",
        "upload_retention_hours": "Hours an uploaded asset is kept for the jobs that will reference it (its "
                                  "expires_at); prune removes it after that unless a job in the queue uses it.",
        "allowed_origins": "Browser origins allowed besides the API's own (e.g. [\"https://app.example\"]); "
                           "requests from any other web page are refused.",
        "public_url": "Where the other machines sharing the queue reach this API (http(s)://host:port), so they "
                      "can stream outputs held in this machine's result store; \"\": http://<listen> when listen "
                      "is not loopback, else none.",
        "allowed_hosts": "Host header values allowed besides the API's address, public_url's and localhost's "
                         "(e.g. [\"api.example\", \"api.example:8443\"]); any other Host gets 421 (DNS rebinding).",
        "max_connections": "Connections held at once, event streams included (more than max_event_streams); one "
                           "more gets 503.",
        "header_timeout_seconds": "The longest a client may take to send a request's line and headers.",
        "body_timeout_seconds": "The longest wait for the next bytes of a request's body or for the client to "
                                "take the next bytes of an answer (then 408 and the connection is closed).",
        "ready_max_queue_per_slot": "GET /ready answers 503 while the queued jobs per ready (warm) slot exceed "
                                    "this (a load balancer sends work elsewhere); 0: no bound.",
        "path_roots": "Folders whose files POST /api/v2/assets/from-path may register (e.g. [\"/srv/datasets\"]); "
                      "[]: from-path is refused.",
        "models_dir": "ComfyUI's model folder, where uploads to models/<folder>/<name>.safetensors are placed; "
                      "\"\": such uploads are refused.",
    },
    "rabbitmq": {
        "": "The RabbitMQ front door: jobs from a queue (comfysup run, or comfysup consume), results to exchanges.",
        "url": "amqp://user:password@host:5672/ of the broker; \"\": no consumer and no broker results.",
        "queue": "Where jobs arrive, one jobs.jsonl line a message; declared a durable quorum queue if missing.",
        "prefetch": "Unacknowledged messages held at once; each batch is validated and inserted in one go.",
        "delivery_limit": "Redeliveries of a message that stops the consumer each time before the broker moves it "
                          "to invalid_queue.",
        "workflows_dir": "A message's workflow path is read below this folder (no .. and no absolute path).",
        "inputs_dir": "A message's {\"file\": ...} inputs are read below this folder; \"\": messages name no files.",
        "done_exchange": "Where a done job's record goes (message_id = job id, persistent, confirmed).",
        "dead_exchange": "Where a dead or cancelled job's record goes.",
        "invalid_queue": "Where an invalid message goes, with its reason in x-comfysup-reason and the body.",
        "reconnect_max_delay_seconds": "Upper bound of the backoff between reconnections to the broker.",
    },
}


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("init", parents=[common], help="write a commented config.toml for this machine",
                       description="Write a commented config.toml. GPUs come from NVML; on a machine "
                                   "without an NVIDIA driver the config uses gpus = \"cpu:1\" and says so.")
    p.add_argument("-o", "--output", default="config.toml", help="where to write (default: ./config.toml; "
                   "- for standard output)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.add_argument("--comfyui", metavar="MAIN_PY", help="path of ComfyUI's main.py")
    p.add_argument("--cpu", type=int, metavar="N", help="N servers on the CPU, whatever NVML finds")
    p.set_defaults(func=run)


def render(config: Config, header: str = "") -> str:
    """config.toml text: every key of every section, each under its comment."""
    out = [f"# {line}".rstrip() for line in header.splitlines()] + ([""] if header else [])
    for section in SECTIONS:
        out.append(f"# {DOCS[section]['']}")
        out.append(f"[{section}]")
        values = values_of(getattr(config, section))
        for key, value in values.items():
            out.append(f"# {DOCS[section][key]}")
            out.append(tomli_w.dumps({key: _plain(value)}).strip())
        out.append("")
    out += ["# Servers that run elsewhere and are used as they are (not launched), e.g.:",
            "# [[servers]]", '# name = "remote0"', '# url = "http://127.0.0.1:8288"',
            "# One on this machine may name its output folder: each job's files are then read from it, not "
            "through /view.", '# output_dir = "/opt/ComfyUI/output"', *MODELS_EXAMPLE]
    for server in config.servers:
        entry = {"name": server.name, "url": server.url}
        if server.output_dir:
            entry["output_dir"] = server.output_dir
        out += ["[[servers]]", tomli_w.dumps(entry).strip()]
    return "\n".join(out) + "\n"


MODELS_EXAMPLE = (
    "", "# The model manifest: files every launched server sees (comfysup models pull; comfysup run pulls what is "
    "missing),", "# each fetched once into [comfyui] models_cache and checked against its sha256 first, e.g.:",
    "# [[models]]", '# folder = "checkpoints"                   # a ComfyUI model folder: loras, vae, controlnet, ...',
    '# name = "v1-5-pruned-emaonly.safetensors"', '# url = "https://huggingface.co/stable-diffusion-v1-5/'
    'stable-diffusion-v1-5/resolve/main/v1-5-pruned-emaonly.safetensors"  # or s3://bucket/key, or a path',
    '# sha256 = "6ce0161689b3853acaa03779ec93eafe75a02f4ced659bee03f50797806fa2fa"')


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def run(args: argparse.Namespace) -> int:
    comfyui: dict[str, Any] = {}
    if args.comfyui:
        comfyui["main"] = args.comfyui
    if args.cpu is not None:
        if args.cpu < 1:
            raise UsageError("--cpu N needs N of 1 or more")
        comfyui["gpus"] = f"cpu:{args.cpu}"
        note = f"{args.cpu} CPU server(s), as --cpu asked"
    else:
        found = discover()
        if found.gpus:
            comfyui["gpus"] = [g.index for g in found.gpus]
            names = ", ".join(f"{g.index}: {g.name} ({g.memory_total_mb} MiB)" for g in found.gpus)
            note = f"{found.note}: {names}"
        else:
            comfyui["gpus"] = "cpu:1"
            note = f"{found.note}; using one CPU server (gpus = \"cpu:1\")"
    config = build_config({"comfyui": comfyui}, env={})
    text = render(config, header=f"comfysup configuration, written by comfysup init.\nGPUs: {note}")
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists; use --force to overwrite it, or -o to write elsewhere")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    print(f"wrote {path} ({note})")
    return 0
