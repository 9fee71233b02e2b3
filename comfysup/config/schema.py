"""The settings' schema: every section of config.toml as a frozen record (comfysup.config.sections), every key with
its type, its default,
its checks and a docstring saying what it does. This is the only place a default or a key's check is written;
comfysup.config.loader reads the file, the environment and the flags into these classes, and
comfysup.config.checks asks each key's checks (``setting``) and each section's ``RULES``, the checks of keys that
must agree with other keys (comfysup.config.rules). The annotations are evaluated here (no ``from __future__
import annotations``): the loader reads each key's type from its ``Key`` as it is.
"""

from pathlib import Path
from typing import ClassVar

from comfysup.config import addresses, rules
from comfysup.config.checks import (
    Rule,
    at_least,
    between,
    each,
    gpus_problem,
    greater_than_zero,
    hex_sha256,
    positive,
    seconds_greater_than_zero,
    zero_or_more,
)
from comfysup.config.sections import Section, setting


class QueueConfig(Section):
    """[queue]: the SQLite file (``path``) or PostgreSQL database (``url``) that holds the jobs."""

    path: str = "var/queue.db"
    url: str = setting("", addresses.postgresql_url)
    busy_timeout_seconds: float = setting(30.0, greater_than_zero)
    checkpoint_seconds: float = setting(30.0, greater_than_zero)

    RULES: ClassVar[tuple[Rule, ...]] = (Rule("path", rules.path_or_url),)


class StoreConfig(Section):
    """[store]: where the output files of done jobs are kept (a folder or a bucket) and how large they may be."""

    dir: str = "var/results"
    max_file_mb: int = setting(2048, at_least(1))
    """The largest output file accepted from ComfyUI. 2 GiB holds minutes of high-bitrate video; no image
    comes near it, and a server that streams more is misbehaving (the job is dead-lettered)."""
    max_job_mb: int = setting(8192, at_least(1))
    """All of one job's outputs together."""
    max_files_per_job: int = setting(2000, at_least(1))
    """Output files of one job (a video saved as frames is hundreds); a history naming more is malformed."""
    # -- object storage: outputs in an S3-compatible bucket ---------------------------------------------------
    url: str = setting("", addresses.bucket_url)
    """``s3://bucket/prefix``: each output is uploaded to ``<prefix>/<job id>/<name>`` (``dir`` is then only the
    staging folder each file is downloaded to, hashed in and removed from once the bucket confirmed it), and every
    door hands out a presigned URL of it. Any S3-compatible service: AWS, R2, GCS's XML API, MinIO, SeaweedFS,
    Ceph. Empty: outputs stay in ``dir`` on this machine's disk."""
    endpoint_url: str = setting("", addresses.store_endpoint_url)
    """The service's address (``http://127.0.0.1:8333`` for a local SeaweedFS or MinIO, R2's account endpoint);
    empty: AWS's own endpoint for ``region``."""
    region: str = ""
    """The bucket's region (``us-east-1``); empty: from the environment or the AWS profile."""
    profile: str = ""
    """An AWS profile of ~/.aws/config to take credentials and region from; empty: the default chain
    (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws, an instance role)."""
    access_key_id: str = ""
    """Credentials given in the config (or $COMFYSUP_STORE_ACCESS_KEY_ID); empty: the default chain. Masked in
    every message."""
    secret_access_key: str = ""
    """The secret of ``access_key_id`` (better: $COMFYSUP_STORE_SECRET_ACCESS_KEY). Never shown or logged."""
    url_ttl_seconds: int = setting(3600, addresses.url_ttl)
    """How long the presigned URLs the doors hand out stay valid (``url_expires_at``; S3 allows up to 7 days);
    0: no presigned URL, each door gives the stable ``s3://bucket/key`` location only."""
    multipart_threshold_mb: int = setting(64, addresses.s3_part_size)
    """Outputs larger than this are uploaded in parts of this size (boto3's transfer manager, parts in parallel,
    each part's SHA-256 checked by the service); a smaller one in one PUT whose SHA-256 the service checks."""
    # -- the upload outbox: staged outputs wait in ``dir`` for the bucket ---------------------------------------
    staging_max_gb: float = setting(50.0, zero_or_more("(no bound)"))
    """With ``url``: what the jobs waiting for the bucket (``storing``) may hold in this machine's staging folder.
    When it is reached the runners claim no new job (``comfysup status`` and /ready say why) until uploads free
    room; nothing staged is ever dropped. 0: no bound."""
    upload_give_up_hours: float = setting(0.0, zero_or_more("(never)"))
    """With ``url``: a job whose outputs could not be uploaded for this long is dead-lettered (its staged files are
    removed); 0: the uploader keeps trying for as long as it takes (an outage spends no attempt)."""
    upload_base_delay_seconds: float = setting(1.0, greater_than_zero)
    """The uploader's backoff after a failed upload: full jitter, ``random(0, min(max, base × 2^(n-1)))``."""
    upload_max_delay_seconds: float = setting(60.0, greater_than_zero)
    """The longest wait between the uploader's tries while the bucket does not answer."""

    RULES: ClassVar[tuple[Rule, ...]] = (Rule("upload_base_delay_seconds", rules.upload_delays),)


class AssetsConfig(Section):
    """[assets]: where the input files that jobs name are kept, once per content, and how large they may be."""

    dir: str = ""
    """Where input files are stored, once per content. Empty: next to the queue (``<queue>.assets/``) on SQLite,
    and in the database itself (chunked) on PostgreSQL, so that machines share nothing but the database; set
    it on PostgreSQL to a folder every machine mounts."""
    max_file_mb: int = setting(100, at_least(1))
    """The largest input file submit accepts: ComfyUI's own upload limit (/features max_upload_size) is 100 MiB
    for the whole request, so a larger file could never reach a server."""
    max_job_mb: int = setting(512, at_least(1))
    """All input files of one job together."""
    server_cache_mb: int = setting(2048, at_least(1))
    """Inputs kept in each server's input folder (least recently used removed first, never one that a queued or
    running job needs). Applies to servers that comfysup run launched, whose folders the runner can reach."""
    input_roots: tuple[str, ...] = ()
    """Folders besides the jobs file's own that `comfysup submit` may read {"file": ...} inputs from (relative
    paths are relative to this config file). An input names a file relative to one of them: never an absolute
    path, never .., never through a symlink, only a regular file."""
    # -- object storage ---------------------------------------------------------------------------------------
    url: str = setting("", addresses.bucket_url)
    """``s3://bucket/prefix``: input files are stored there once per content (``<prefix>/<hash>``), so machines
    on one PostgreSQL queue share them through the bucket rather than the database. The service, region and
    credentials are [store]'s (endpoint_url, region, profile, access keys). Empty: ``dir`` or the database."""


class InputsConfig(Section):
    """Input files fetched at submit from elsewhere: ``{"url": "https://…"}`` and ``{"s3": "s3://bucket/key"}``
    (comfysup.jobs.fetch). Each is read once into the asset store, bounded by ``[assets] max_file_mb``."""

    allow_private: bool = False
    """Allow input URLs on loopback, link-local and private addresses and cloud metadata names (also after a
    redirect); off, a job cannot make comfysup read from inside its own network (comfysup.destinations)."""
    timeout_seconds: float = setting(30.0, seconds_greater_than_zero)
    """The longest wait to connect, and for the next bytes of an answer; then the input fails."""
    max_seconds: float = setting(600.0, seconds_greater_than_zero)
    """The longest a whole download may take (a server that sends a byte now and then cannot hold submit), and all
    of one job's together (a message or a workflow of many silent URLs cannot hold the consumer or the API)."""
    max_redirects: int = setting(5, between(0, 20, "must be between 0 and 20"))
    """Redirects followed, each one's destination checked like the URL itself; 0: none."""
    s3_endpoint_url: str = setting("", addresses.s3_endpoint_url)
    """The S3 service of s3:// inputs (https://… of MinIO, SeaweedFS, R2, …); empty: AWS's own. Credentials come
    from the usual places: the AWS_* environment variables, the AWS profile (AWS_PROFILE, ~/.aws), an instance
    role."""
    s3_region: str = ""
    """The region of s3:// inputs; empty: the AWS profile's or AWS_DEFAULT_REGION."""
    s3_buckets: tuple[str, ...] = setting((), each(addresses.bucket_name))
    """The buckets an s3:// input may name. Empty: any bucket the credentials can read, from ``comfysup submit``
    (its user's own credentials), and none through RabbitMQ or the API, whose submitters would read with this
    machine's credentials."""


class ComfyUIConfig(Section):
    """[comfyui]: the ComfyUI servers that ``comfysup run`` launches, one per GPU, and their model files."""

    main: str = "ComfyUI/main.py"
    python: str = ""
    listen: str = setting("127.0.0.1", addresses.ip_address)
    private_network: bool = False
    base_port: int = setting(8188, between(1, 65535, "expected a TCP port between 1 and 65535"))
    base_directory: str = "var/comfyui"
    extra_args: tuple[str, ...] = ()
    gpus: str | tuple[int, ...] = setting("auto", gpus_problem)
    startup_seconds: float = setting(120.0, greater_than_zero)
    extra_model_paths_config: str = ""
    models_manifest: str = ""
    """A models.toml of ``[[models]]`` entries (the same as in this file), for a manifest kept apart from the
    settings; its entries join this file's. Empty: only this file's ``[[models]]``."""
    models_cache: str = ""
    """Where ``comfysup models pull`` keeps the model files, once per content (``sha256/<hex>``): a folder several
    configs or machines may share (an NFS mount); each launched server sees the manifest's files through a folder
    of links to it. Empty: ``model-cache`` beside the queue file (the state folder)."""
    warmup: str = ""
    """An API-format workflow (a path, relative to the config file) that each launched server runs after every
    start or restart before its slot takes a job: the first job then does not pay for loading models and
    compiling kernels. A warm-up that fails is a failed start (the restart policy counts it); empty: none. Use
    PreviewImage rather than SaveImage in it, or its files stay in the server's output folder."""
    warmup_timeout_seconds: float = setting(600.0, greater_than_zero)
    """How long a warm-up may run (after ``startup_seconds`` for the server to answer) before its start failed."""
    idle_vram_free_mb: int = setting(0, zero_or_more("(off)"))
    """With NVML: VRAM (MiB) a server may still hold on its GPU while it runs no job; above it comfysup asks the
    server to POST /free, and restarts it when that did not bring it below. 0: not watched."""

    RULES: ClassVar[tuple[Rule, ...]] = (Rule("listen", rules.comfyui_on_loopback),)


class ServerConfig(Section):
    """One ``[[servers]]`` entry: a ComfyUI server that comfysup does not launch, by name and URL."""

    name: str
    url: str
    output_dir: str = ""
    """The server's output folder when it runs on this machine (optional): each job's files are then read from
    it instead of downloaded through /view, a run whose history died with the server is adopted from it, and
    the job's folder there is removed once its files are stored, as for the servers ``comfysup run`` launches.
    Its input folder is taken to be ``input`` beside it, as in a ComfyUI installation. A relative path is
    relative to the config file's folder, as every path of the config is."""


class TenantConfig(Section):
    """One ``[tenants.NAME]`` table: a customer, team or app that shares the fleet (comfysup.queue.tenants). A job
    belongs to the tenant whose token submitted it through the API, or that its broker message names; else to
    ``default`` (which a ``[tenants.default]`` table may weigh and bound too)."""

    name: str = ""
    """The tenant's name: the table's (``[tenants.studio-a]``), stored on each of its jobs."""
    weight: float = setting(1.0, greater_than_zero)
    """Its share of slot time against the other tenants' weights while they have work: weights 3 and 1 give three
    quarters and one quarter of the seconds the slots run jobs; a tenant alone gets every slot."""
    max_running: int = setting(0, zero_or_more("(no cap)"))
    """Its jobs running at once over the whole fleet (every machine of the queue); 0: no cap."""
    max_queued: int = setting(0, zero_or_more("(no bound)"))
    """Its jobs waiting in the queue: a submit that would pass it is refused whole (``comfysup submit`` exits 4,
    the API answers 429 with Retry-After, the broker's message goes to the invalid queue); 0: no bound."""
    token_sha256: str = setting("", hex_sha256)
    """The SHA-256 (hex) of this tenant's API token: a request that carries that token acts as the tenant and sees
    its own jobs, assets and outputs only. Never the token itself: ``printf %s TOKEN | sha256sum``."""


class ModelFile(Section):
    """One ``[[models]]`` entry: a file every server comfysup launches sees in a ComfyUI model folder."""

    folder: str
    """The ComfyUI model folder (``checkpoints``, ``loras``, ...), as extra_model_paths.yaml names it."""
    name: str
    """The file's name in that folder as the loaders list it (``sd15/v1-5.safetensors`` may hold a sub-folder)."""
    url: str
    """Where it comes from: ``https://…`` (or ``http://``), ``s3://bucket/key``, or an absolute local path (a
    relative one was made absolute against the file it was written in)."""
    sha256: str
    """The content's SHA-256, 64 lowercase hex digits: checked before any server may see the file."""
    where: str = ""
    """Where the entry was written (``config.toml: [[models]] #2``), for messages."""


class RunnerConfig(Section):
    """[runner]: how each server's runner claims, retries and follows its jobs."""

    attempts: int = setting(4, at_least(1))
    base_delay_seconds: float = setting(2.0, greater_than_zero)
    max_delay_seconds: float = setting(60.0, greater_than_zero)
    jitter: bool = True
    timeout_seconds: float = setting(600.0, greater_than_zero)
    poll_seconds: float = setting(1.0, greater_than_zero)
    lease_seconds: float = setting(60.0, greater_than_zero)
    heartbeat_seconds: float = setting(5.0, greater_than_zero)
    max_queue: int = setting(1, at_least(1, "(a runner claims a job only while its server holds fewer than "
                                            "max_queue prompts of other clients)"))
    grace_seconds: float = setting(60.0, zero_or_more())
    http_timeout_seconds: float = setting(30.0, greater_than_zero)
    leave_queue_seconds: float = setting(60.0, greater_than_zero)
    """How long an interrupted prompt may take to leave its server's queue; after that it is stuck (a custom
    node that never checks the interrupt flag): comfysup run restarts that server, comfysup work takes it
    out of service until its queue is empty."""
    affinity_max_wait_seconds: float = setting(300.0, zero_or_more())
    """Model affinity's fairness bound: a runner prefers jobs of the model its server ran last, but no job
    waits longer than this beyond what strict priority order would have made it wait; 0: strict order."""
    queue_ahead: bool = True
    """Keep one more job waiting in the server's own queue behind the running prompt (claimed, leased, posted
    with its own id), so ComfyUI starts it the moment the running one ends: the GPU does not idle between two
    prompts for the client's claim, POST and socket work. Its timeout starts when it starts executing; a cancel,
    a graceful stop or a prompt stuck ahead of it takes it out of the server's queue (released without counting
    an attempt, as when the server dies before it started); none is queued while another runner of the machine
    waits for work. False: a runner posts only when its server is free (one job per runner at a time)."""
    preview_seconds: float = setting(1.0, zero_or_more())
    """How often a running job's latest preview image (the frames ComfyUI sends while a sampler steps) is written
    to the queue, for the Comfy API v2's SSE ``preview`` events: at most one write this often per runner, of at
    most 512 KiB, the job's previous one replaced (the queue keeps only the latest, removed when the job ends);
    0: previews are not kept (no queue writes for them, no ``preview`` events)."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("heartbeat_seconds", rules.heartbeat_within_lease),
        Rule("base_delay_seconds", rules.runner_delays),
    )


class SupervisorConfig(Section):
    """[supervisor]: how ``comfysup run`` watches, recycles and restarts its runners and servers."""

    runner_timeout_seconds: float = setting(45.0, greater_than_zero)
    recycle_after_jobs: int = setting(0, zero_or_more("(off)"))
    recycle_rss_mb: int = setting(0, zero_or_more("(off)"))
    max_quick_failures: int = setting(5, at_least(1))
    quick_failure_seconds: float = setting(30.0, greater_than_zero)
    restart_max_delay_seconds: float = setting(60.0, greater_than_zero)
    log_max_mb: int = setting(50, at_least(1))


class MetricsConfig(Section):
    """[metrics]: the /metrics endpoint and the status page."""

    listen: str = setting("127.0.0.1:9188", addresses.metrics_listen)
    """HOST:PORT of /metrics and the status page; port 0 takes any free port; empty: no endpoint."""
    refresh_seconds: float = setting(2.0, greater_than_zero)
    """How often the status page reloads itself."""
    max_workflow_labels: int = setting(50, at_least(1))
    """Distinct workflow label values in the metrics (the workflow file's name or meta.kind); past this a new
    one is counted as "other", so freely chosen kinds cannot grow the metrics without bound."""
    max_connections: int = setting(32, at_least(1))
    """Connections the endpoint holds at once (being answered by one of its few threads, or waiting for one);
    one more is answered 503 and closed at once, so stalled clients cannot make it start a thread each."""
    header_timeout_seconds: float = setting(10.0, seconds_greater_than_zero)
    """The longest a client may take to send a whole request (its line and headers); then it is closed."""
    body_timeout_seconds: float = setting(60.0, seconds_greater_than_zero)
    """The longest a client may take to accept the next bytes of an answer (a large file from /files) before
    the endpoint gives up on it and closes the connection."""

    RULES: ClassVar[tuple[Rule, ...]] = (Rule("listen", rules.metrics_on_loopback),)


class WebhooksConfig(Section):
    """[webhooks]: where and how each terminal job's record is POSTed."""

    url: str = setting("", addresses.webhook_url)
    """Where every terminal job's record is POSTed when its line has no callback_url; empty: nowhere."""
    secret: str = ""
    """The HMAC-SHA256 key of the X-Comfysup-Signature header; empty: deliveries are not signed."""
    attempts: int = setting(8, at_least(1))
    base_delay_seconds: float = setting(5.0, greater_than_zero)
    max_delay_seconds: float = setting(600.0, greater_than_zero)
    timeout_seconds: float = setting(10.0, greater_than_zero)
    allow_private: bool = False
    """Allow webhooks to loopback, link-local and private addresses and to cloud metadata names; off, a job
    cannot make comfysup POST inside its own network (comfysup.destinations)."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("url", rules.webhook_destination),
        Rule("base_delay_seconds", rules.webhook_delays),
    )


class ApiConfig(Section):
    """[api]: the Comfy API v2 that ``comfysup run`` and ``comfysup api`` serve."""

    listen: str = setting("127.0.0.1:9189", addresses.api_listen)
    """HOST:PORT of the Comfy API v2 (/api/v2/jobs, /api/v2/assets) that ``comfysup run`` serves and ``comfysup
    api`` serves alone; port 0 takes any free port; empty: ``comfysup run`` serves none. The port is
    comfy-api-proxy's own default, so an SDK configured for the proxy finds comfysup in its place."""
    token: str = ""
    """The bearer token every request must carry (``Authorization: Bearer <token>``); empty: none is asked for,
    and then only a loopback address may be listened on. Never logged or shown."""
    max_queued: int = setting(0, zero_or_more("(no bound)"))
    """Jobs not yet ended above which POST /api/v2/jobs answers 429 queue_full with Retry-After; 0: no bound."""
    max_event_streams: int = setting(1000, at_least(1, "(GET /api/v2/jobs/{id}/events; polling GET "
                                                    "/api/v2/jobs/{id} needs no stream)"))
    """Event streams (GET /api/v2/jobs/{id}/events) open at once; one more gets 429 too_many_streams with
    Retry-After. Streams are fed by one watcher of the queue, not by ComfyUI, so each costs a socket and a few
    KiB: the bound is on file descriptors and memory (the API raises its open-file limit to fit it)."""
    max_upload_mb: int = setting(100, at_least(1))
    """The largest body the API accepts (an asset upload; a job's JSON is bounded by the workflow limit)."""
    upload_retention_hours: float = setting(168.0, positive("must be more than 0 (an upload must outlive the "
                                                            "moment its job is submitted)"))
    """How long an asset uploaded through the API (POST /api/v2/assets, /from-hash) is kept for the jobs that will
    reference it (the contract's ``expires_at``); ``comfysup prune`` removes it after that unless a job still in
    the queue uses its content. Minting the same content under the same name again (``from-hash``) extends that
    record; a new upload is a new record with its own deadline."""
    allowed_origins: tuple[str, ...] = setting((), each(addresses.allowed_origin))
    """Browser origins (``https://app.example``) allowed besides the API's own; any other Origin is refused, so
    a web page cannot make a visitor's browser submit jobs."""
    public_url: str = setting("", addresses.public_url)
    """Where the other machines of a shared (PostgreSQL) queue reach this API (``http(s)://host:port``, no path),
    advertised in the queue so that an output whose file is in this machine's result store can be streamed to a
    client of another machine's API. Empty: ``http://<listen>`` when ``listen`` is not a loopback address (a
    wildcard such as 0.0.0.0 becomes this machine's host name), else nothing is advertised. Set it when a TLS
    proxy or another name stands in front of the API."""
    allowed_hosts: tuple[str, ...] = setting((), each(addresses.allowed_host))
    """Names (``api.example`` or ``api.example:8443``) a request's Host header may carry besides the API's own
    address, ``public_url``'s and, on a loopback listen, localhost's; any other Host is refused 421, so a web page
    whose name is made to resolve to this machine (DNS rebinding) cannot call the API."""
    max_connections: int = 2000
    """Connections the API holds at once (event streams included: at least ``max_event_streams`` + 1); one more
    is answered 503 and closed at once."""
    header_timeout_seconds: float = setting(10.0, seconds_greater_than_zero)
    """The longest a client may take to send a request's line and headers (and to send the next request on a
    kept-alive connection); then the connection is closed."""
    body_timeout_seconds: float = setting(60.0, seconds_greater_than_zero)
    """The longest wait for the next bytes of a request's body (an upload) or for a client to take the next bytes
    of an answer; then the request ends (408) and the connection is closed."""
    ready_max_queue_per_slot: float = setting(0.0, zero_or_more("(no bound)"))
    """GET /ready (the API's and the status server's) answers 503 while the jobs waiting in the queue per ready
    (warm) slot exceed this, so a load balancer sends new work elsewhere; 0: no bound (ready once a slot is)."""
    path_roots: tuple[str, ...] = setting((), each(addresses.path_root))
    """Folders of this machine whose files POST /api/v2/assets/from-path may register as assets (relative paths
    are relative to this config file); a file is read only below one of them, through no symlink, only if it is a
    regular file. Empty: from-path is refused (403)."""
    models_dir: str = ""
    """ComfyUI's model folder (what its extra_model_paths names) where an upload to models/<folder>/<name>.safetensors
    is placed (safetensors only, never replacing a file, through no symlink). Empty: such uploads are refused
    (403)."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("listen", rules.api_token_beyond_loopback),
        Rule("max_connections", rules.connections_beyond_streams),
    )


class RabbitMQConfig(Section):
    """[rabbitmq]: the broker that ``comfysup consume`` takes jobs from and publishes their records to."""

    url: str = setting("", addresses.amqp_url)
    """amqp://user:password@host:port/vhost of the broker; empty: no consumer, no broker results."""
    queue: str = "renders"
    """Where jobs arrive, one jobs.jsonl line per message; declared a durable quorum queue when missing."""
    prefetch: int = setting(50, at_least(1))
    """Unacknowledged messages the consumer holds at once (basic_qos): each batch is one insert."""
    delivery_limit: int = setting(5, between(0, 1000, "must be between 0 and 1000 (redeliveries of a message that "
                                                      "stops the consumer before it goes to invalid_queue)"))
    """A message delivered this many times more without an ack (it stopped or crashed the consumer each
    time) is dead-lettered to ``invalid_queue`` by the broker (x-delivery-limit of the quorum queue)."""
    workflows_dir: str = "workflows"
    """A message's workflow path is read below this folder (relative to the config file); no .. or /."""
    inputs_dir: str = ""
    """A message's {"file": ...} inputs are read below this folder (relative to the config file; never an absolute
    path, .., a symlink or anything but a regular file); empty: messages may not name files (anyone who can publish
    to the queue could otherwise read this machine's files into the asset store)."""
    done_exchange: str = "comfysup.done"
    """Where a done job's record is published (a durable fanout exchange when comfysup declares it)."""
    dead_exchange: str = "comfysup.dead"
    """Where a dead or cancelled job's record is published."""
    invalid_queue: str = "renders.invalid"
    """Where a message that fails validation goes, with its reason in the x-comfysup-reason header and body."""
    reconnect_max_delay_seconds: float = setting(30.0, greater_than_zero)
    """Reconnection waits random(0, min(this, 0.5 × 2^(n-1))) after the n-th failure in a row."""


class Config(Section):
    """Every section of config.toml, with the file it came from."""

    queue: QueueConfig = QueueConfig()
    store: StoreConfig = StoreConfig()
    assets: AssetsConfig = AssetsConfig()
    inputs: InputsConfig = InputsConfig()
    comfyui: ComfyUIConfig = ComfyUIConfig()
    servers: tuple[ServerConfig, ...] = ()
    models: tuple[ModelFile, ...] = ()
    """The model manifest: ``[[models]]`` of the file and of ``[comfyui] models_manifest`` (comfysup.models)."""
    runner: RunnerConfig = RunnerConfig()
    supervisor: SupervisorConfig = SupervisorConfig()
    metrics: MetricsConfig = MetricsConfig()
    webhooks: WebhooksConfig = WebhooksConfig()
    api: ApiConfig = ApiConfig()
    rabbitmq: RabbitMQConfig = RabbitMQConfig()
    tenants: tuple[TenantConfig, ...] = ()
    """The ``[tenants.NAME]`` tables, by name."""
    source: str = "<defaults>"
    """Where the file values came from, for messages."""
    root: str = "."
    """Directory that relative paths in the file are resolved against (the file's own directory)."""

    def resolve(self, path: str) -> Path:
        """A path from the config, relative to the config file's directory."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.root) / p

    def server_output_dirs(self) -> dict[str, Path]:
        """The output folders of the [[servers]] entries that name one (``output_dir``), by server name."""
        return {s.name: self.resolve(s.output_dir) for s in self.servers if s.output_dir}


SECTIONS: dict[str, type] = {
    "queue": QueueConfig,
    "store": StoreConfig,
    "assets": AssetsConfig,
    "inputs": InputsConfig,
    "comfyui": ComfyUIConfig,
    "runner": RunnerConfig,
    "supervisor": SupervisorConfig,
    "metrics": MetricsConfig,
    "webhooks": WebhooksConfig,
    "api": ApiConfig,
    "rabbitmq": RabbitMQConfig,
}
