-- name: v1
-- The jobs table: a claimed row (state 'running', owner, lease_until) is the lock.
-- seq is the rowid: submission order, and the tie-breaker after priority.
CREATE TABLE jobs (
    seq                INTEGER PRIMARY KEY,
    id                 TEXT    NOT NULL UNIQUE,
    state              TEXT    NOT NULL DEFAULT 'queued',
    priority           INTEGER NOT NULL DEFAULT 0,
    run_after          REAL    NOT NULL DEFAULT 0,
    attempt            INTEGER NOT NULL DEFAULT 0,
    owner              TEXT,
    server             TEXT,
    lease_until        REAL,
    started_at         REAL,
    cancel_requested   INTEGER NOT NULL DEFAULT 0,
    submitted_at       REAL    NOT NULL,
    finished_at        REAL,
    reason             TEXT,
    outputs            TEXT,
    last_server        TEXT,
    last_prompt_number INTEGER,
    spec_hash          TEXT    NOT NULL,
    workflow_name      TEXT    NOT NULL DEFAULT '',
    workflow           TEXT    NOT NULL,
    extra_data         TEXT    NOT NULL DEFAULT '{}',
    meta               TEXT    NOT NULL DEFAULT '{}',
    params             TEXT    NOT NULL DEFAULT '{}'
);
-- The claim walks this partial index in order and stops at the first row whose run_after has passed;
-- run_after is in the index so that filter never reads the (large) row.
CREATE INDEX jobs_ready ON jobs (priority DESC, seq, run_after) WHERE state = 'queued';
-- Expired leases are found without scanning running jobs.
CREATE INDEX jobs_lease ON jobs (lease_until) WHERE state = 'running';
-- Counts by state and the newest dead letters, without reading rows.
CREATE INDEX jobs_state ON jobs (state, finished_at);
CREATE TABLE attempts (
    job_id        TEXT    NOT NULL,
    attempt       INTEGER NOT NULL,
    owner         TEXT    NOT NULL,
    server        TEXT    NOT NULL,
    started_at    REAL    NOT NULL,
    ended_at      REAL,
    outcome       TEXT,
    reason        TEXT,
    prompt_number INTEGER
);
CREATE INDEX attempts_job ON attempts (job_id, attempt);
-- name: v2
-- The host whose runner completed a job (where its files are), and one row per supervisor sharing the queue.
ALTER TABLE jobs ADD COLUMN machine TEXT;
CREATE TABLE machines (
    host         TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    slots        TEXT    NOT NULL DEFAULT '[]',
    started_at   REAL    NOT NULL,
    heartbeat_at REAL    NOT NULL,
    PRIMARY KEY (host, pid)
);
-- name: v3
-- The workflow and the user's data move out of the row that every claim, heartbeat and complete
-- rewrites: with a 10 KB workflow in it each update rewrote its overflow pages too, and the queue wrote
-- about 90 KiB of WAL per job (a claim and a complete) instead of about 45.
CREATE TABLE job_specs (
    seq        INTEGER PRIMARY KEY,
    workflow   TEXT NOT NULL,
    extra_data TEXT NOT NULL DEFAULT '{}',
    meta       TEXT NOT NULL DEFAULT '{}',
    params     TEXT NOT NULL DEFAULT '{}'
);
INSERT INTO job_specs (seq, workflow, extra_data, meta, params)
    SELECT seq, workflow, extra_data, meta, params FROM jobs;
ALTER TABLE jobs DROP COLUMN workflow;
ALTER TABLE jobs DROP COLUMN extra_data;
ALTER TABLE jobs DROP COLUMN meta;
ALTER TABLE jobs DROP COLUMN params;
-- Expired leases are found through jobs_state (running rows are few): this index cost a page write on
-- every claim, heartbeat and complete.
DROP INDEX jobs_lease;
-- name: v4
-- What people see of each job. An attempt keeps the reason class of its outcome (``kind``: oom,
-- timeout, http_5xx, …, what metrics count) and its trace as JSON (phases, each node's time, cached
-- nodes). A running job keeps its progress (JSON, rewritten at most once a second, fenced like every
-- write after the claim). A job may name its own webhook, and a delivery is its own durable record, inserted
-- by the same transaction as the job's terminal state, so a crash can never end a job without it.
ALTER TABLE attempts ADD COLUMN kind TEXT;
ALTER TABLE attempts ADD COLUMN trace TEXT;
-- Metrics read the attempts that ended since their last look, not the whole table, on every scrape.
CREATE INDEX attempts_ended ON attempts (ended_at) WHERE ended_at IS NOT NULL;
ALTER TABLE jobs ADD COLUMN progress TEXT;
ALTER TABLE jobs ADD COLUMN callback_url TEXT;
-- next_at is set while a delivery is pending (and pushed ahead while a deliverer holds it), and NULL once it
-- was delivered (delivered_at) or given up. The partial index holds pending rows only, so finding due
-- ones and counting them stays cheap however many jobs the queue has seen.
CREATE TABLE deliveries (
    id           INTEGER PRIMARY KEY,
    job_id       TEXT    NOT NULL,
    url          TEXT    NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    created_at   REAL    NOT NULL,
    next_at      REAL,
    last_status  INTEGER,
    last_error   TEXT,
    delivered_at REAL
);
CREATE INDEX deliveries_due ON deliveries (next_at) WHERE next_at IS NOT NULL;
CREATE INDEX deliveries_job ON deliveries (job_id);
-- name: v5
-- Each distinct workflow is stored once, addressed by the sha256 of its text: a batch of one
-- 10 KB workflow with 100,000 different `set` values kept 100,000 copies (about 1.2 GB): a job now keeps
-- its own `set` (params) and extra_data, and the workflow ComfyUI receives is rebuilt from the two.
-- AUTOINCREMENT: an id is never reused after prune, so a runner's cache of parsed workflows by id
-- cannot hand out another workflow under an old id.
CREATE TABLE workflows (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    hash     TEXT    NOT NULL UNIQUE,
    workflow TEXT    NOT NULL
);
INSERT OR IGNORE INTO workflows (hash, workflow) SELECT comfysup_sha256(workflow), workflow FROM job_specs ORDER BY seq;
ALTER TABLE job_specs ADD COLUMN workflow_id INTEGER;
UPDATE job_specs SET workflow_id = (SELECT id FROM workflows WHERE hash = comfysup_sha256(job_specs.workflow));
ALTER TABLE job_specs DROP COLUMN workflow;
-- prune finds whether a workflow is still used without a scan.
CREATE INDEX job_specs_workflow ON job_specs (workflow_id);
-- The model files a job's loader nodes load (comfysup.workflows.model_key), derived at submit: a runner
-- prefers the next job whose key matches what its server ran last. Jobs still to run get theirs now.
ALTER TABLE jobs ADD COLUMN model_key TEXT;
UPDATE jobs SET model_key = (SELECT comfysup_model_key(w.workflow) FROM job_specs s JOIN workflows w
    ON w.id = s.workflow_id WHERE s.seq = jobs.seq) WHERE state IN ('queued', 'running');
-- The affinity claim seeks (model key, the head's priority) and walks seq, as jobs_ready does for all.
CREATE INDEX jobs_affinity ON jobs (model_key, priority, seq, run_after) WHERE state = 'queued' AND model_key IS NOT NULL;
-- When jobs were first passed over by an affinity claim: (priority, seq_bound, at) says every job of that
-- priority before seq_bound was passed over at `at`. Kept as a staircase (a row is added only when it
-- reaches further than every row before it), so the oldest time that covers a job is one index seek.
CREATE TABLE affinity_skips (
    priority  INTEGER NOT NULL,
    seq_bound INTEGER NOT NULL,
    at        REAL    NOT NULL,
    PRIMARY KEY (priority, seq_bound)
) WITHOUT ROWID;
-- name: v6
-- status at a million jobs: counting every job by state walked the whole of jobs_state (about
-- 120 ms at a million, most of them finished). Finished jobs are now counted as they finish, by triggers
-- that fire only on a change into or out of done, dead or cancelled (never on a claim or a heartbeat),
-- and status counts only the queued and running ranges of the index.
CREATE TABLE finished_counts (
    state TEXT    PRIMARY KEY,
    n     INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO finished_counts (state, n)
    SELECT s.state, (SELECT count(*) FROM jobs WHERE jobs.state = s.state)
    FROM (SELECT 'done' AS state UNION ALL SELECT 'dead' UNION ALL SELECT 'cancelled') AS s;
CREATE TRIGGER jobs_finished_insert AFTER INSERT ON jobs WHEN new.state IN ('done', 'dead', 'cancelled')
BEGIN
    UPDATE finished_counts SET n = n + 1 WHERE state = new.state;
END;
CREATE TRIGGER jobs_finished_into AFTER UPDATE OF state ON jobs
WHEN new.state IN ('done', 'dead', 'cancelled') AND old.state IS NOT new.state
BEGIN
    UPDATE finished_counts SET n = n + 1 WHERE state = new.state;
END;
CREATE TRIGGER jobs_finished_out_of AFTER UPDATE OF state ON jobs
WHEN old.state IN ('done', 'dead', 'cancelled') AND old.state IS NOT new.state
BEGIN
    UPDATE finished_counts SET n = n - 1 WHERE state = old.state;
END;
CREATE TRIGGER jobs_finished_delete AFTER DELETE ON jobs WHEN old.state IN ('done', 'dead', 'cancelled')
BEGIN
    UPDATE finished_counts SET n = n - 1 WHERE state = old.state;
END;
-- name: v7
-- Submit of 100,000 jobs: the per-row insert trigger cost more than the row and its four indexes
-- (evaluated for every row, 1.2 of 3.0 s of inserts), and comfysup inserts only queued jobs: a job is
-- counted when it finishes (UPDATE OF state) or leaves (DELETE), by the triggers above. Whatever inserts
-- finished rows with SQL (a tool, a test) adds them to finished_counts itself.
DROP TRIGGER IF EXISTS jobs_finished_insert;
-- name: v8
-- The node catalogues: each server's /object_info as its runner recorded it, stored once per
-- distinct text; which catalogue each server (runner name, machine) has now; and the jobs a catalogue cannot
-- run. The claim passes over a job refused by the claiming server's catalogue with one primary-key probe.
CREATE TABLE catalogues (
    id          INTEGER PRIMARY KEY,
    hash        TEXT    NOT NULL UNIQUE,
    info        TEXT    NOT NULL,
    recorded_at REAL    NOT NULL
);
CREATE TABLE server_catalogues (
    runner       TEXT    NOT NULL,
    machine      TEXT    NOT NULL,
    catalogue_id INTEGER NOT NULL,
    recorded_at  REAL    NOT NULL,
    PRIMARY KEY (runner, machine)
) WITHOUT ROWID;
CREATE TABLE job_refusals (
    seq          INTEGER NOT NULL,
    catalogue_id INTEGER NOT NULL,
    reason       TEXT    NOT NULL,
    PRIMARY KEY (seq, catalogue_id)
) WITHOUT ROWID;

-- name: v9
-- The URL of the server an attempt posted to or followed on. Server names are per machine (two
-- machines both have a gpu0): a claim taken over from a dead machine looks for the job at this URL first,
-- where the earlier run may still go on (servers managed elsewhere outlive the machine that used them).
ALTER TABLE attempts ADD COLUMN url TEXT;

-- name: v10
-- Input files: each content stored once (assets, by BLAKE3 hash; the bytes in [assets] dir), which
-- jobs need which (job_assets, by the job's seq, so a claim's server cache can keep what queued jobs need), and
-- what each server has been given (server_assets: its name there, uploads, when last used, for the LRU).
CREATE TABLE assets (
    hash      TEXT    PRIMARY KEY,
    size      INTEGER NOT NULL,
    name      TEXT    NOT NULL,
    stored_at REAL    NOT NULL
) WITHOUT ROWID;
CREATE TABLE job_assets (
    seq  INTEGER NOT NULL,
    hash TEXT    NOT NULL,
    PRIMARY KEY (seq, hash)
) WITHOUT ROWID;
CREATE INDEX job_assets_by_hash ON job_assets (hash);
CREATE TABLE asset_chunks (
    hash TEXT    NOT NULL,
    n    INTEGER NOT NULL,
    data BLOB    NOT NULL,
    PRIMARY KEY (hash, n)
) WITHOUT ROWID;
CREATE TABLE server_assets (
    server  TEXT    NOT NULL,
    hash    TEXT    NOT NULL,
    name    TEXT    NOT NULL,
    size    INTEGER NOT NULL,
    uploads INTEGER NOT NULL,
    used_at REAL    NOT NULL,
    PRIMARY KEY (server, hash)
) WITHOUT ROWID;

-- name: v11
-- The broker outbox: when [rabbitmq] url is set, the transaction that ends a job also inserts a
-- row here, so a job is never terminal without its announcement; the broker's publisher sends each pending
-- row (sent_at NULL) with publisher confirms to the done or dead exchange and only then marks it sent, so
-- every terminal job is announced at least once. The partial index holds pending rows only.
CREATE TABLE announcements (
    id         INTEGER PRIMARY KEY,
    job_id     TEXT    NOT NULL,
    state      TEXT    NOT NULL,
    created_at REAL    NOT NULL,
    sent_at    REAL
);
CREATE INDEX announcements_pending ON announcements (id) WHERE sent_at IS NULL;
CREATE INDEX announcements_job ON announcements (job_id);

-- name: v12
-- Assets uploaded through the Comfy API v2: each a record with a random id (what a client's
-- core/ASSET reference names) over a stored content (assets, by hash). A record keeps its content from prune
-- until expires_at ([api] upload_retention_hours after the upload, extended when the same content is minted
-- again), so a client can submit the job that references it; a job then keeps the content itself (job_assets).
-- idem_key: the upload's Idempotency-Key, so a retried upload answers the same record.
CREATE TABLE api_assets (
    id           TEXT PRIMARY KEY,
    hash         TEXT NOT NULL,
    file_path    TEXT NOT NULL,
    content_type TEXT NOT NULL,
    created_at   REAL NOT NULL,
    expires_at   REAL NOT NULL,
    idem_key     TEXT UNIQUE
);
CREATE INDEX api_assets_by_hash ON api_assets (hash);
CREATE INDEX api_assets_by_expiry ON api_assets (expires_at);

-- name: v13
-- Where each machine's Comfy API v2 is reached by the others ([api] public_url, or derived from a
-- non-loopback [api] listen), keyed by the machine's name in the queue: an output whose file is in another
-- machine's result store ([store] dir not shared) is streamed from that machine's API while its heartbeat is
-- fresh. pid: a stopping API removes only its own row, never a newer process's of the same host.
CREATE TABLE api_endpoints (
    host         TEXT    PRIMARY KEY,
    url          TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   REAL    NOT NULL,
    heartbeat_at REAL    NOT NULL
) WITHOUT ROWID;

-- name: v14
-- A running job that waits for its server: claimed ahead ([runner] queue_ahead) and posted behind the
-- prompt that runs there, waiting in ComfyUI's queue, since when. status, the page, /metrics, submit --wait and
-- the API show it as posted, not running; NULL once its execution starts (its execution_start was read), and
-- reset by each claim. No index: it is read only of running rows, which jobs_state finds.
ALTER TABLE jobs ADD COLUMN waiting_since REAL;

-- name: v15
-- Outputs are assets: each output of a done job has an asset UUID (the ``id`` in its entry of
-- jobs.outputs, given by the transaction that ends the job done), found here by GET /api/v2/assets/{id} and by
-- a later job's core/ASSET reference. Jobs done before v15 keep their outputs' ``<job id>.<n>`` ids (no row).
-- A job done again (a person's retry) replaces its rows; prune removes them with the job.
CREATE TABLE output_assets (
    id     TEXT PRIMARY KEY,
    job_id TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX output_assets_by_job ON output_assets (job_id);
-- The latest preview image of each running job (the API's SSE preview events): one row a job, replaced at most
-- every [runner] preview_seconds by its runner (n counts the replacements: a reader fetches the image only when
-- n moved), removed when the attempt ends.
CREATE TABLE job_previews (
    job_id       TEXT    PRIMARY KEY,
    n            INTEGER NOT NULL,
    node_id      TEXT,
    content_type TEXT    NOT NULL,
    data         BLOB    NOT NULL
) WITHOUT ROWID;

-- name: v16
-- Uploads through an outbox ([store] url): a job whose outputs are downloaded, hashed and fsynced in the
-- staging folder of the machine that ran it is 'storing' (no owner, no lease: no runner claims it, no lease
-- expires) until that machine's uploader has every object confirmed in the bucket (then 'done', as before), or
-- gives up ([store] upload_give_up_hours: 'dead'). `machine` says whose staging folder holds the files,
-- staged_in where, staged_bytes how much (the staging bound), staged_at since when (the outbox's oldest age).
ALTER TABLE jobs ADD COLUMN staged_at REAL;
ALTER TABLE jobs ADD COLUMN staged_in TEXT;
ALTER TABLE jobs ADD COLUMN staged_bytes INTEGER;
-- Each machine's uploader takes its own storing jobs, oldest first, without reading other rows.
CREATE INDEX jobs_storing ON jobs (machine, staged_at) WHERE state = 'storing';

-- name: v17
-- The operator's console finds a workflow's jobs, newest first, without walking every job (comfysup.queue.search):
-- (workflow_name, rowid) is written once, at submit (the name never changes, so a claim or an end never touches it).
CREATE INDEX jobs_workflow_name ON jobs (workflow_name);
-- What an operator asked of a slot from the console (comfysup.queue.orders): held (its runner finishes its job and
-- claims no more until put back), and a restart of its server asked at a time (done once its job is over). The
-- supervisor of that host reads its rows at each housekeeping pass.
CREATE TABLE slot_orders (
    host         TEXT    NOT NULL,
    slot         TEXT    NOT NULL,
    held_by      TEXT,
    restart_at   REAL,
    restart_by   TEXT,
    changed_at   REAL    NOT NULL,
    PRIMARY KEY (host, slot)
) WITHOUT ROWID;

-- name: v18
-- Tenants: every job belongs to one (``default`` when none is named), and the claim serves the tenant furthest
-- below its weighted share of slot time first (comfysup.queue.tenants). A tenant's row keeps its weight and
-- max_running (from the config's [tenants.NAME]) and the running total of the seconds its attempts executed
-- (the trace's run_s: the claim to the end less the wait in ComfyUI's queue behind another prompt; without a
-- trace, the claim to the end), added by the trigger below as each attempt ends, so a claim reads one row a
-- tenant, never the history.
ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
CREATE INDEX jobs_tenant_ready ON jobs (tenant, priority DESC, seq, run_after) WHERE state = 'queued';
CREATE INDEX jobs_tenant_affinity ON jobs (tenant, model_key, priority, seq, run_after)
    WHERE state = 'queued' AND model_key IS NOT NULL;
CREATE INDEX jobs_tenant_running ON jobs (tenant) WHERE state = 'running';
CREATE TABLE tenants (
    name        TEXT    PRIMARY KEY,
    weight      REAL    NOT NULL DEFAULT 1,
    max_running INTEGER,
    gpu_seconds REAL    NOT NULL DEFAULT 0,
    done        INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
-- The claim walks tenants in the order of their share used (seconds over weight).
CREATE INDEX tenants_share ON tenants (gpu_seconds / weight, name);
INSERT INTO tenants (name, done) VALUES ('default', (SELECT count(*) FROM jobs WHERE state = 'done'));
-- The same trigger counts the jobs each tenant got done (an attempt that ends done: a counter, prune does not
-- take from it): one write of the tenant's row an end. Both are kept only once a tenant other than default
-- exists: a queue without tenants writes no tenant row as jobs end (one row that every end wrote would make ends
-- wait for each other on PostgreSQL); the first other tenant's row seeds default's done (``seed_default``), and
-- its seconds start level (comfysup.queue.tenants).
CREATE TRIGGER attempts_ended_charge AFTER UPDATE OF ended_at ON attempts
WHEN old.ended_at IS NULL AND new.ended_at IS NOT NULL
    AND (EXISTS (SELECT 1 FROM tenants WHERE name < 'default') OR EXISTS (SELECT 1 FROM tenants WHERE name > 'default'))
BEGIN
    UPDATE tenants SET gpu_seconds = gpu_seconds
        + max(0.0, coalesce(json_extract(new.trace, '$.run_s'), new.ended_at - new.started_at)),
        done = done + (new.outcome IS 'done')
    WHERE name = (SELECT tenant FROM jobs WHERE id = new.job_id);
END;
-- An upload through the API is its tenant's: another tenant's token cannot read, use or delete it.
ALTER TABLE api_assets ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
-- Affinity's staircase is kept per tenant: a claim passes over the jobs of the tenant it serves only.
DROP TABLE affinity_skips;
CREATE TABLE affinity_skips (
    tenant    TEXT    NOT NULL,
    priority  INTEGER NOT NULL,
    seq_bound INTEGER NOT NULL,
    at        REAL    NOT NULL,
    PRIMARY KEY (tenant, priority, seq_bound)
) WITHOUT ROWID;

-- name: v19
-- The operator's console finds a tenant's jobs, newest first, without walking every job (comfysup.queue.search):
-- (tenant, rowid) is written once, at submit (a job's tenant never changes, so a claim or an end never touches it).
CREATE INDEX jobs_tenant ON jobs (tenant);

-- name: v20
-- A job's labels (the string-valued top-level entries of its metadata, as comfysup.queue.search reads them), one
-- row each, so the console finds the jobs with a label newest first from (key, value, seq) rather than reading
-- every job's metadata. Triggers on job_specs write them with the job, in its transaction, by every door
-- (submit, import), and delete them with it (prune). Duplicate keys in a metadata text keep the first row.
CREATE TABLE job_labels (
    key   TEXT    NOT NULL,
    value TEXT    NOT NULL,
    seq   INTEGER NOT NULL,
    PRIMARY KEY (key, value, seq)
) WITHOUT ROWID;
CREATE TRIGGER job_labels_insert AFTER INSERT ON job_specs
BEGIN
    INSERT OR IGNORE INTO job_labels (key, value, seq) SELECT key, value, new.seq FROM json_each(CASE WHEN
        json_valid(new.meta) THEN CASE WHEN json_type(new.meta) = 'object' THEN new.meta END END) WHERE type = 'text';
END;
CREATE TRIGGER job_labels_delete AFTER DELETE ON job_specs
BEGIN
    DELETE FROM job_labels WHERE (key, value, seq) IN (SELECT key, value, old.seq FROM json_each(CASE WHEN
        json_valid(old.meta) THEN CASE WHEN json_type(old.meta) = 'object' THEN old.meta END END) WHERE type = 'text');
END;
INSERT OR IGNORE INTO job_labels (key, value, seq) SELECT l.key, l.value, s.seq FROM job_specs AS s, json_each(CASE
    WHEN json_valid(s.meta) THEN CASE WHEN json_type(s.meta) = 'object' THEN s.meta END END) AS l WHERE l.type = 'text';

-- name: v21
-- A tenant's running jobs count in its share. Seconds were charged only as an attempt ended, so a tenant whose
-- jobs had all been claimed stayed first in the share order for a job's length: it took every slot that freed
-- while it had jobs queued, and once it had none every claim walked past it. Now each claim adds its attempt's expected
-- seconds (its tenant's last attempt's, at least a millisecond; kept in the attempt's row) to its tenant's
-- running_seconds, and the attempt's end takes back what its claim added as it charges what the attempt
-- executed: the claim walks tenants in the order of (gpu_seconds + running_seconds) / weight.
ALTER TABLE tenants ADD COLUMN running_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE tenants ADD COLUMN last_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN expected_seconds REAL NOT NULL DEFAULT 0;
DROP INDEX tenants_share;
CREATE INDEX tenants_share ON tenants ((gpu_seconds + running_seconds) / weight, name);
DROP TRIGGER attempts_ended_charge;
CREATE TRIGGER attempts_ended_charge AFTER UPDATE OF ended_at ON attempts
WHEN old.ended_at IS NULL AND new.ended_at IS NOT NULL
    AND (EXISTS (SELECT 1 FROM tenants WHERE name < 'default') OR EXISTS (SELECT 1 FROM tenants WHERE name > 'default'))
BEGIN
    UPDATE tenants SET gpu_seconds = gpu_seconds + e.executed, last_seconds = e.executed,
        running_seconds = max(0.0, running_seconds - new.expected_seconds),
        done = done + (new.outcome IS 'done')
    FROM (SELECT max(0.0, coalesce(json_extract(new.trace, '$.run_s'), new.ended_at - new.started_at)) AS executed) e
    WHERE name = (SELECT tenant FROM jobs WHERE id = new.job_id);
END;
