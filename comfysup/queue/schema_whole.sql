-- The schema that every step of schema.sql makes, at the version this block is named for: a new SQLite queue is
-- made from it in one step (comfysup.queue.db.SQLDb.schema_steps); an older queue is brought forward by the steps.
-- Written from the steps, never by hand, after a step is added or changed:
--     COMFYSUP_WRITE_WHOLE_SCHEMA=1 .venv/bin/python -m pytest tests/integration/test_queue_sqlite.py -k made_whole
-- name: v21
CREATE TABLE affinity_skips (
    tenant    TEXT    NOT NULL,
    priority  INTEGER NOT NULL,
    seq_bound INTEGER NOT NULL,
    at        REAL    NOT NULL,
    PRIMARY KEY (tenant, priority, seq_bound)
) WITHOUT ROWID;
CREATE TABLE announcements (
    id         INTEGER PRIMARY KEY,
    job_id     TEXT    NOT NULL,
    state      TEXT    NOT NULL,
    created_at REAL    NOT NULL,
    sent_at    REAL
);
CREATE TABLE api_assets (
    id           TEXT PRIMARY KEY,
    hash         TEXT NOT NULL,
    file_path    TEXT NOT NULL,
    content_type TEXT NOT NULL,
    created_at   REAL NOT NULL,
    expires_at   REAL NOT NULL,
    idem_key     TEXT UNIQUE
, tenant TEXT NOT NULL DEFAULT 'default');
CREATE TABLE api_endpoints (
    host         TEXT    PRIMARY KEY,
    url          TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   REAL    NOT NULL,
    heartbeat_at REAL    NOT NULL
) WITHOUT ROWID;
CREATE TABLE asset_chunks (
    hash TEXT    NOT NULL,
    n    INTEGER NOT NULL,
    data BLOB    NOT NULL,
    PRIMARY KEY (hash, n)
) WITHOUT ROWID;
CREATE TABLE assets (
    hash      TEXT    PRIMARY KEY,
    size      INTEGER NOT NULL,
    name      TEXT    NOT NULL,
    stored_at REAL    NOT NULL
) WITHOUT ROWID;
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
, kind TEXT, trace TEXT, url TEXT, expected_seconds REAL NOT NULL DEFAULT 0);
CREATE TABLE catalogues (
    id          INTEGER PRIMARY KEY,
    hash        TEXT    NOT NULL UNIQUE,
    info        TEXT    NOT NULL,
    recorded_at REAL    NOT NULL
);
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
CREATE TABLE finished_counts (
    state TEXT    PRIMARY KEY,
    n     INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO "finished_counts" VALUES('cancelled',0);
INSERT INTO "finished_counts" VALUES('dead',0);
INSERT INTO "finished_counts" VALUES('done',0);
CREATE TABLE job_assets (
    seq  INTEGER NOT NULL,
    hash TEXT    NOT NULL,
    PRIMARY KEY (seq, hash)
) WITHOUT ROWID;
CREATE TABLE job_labels (
    key   TEXT    NOT NULL,
    value TEXT    NOT NULL,
    seq   INTEGER NOT NULL,
    PRIMARY KEY (key, value, seq)
) WITHOUT ROWID;
CREATE TABLE job_previews (
    job_id       TEXT    PRIMARY KEY,
    n            INTEGER NOT NULL,
    node_id      TEXT,
    content_type TEXT    NOT NULL,
    data         BLOB    NOT NULL
) WITHOUT ROWID;
CREATE TABLE job_refusals (
    seq          INTEGER NOT NULL,
    catalogue_id INTEGER NOT NULL,
    reason       TEXT    NOT NULL,
    PRIMARY KEY (seq, catalogue_id)
) WITHOUT ROWID;
CREATE TABLE job_specs (
    seq        INTEGER PRIMARY KEY,
    extra_data TEXT NOT NULL DEFAULT '{}',
    meta       TEXT NOT NULL DEFAULT '{}',
    params     TEXT NOT NULL DEFAULT '{}'
, workflow_id INTEGER);
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
    machine TEXT, progress TEXT, callback_url TEXT, model_key TEXT, waiting_since REAL, staged_at REAL, staged_in TEXT, staged_bytes INTEGER, tenant TEXT NOT NULL DEFAULT 'default');
CREATE TABLE machines (
    host         TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    slots        TEXT    NOT NULL DEFAULT '[]',
    started_at   REAL    NOT NULL,
    heartbeat_at REAL    NOT NULL,
    PRIMARY KEY (host, pid)
);
CREATE TABLE output_assets (
    id     TEXT PRIMARY KEY,
    job_id TEXT NOT NULL
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
CREATE TABLE server_catalogues (
    runner       TEXT    NOT NULL,
    machine      TEXT    NOT NULL,
    catalogue_id INTEGER NOT NULL,
    recorded_at  REAL    NOT NULL,
    PRIMARY KEY (runner, machine)
) WITHOUT ROWID;
CREATE TABLE slot_orders (
    host         TEXT    NOT NULL,
    slot         TEXT    NOT NULL,
    held_by      TEXT,
    restart_at   REAL,
    restart_by   TEXT,
    changed_at   REAL    NOT NULL,
    PRIMARY KEY (host, slot)
) WITHOUT ROWID;
CREATE TABLE tenants (
    name        TEXT    PRIMARY KEY,
    weight      REAL    NOT NULL DEFAULT 1,
    max_running INTEGER,
    gpu_seconds REAL    NOT NULL DEFAULT 0,
    done        INTEGER NOT NULL DEFAULT 0
, running_seconds REAL NOT NULL DEFAULT 0, last_seconds REAL NOT NULL DEFAULT 0) WITHOUT ROWID;
INSERT INTO "tenants" VALUES('default',1.0,NULL,0.0,0,0.0,0.0);
CREATE TABLE workflows (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    hash     TEXT    NOT NULL UNIQUE,
    workflow TEXT    NOT NULL
);
CREATE INDEX jobs_ready ON jobs (priority DESC, seq, run_after) WHERE state = 'queued';
CREATE INDEX jobs_state ON jobs (state, finished_at);
CREATE INDEX attempts_job ON attempts (job_id, attempt);
CREATE INDEX attempts_ended ON attempts (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX deliveries_due ON deliveries (next_at) WHERE next_at IS NOT NULL;
CREATE INDEX deliveries_job ON deliveries (job_id);
CREATE INDEX job_specs_workflow ON job_specs (workflow_id);
CREATE INDEX jobs_affinity ON jobs (model_key, priority, seq, run_after) WHERE state = 'queued' AND model_key IS NOT NULL;
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
CREATE INDEX job_assets_by_hash ON job_assets (hash);
CREATE INDEX announcements_pending ON announcements (id) WHERE sent_at IS NULL;
CREATE INDEX announcements_job ON announcements (job_id);
CREATE INDEX api_assets_by_hash ON api_assets (hash);
CREATE INDEX api_assets_by_expiry ON api_assets (expires_at);
CREATE INDEX output_assets_by_job ON output_assets (job_id);
CREATE INDEX jobs_storing ON jobs (machine, staged_at) WHERE state = 'storing';
CREATE INDEX jobs_workflow_name ON jobs (workflow_name);
CREATE INDEX jobs_tenant_ready ON jobs (tenant, priority DESC, seq, run_after) WHERE state = 'queued';
CREATE INDEX jobs_tenant_affinity ON jobs (tenant, model_key, priority, seq, run_after)
    WHERE state = 'queued' AND model_key IS NOT NULL;
CREATE INDEX jobs_tenant_running ON jobs (tenant) WHERE state = 'running';
CREATE INDEX jobs_tenant ON jobs (tenant);
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
CREATE INDEX tenants_share ON tenants ((gpu_seconds + running_seconds) / weight, name);
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
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('workflows',0);
