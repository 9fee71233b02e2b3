-- The PostgreSQL schema, one named step per version (``-- name: vN``), applied in order on open under an
-- advisory lock. Times are UTC epoch seconds as double precision, like the SQLite backend, so a value
-- given as ``now=`` in a test comes back exactly; JSON is kept as text, byte for byte as submitted.

-- name: v1
CREATE TABLE jobs (
    seq                bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                 text    NOT NULL UNIQUE,
    state              text    NOT NULL DEFAULT 'queued',
    priority           bigint  NOT NULL DEFAULT 0,
    run_after          double precision NOT NULL DEFAULT 0,
    attempt            integer NOT NULL DEFAULT 0,
    owner              text,
    server             text,
    lease_until        double precision,
    started_at         double precision,
    cancel_requested   boolean NOT NULL DEFAULT false,
    submitted_at       double precision NOT NULL,
    finished_at        double precision,
    reason             text,
    outputs            text,
    machine            text,
    last_server        text,
    last_prompt_number bigint,
    spec_hash          text    NOT NULL,
    workflow_name      text    NOT NULL DEFAULT '',
    workflow           text    NOT NULL,
    extra_data         text    NOT NULL DEFAULT '{}',
    meta               text    NOT NULL DEFAULT '{}',
    params             text    NOT NULL DEFAULT '{}'
);
-- The claim walks this partial index in order and stops at the first unlocked row whose run_after has
-- passed; run_after is included so that filter never reads the (large) row.
CREATE INDEX jobs_ready ON jobs (priority DESC, seq) INCLUDE (run_after) WHERE state = 'queued';
-- Expired leases are found without scanning running jobs.
CREATE INDEX jobs_lease ON jobs (lease_until) WHERE state = 'running';
-- Counts by state and the newest dead letters.
CREATE INDEX jobs_state ON jobs (state, finished_at);
CREATE TABLE attempts (
    n             bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id        text    NOT NULL,
    attempt       integer NOT NULL,
    owner         text    NOT NULL,
    server        text    NOT NULL,
    started_at    double precision NOT NULL,
    ended_at      double precision,
    outcome       text,
    reason        text,
    prompt_number bigint
);
CREATE INDEX attempts_job ON attempts (job_id, attempt);
-- One row per supervisor (host, pid): what ``comfysup status`` shows of every machine.
CREATE TABLE machines (
    host         text    NOT NULL,
    pid          integer NOT NULL,
    slots        text    NOT NULL DEFAULT '[]',
    started_at   double precision NOT NULL,
    heartbeat_at double precision NOT NULL,
    PRIMARY KEY (host, pid)
);

-- name: v2
-- What people see of each job, as in schema.sql's v4: the reason class and trace of each
-- attempt, a running job's progress, a per-job webhook, and webhook deliveries as their own durable
-- record, inserted by the same transaction as the job's terminal state.
ALTER TABLE attempts ADD COLUMN kind text;
ALTER TABLE attempts ADD COLUMN trace text;
-- Metrics read the attempts that ended since their last look, not the whole table, on every scrape.
CREATE INDEX attempts_ended ON attempts (ended_at) WHERE ended_at IS NOT NULL;
ALTER TABLE jobs ADD COLUMN progress text;
ALTER TABLE jobs ADD COLUMN callback_url text;
-- next_at is set while a delivery is pending (and pushed ahead while a deliverer holds it), and NULL once it
-- was delivered (delivered_at) or given up.
CREATE TABLE deliveries (
    id           bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       text    NOT NULL,
    url          text    NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    created_at   double precision NOT NULL,
    next_at      double precision,
    last_status  integer,
    last_error   text,
    delivered_at double precision
);
CREATE INDEX deliveries_due ON deliveries (next_at) WHERE next_at IS NOT NULL;
CREATE INDEX deliveries_job ON deliveries (job_id);

-- name: v3
-- As in schema.sql's v5: each distinct workflow is stored once, addressed by the sha256 of its
-- text, and a job keeps its own `set` (params) and extra_data, from which the workflow ComfyUI receives is
-- rebuilt. A job's model key (the files its loader nodes load) lets a runner prefer jobs its server
-- already has in memory. Identity ids are never reused, so a runner may cache parsed workflows by id.
CREATE TABLE workflows (
    id       bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    hash     text    NOT NULL UNIQUE,
    workflow text    NOT NULL
);
INSERT INTO workflows (hash, workflow)
    SELECT DISTINCT ON (h) h, workflow
    FROM (SELECT encode(sha256(convert_to(workflow, 'UTF8')), 'hex') AS h, workflow, seq FROM jobs) AS t
    ORDER BY h, seq;
ALTER TABLE jobs ADD COLUMN workflow_id bigint;
UPDATE jobs SET workflow_id = w.id FROM workflows w
    WHERE w.hash = encode(sha256(convert_to(jobs.workflow, 'UTF8')), 'hex');
ALTER TABLE jobs ALTER COLUMN workflow_id SET NOT NULL;
ALTER TABLE jobs DROP COLUMN workflow;
-- prune finds whether a workflow is still used without a scan, and the foreign key stops it from deleting
-- one that a concurrent submit has just referenced.
CREATE INDEX jobs_workflow ON jobs (workflow_id);
ALTER TABLE jobs ADD CONSTRAINT jobs_workflow_fk FOREIGN KEY (workflow_id) REFERENCES workflows (id);
-- Filled for jobs still to run by the migration's Python step (SQL cannot read loader nodes by itself).
ALTER TABLE jobs ADD COLUMN model_key text;
CREATE INDEX jobs_affinity ON jobs (model_key, priority, seq) INCLUDE (run_after)
    WHERE state = 'queued' AND model_key IS NOT NULL;
-- When jobs were first passed over by an affinity claim (see schema.sql's v5).
CREATE TABLE affinity_skips (
    priority  bigint           NOT NULL,
    seq_bound bigint           NOT NULL,
    at        double precision NOT NULL,
    PRIMARY KEY (priority, seq_bound)
);

-- name: v4
-- The node catalogues, as schema.sql's v8: /object_info stored once per distinct text, the one each
-- server has now, and the jobs a catalogue cannot run (the claim's NOT EXISTS on its primary key).
CREATE TABLE catalogues (
    id          bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    hash        text    NOT NULL UNIQUE,
    info        text    NOT NULL,
    recorded_at double precision NOT NULL
);
CREATE TABLE server_catalogues (
    runner       text    NOT NULL,
    machine      text    NOT NULL,
    catalogue_id bigint  NOT NULL,
    recorded_at  double precision NOT NULL,
    PRIMARY KEY (runner, machine)
);
CREATE TABLE job_refusals (
    seq          bigint  NOT NULL,
    catalogue_id bigint  NOT NULL,
    reason       text    NOT NULL,
    PRIMARY KEY (seq, catalogue_id)
);

-- name: v5
-- The URL of the server an attempt posted to or followed on (see schema.sql's v9).
ALTER TABLE attempts ADD COLUMN url text;

-- name: v6
-- Input files (see schema.sql's v10). Without [assets] dir the bytes live here, in chunks of a few
-- MiB, so machines that share the database share their inputs and nothing else.
CREATE TABLE assets (
    hash      text             PRIMARY KEY,
    size      bigint           NOT NULL,
    name      text             NOT NULL,
    stored_at double precision NOT NULL
);
CREATE TABLE job_assets (
    seq  bigint NOT NULL,
    hash text   NOT NULL,
    PRIMARY KEY (seq, hash)
);
CREATE INDEX job_assets_by_hash ON job_assets (hash);
CREATE TABLE asset_chunks (
    hash text    NOT NULL,
    n    integer NOT NULL,
    data bytea   NOT NULL,
    PRIMARY KEY (hash, n)
);
CREATE TABLE server_assets (
    server  text             NOT NULL,
    hash    text             NOT NULL,
    name    text             NOT NULL,
    size    bigint           NOT NULL,
    uploads integer          NOT NULL,
    used_at double precision NOT NULL,
    PRIMARY KEY (server, hash)
);

-- name: v7
-- The broker outbox (see schema.sql's v11).
CREATE TABLE announcements (
    id         bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     text    NOT NULL,
    state      text    NOT NULL,
    created_at double precision NOT NULL,
    sent_at    double precision
);
CREATE INDEX announcements_pending ON announcements (id) WHERE sent_at IS NULL;
CREATE INDEX announcements_job ON announcements (job_id);

-- name: v8
-- Assets uploaded through the Comfy API v2 (see schema.sql's v12).
CREATE TABLE api_assets (
    id           text             PRIMARY KEY,
    hash         text             NOT NULL,
    file_path    text             NOT NULL,
    content_type text             NOT NULL,
    created_at   double precision NOT NULL,
    expires_at   double precision NOT NULL,
    idem_key     text             UNIQUE
);
CREATE INDEX api_assets_by_hash ON api_assets (hash);
CREATE INDEX api_assets_by_expiry ON api_assets (expires_at);

-- name: v9
-- Where each machine's Comfy API v2 is reached by the others (see schema.sql's v13).
CREATE TABLE api_endpoints (
    host         text             PRIMARY KEY,
    url          text             NOT NULL,
    pid          integer          NOT NULL,
    started_at   double precision NOT NULL,
    heartbeat_at double precision NOT NULL
);

-- name: v10
-- A running job that waits for its server, posted behind the prompt that runs there (see schema.sql's
-- v14).
ALTER TABLE jobs ADD COLUMN waiting_since double precision;

-- name: v11
-- Each output's asset UUID, found by GET /api/v2/assets/{id} and core/ASSET (see schema.sql's v15).
CREATE TABLE output_assets (
    id     text PRIMARY KEY,
    job_id text NOT NULL
);
CREATE INDEX output_assets_by_job ON output_assets (job_id);
-- The latest preview image of each running job (see schema.sql's v15).
CREATE TABLE job_previews (
    job_id       text    PRIMARY KEY,
    n            integer NOT NULL,
    node_id      text,
    content_type text    NOT NULL,
    data         bytea   NOT NULL
);

-- name: v12
-- Uploads through an outbox: the storing state and where its staged files wait (see schema.sql's v16).
ALTER TABLE jobs ADD COLUMN staged_at double precision;
ALTER TABLE jobs ADD COLUMN staged_in text;
ALTER TABLE jobs ADD COLUMN staged_bytes bigint;
CREATE INDEX jobs_storing ON jobs (machine, staged_at) WHERE state = 'storing';

-- name: v13
-- The operator's console (comfysup.queue.search): a workflow's jobs newest first, and one state's jobs by end
-- then submission. jobs_state gains seq (SQLite's index has the rowid in it already), so it is replaced, not
-- joined by another: a claim or an end still writes the same number of index entries.
CREATE INDEX jobs_workflow_name ON jobs (workflow_name, seq);
CREATE INDEX jobs_state_seq ON jobs (state, finished_at, seq);
DROP INDEX jobs_state;
-- What an operator asked of a slot from the console (see schema.sql's v17).
CREATE TABLE slot_orders (
    host         text             NOT NULL,
    slot         text             NOT NULL,
    held_by      text,
    restart_at   double precision,
    restart_by   text,
    changed_at   double precision NOT NULL,
    PRIMARY KEY (host, slot)
);

-- name: v14
-- Tenants (see schema.sql's v18): a tenant on every job, a row per tenant with its weight, max_running and the
-- running total of the seconds its attempts executed and of its jobs done (added by one trigger as each attempt
-- ends), and affinity's staircase kept per tenant.
ALTER TABLE jobs ADD COLUMN tenant text NOT NULL DEFAULT 'default';
CREATE INDEX jobs_tenant_ready ON jobs (tenant, priority DESC, seq) INCLUDE (run_after) WHERE state = 'queued';
CREATE INDEX jobs_tenant_affinity ON jobs (tenant, model_key, priority, seq) INCLUDE (run_after)
    WHERE state = 'queued' AND model_key IS NOT NULL;
CREATE INDEX jobs_tenant_running ON jobs (tenant) WHERE state = 'running';
CREATE TABLE tenants (
    name        text             PRIMARY KEY,
    weight      double precision NOT NULL DEFAULT 1,
    max_running integer,
    gpu_seconds double precision NOT NULL DEFAULT 0,
    done        bigint           NOT NULL DEFAULT 0
);
CREATE INDEX tenants_share ON tenants ((gpu_seconds / weight), name);
INSERT INTO tenants (name, done) VALUES ('default', (SELECT count(*) FROM jobs WHERE state = 'done'));
CREATE FUNCTION comfysup_charge_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ran json;
BEGIN
    -- no tenants: no row that every end would write (see schema.sql's v18); two probes of the primary key, not a
    -- scan that would step over every dead row version of the table
    IF NOT EXISTS (SELECT 1 FROM tenants WHERE name < 'default') AND NOT EXISTS (SELECT 1 FROM tenants
            WHERE name > 'default') THEN
        RETURN NULL;
    END IF;
    ran := CASE WHEN NEW.trace IS NOT NULL THEN NEW.trace::json -> 'run_s' END;
    UPDATE tenants SET gpu_seconds = gpu_seconds + greatest(0.0, CASE WHEN json_typeof(ran) = 'number'
        THEN (ran #>> '{}')::float8 ELSE NEW.ended_at - NEW.started_at END),
        done = done + (NEW.outcome IS NOT DISTINCT FROM 'done')::int
    WHERE name = (SELECT tenant FROM jobs WHERE id = NEW.job_id);
    RETURN NULL;
END $$;
CREATE TRIGGER attempts_ended_charge AFTER UPDATE OF ended_at ON attempts FOR EACH ROW
    WHEN (OLD.ended_at IS NULL AND NEW.ended_at IS NOT NULL) EXECUTE FUNCTION comfysup_charge_tenant();
ALTER TABLE api_assets ADD COLUMN tenant text NOT NULL DEFAULT 'default';
DROP TABLE affinity_skips;
CREATE TABLE affinity_skips (
    tenant    text             NOT NULL,
    priority  bigint           NOT NULL,
    seq_bound bigint           NOT NULL,
    at        double precision NOT NULL,
    PRIMARY KEY (tenant, priority, seq_bound)
);

-- name: v15
-- The operator's console: a tenant's jobs newest first (see schema.sql's v19).
CREATE INDEX jobs_tenant ON jobs (tenant, seq);

-- name: v16
-- A job's labels, one row each, written and deleted with the job by a trigger (see schema.sql's v20).
CREATE TABLE job_labels (
    key   text   NOT NULL,
    value text   NOT NULL,
    seq   bigint NOT NULL,
    PRIMARY KEY (key, value, seq)
);
CREATE OR REPLACE FUNCTION comfysup_labels(meta text) RETURNS TABLE (key text, value text) LANGUAGE sql IMMUTABLE AS $$
    SELECT e.key, e.value #>> '{}' FROM jsonb_each(CASE WHEN jsonb_typeof(meta::jsonb) = 'object'
        THEN meta::jsonb ELSE '{}'::jsonb END) AS e WHERE jsonb_typeof(e.value) = 'string'
$$;
CREATE OR REPLACE FUNCTION comfysup_job_labels() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO job_labels (key, value, seq) SELECT l.key, l.value, NEW.seq FROM comfysup_labels(NEW.meta) AS l;
    ELSE
        DELETE FROM job_labels AS j WHERE (j.key, j.value, j.seq) IN
            (SELECT l.key, l.value, OLD.seq FROM comfysup_labels(OLD.meta) AS l);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_labels AFTER INSERT OR DELETE ON jobs FOR EACH ROW EXECUTE FUNCTION comfysup_job_labels();
INSERT INTO job_labels (key, value, seq) SELECT l.key, l.value, jobs.seq FROM jobs, comfysup_labels(jobs.meta) AS l;

-- name: v17
-- A tenant's running jobs count in its share (see schema.sql's v21): each claim adds its attempt's expected
-- seconds (the tenant's last attempt's, at least a millisecond) to the tenant's running_seconds, and the
-- attempt's end takes back what its claim added as it charges what the attempt executed.
ALTER TABLE tenants ADD COLUMN running_seconds double precision NOT NULL DEFAULT 0,
    ADD COLUMN last_seconds double precision NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN expected_seconds double precision NOT NULL DEFAULT 0;
DROP INDEX tenants_share;
CREATE INDEX tenants_share ON tenants (((gpu_seconds + running_seconds) / weight), name);
CREATE OR REPLACE FUNCTION comfysup_charge_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ran json;
    executed float8;
BEGIN
    -- no tenants: no row that every end would write (see schema.sql's v18); two probes of the primary key, not a
    -- scan that would step over every dead row version of the table
    IF NOT EXISTS (SELECT 1 FROM tenants WHERE name < 'default') AND NOT EXISTS (SELECT 1 FROM tenants
            WHERE name > 'default') THEN
        RETURN NULL;
    END IF;
    ran := CASE WHEN NEW.trace IS NOT NULL THEN NEW.trace::json -> 'run_s' END;
    executed := greatest(0.0, CASE WHEN json_typeof(ran) = 'number' THEN (ran #>> '{}')::float8
        ELSE NEW.ended_at - NEW.started_at END);
    UPDATE tenants SET gpu_seconds = gpu_seconds + executed, last_seconds = executed,
        running_seconds = greatest(0.0, running_seconds - NEW.expected_seconds),
        done = done + (NEW.outcome IS NOT DISTINCT FROM 'done')::int
    WHERE name = (SELECT tenant FROM jobs WHERE id = NEW.job_id);
    RETURN NULL;
END $$;
