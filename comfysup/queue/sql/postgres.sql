-- PostgreSQL's dialect: the fragments queries.sql leaves open, and the statements only PostgreSQL runs.
-- Time is the caller's ``now`` in tests, else the database server's clock (``now()``, the transaction's
-- start), so every machine's leases are stamped by one clock. Claims take rows with SKIP LOCKED.

-- name: now
-- the operation's time: the parameter :now, else the database clock
coalesce(CAST(:now AS float8), extract(epoch from now())::float8)

-- name: claim_at
-- a claim's start: the caller's now, else the database clock as the claim runs (clock_timestamp), never the
-- transaction's start: the claim statement sees the job queued only after the end that freed it committed,
-- while its transaction (begun by ``expire``) may have started before that end's own, so now() could stamp
-- the new attempt as begun before the last one ended
coalesce(:now::float8, extract(epoch from clock_timestamp())::float8)

-- name: greatest
-- the larger of two numbers
greatest

-- name: for_update
-- lock the row for the change that follows
FOR UPDATE

-- name: by_jobs_state
-- PostgreSQL's planner picks its index itself

-- name: by_jobs_ready
-- PostgreSQL's planner picks its index itself

-- name: job_from
-- a job with its stored workflow
jobs JOIN workflows ON workflows.id = jobs.workflow_id

-- name: attempt_order
-- attempts in the order they were opened
n

-- name: trace_nodes
-- nodes run in an attempt's trace (0 when the list is missing or not a list, as SQLite's json_array_length)
CASE json_typeof(t.doc -> 'nodes') WHEN 'array' THEN json_array_length(t.doc -> 'nodes') ELSE 0 END

-- name: trace_cached
-- nodes served from ComfyUI's cache in an attempt's trace
CASE json_typeof(t.doc -> 'cached') WHEN 'array' THEN json_array_length(t.doc -> 'cached') ELSE 0 END

-- name: trace_wait
-- seconds an attempt waited in ComfyUI's queue, from its trace (NULL without one, or not a number)
CASE json_typeof(t.doc -> 'comfyui_wait_s') WHEN 'number' THEN (t.doc ->> 'comfyui_wait_s')::float8 END

-- name: trace_run
-- seconds an attempt ran (its claim to its end, less that wait), from its trace
CASE json_typeof(t.doc -> 'run_s') WHEN 'number' THEN (t.doc ->> 'run_s')::float8 END

-- name: first_wait
-- of a job's first attempt (f): seconds it waited in ComfyUI's queue, from its trace
CASE json_typeof(f.trace::json -> 'comfyui_wait_s') WHEN 'number' THEN (f.trace::json ->> 'comfyui_wait_s')::float8 END

-- name: trace_doc
-- the trace text parsed once per row
CROSS JOIN LATERAL (SELECT a.trace::json AS doc) t

-- name: state_counts
-- jobs by state; posted: the running jobs that wait in their server's queue (counted among running too)
SELECT state, count(*) AS n FROM jobs GROUP BY state
UNION ALL SELECT 'posted', count(*) FROM jobs WHERE state = 'running' AND waiting_since IS NOT NULL

-- name: oldest_queued
-- the first queued job in submission order
SELECT submitted_at FROM jobs WHERE state = 'queued' ORDER BY seq LIMIT 1

-- name: head
-- the fair head: tenants walked in the order of their share used (seconds executed and expected of the running
-- over weight, tenants_share), passing over one at its max_running, and the first whose own head (priority, then
-- seq: jobs_tenant_ready) is ready and not held by another claim (SKIP LOCKED); a tenant without a ready job
-- costs one index probe. expected: the seconds the claim adds to its tenant's share until its attempt ends (its
-- last attempt's, at least a millisecond so that tenants level with each other take turns; none while default is
-- the only tenant)
SELECT j.seq, j.priority, t.name AS tenant, CASE WHEN t.name <> 'default'
        OR EXISTS (SELECT 1 FROM tenants o WHERE o.name < 'default') OR EXISTS (SELECT 1 FROM tenants o
        WHERE o.name > 'default') THEN greatest(t.last_seconds, 0.001) ELSE 0 END AS expected
FROM tenants t CROSS JOIN LATERAL (SELECT seq, priority FROM jobs
    WHERE jobs.tenant = t.name AND state = 'queued' AND run_after <= {now}
    AND NOT EXISTS (SELECT 1 FROM job_refusals r WHERE r.seq = jobs.seq AND r.catalogue_id = :cat)
    ORDER BY priority DESC, seq LIMIT 1 FOR UPDATE SKIP LOCKED) j
WHERE t.max_running IS NULL
    OR (SELECT count(*) FROM jobs r WHERE r.tenant = t.name AND r.state = 'running') < t.max_running
ORDER BY (t.gpu_seconds + t.running_seconds) / t.weight, t.name LIMIT 1

-- name: pick_head
-- strict order: the head
SELECT seq FROM head

-- name: pick_affine
-- the first job of the head's tenant and priority with model :key, unless the head has been passed over for :wait s
SELECT coalesce((SELECT j.seq FROM jobs j WHERE j.state = 'queued' AND j.tenant = h.tenant AND j.model_key = :key
    AND j.priority = h.priority AND j.run_after <= {now}
    AND NOT EXISTS (SELECT 1 FROM job_refusals r WHERE r.seq = j.seq AND r.catalogue_id = :cat)
    AND coalesce((SELECT min(s.at) FROM affinity_skips s WHERE s.tenant = h.tenant AND s.priority = h.priority
        AND s.seq_bound > h.seq), {now}) > {now} - :wait
    ORDER BY j.seq LIMIT 1 FOR UPDATE SKIP LOCKED), h.seq) FROM head h

-- name: claim_strict
-- the claim in strict order
WITH head AS ({head}), pick AS ({pick_head}), {claimed}

-- name: claim_affine
-- the claim with model affinity
WITH head AS ({head}), pick AS ({pick_affine}), {claimed}

-- name: claimed
-- take the picked job, add the seconds it is expected to take to its tenant's share and open its attempt with
-- them, and read its workflow unless this process has it cached. The claim never waits for the tenant's row: an
-- end holds it until its commit, and a transaction that ends one tenant's attempt and then claims another's would
-- wait in a circle with one doing the opposite; while another holds it, this attempt expects nothing (its tenant
-- is charged when it ends, as it always is)
claimed AS (
    UPDATE jobs SET state = 'running', attempt = attempt + 1, owner = :owner, server = :server,
        lease_until = {claim_at} + :lease, started_at = {claim_at}, progress = NULL, waiting_since = NULL
    WHERE seq = (SELECT * FROM pick)
    RETURNING seq, id, attempt, workflow_id, extra_data, params, last_server, last_prompt_number, reason,
        cancel_requested, lease_until, started_at, model_key),
held AS (UPDATE tenants SET running_seconds = running_seconds + h.expected FROM head h, claimed c
    WHERE tenants.name = h.tenant AND h.expected > 0
    AND tenants.name = (SELECT l.name FROM tenants l WHERE l.name = h.tenant FOR UPDATE SKIP LOCKED)
    RETURNING h.expected),
opened AS (INSERT INTO attempts (job_id, attempt, owner, server, started_at, url, expected_seconds)
    SELECT c.id, c.attempt, :owner, :server, c.started_at, :url, coalesce((SELECT expected FROM held), 0)
    FROM claimed c)
SELECT c.id, c.attempt, c.workflow_id, c.extra_data, c.params, c.last_server, c.last_prompt_number, c.reason,
    c.cancel_requested, c.lease_until, c.model_key,
    (SELECT w.workflow FROM workflows w WHERE w.id = c.workflow_id AND NOT w.id = ANY(:cached::bigint[]))
        AS workflow,
    c.seq, h.seq AS head, h.priority, h.tenant
FROM claimed c, head h

-- name: not_durable
-- a transaction the code marks durable=False (a prompt number, progress, a preview, an announcement's mark; as
-- SQLite's synchronous=NORMAL for them) commits without waiting for the WAL's flush: one fsync fewer each, the
-- server still writes it within 3 x wal_writer_delay. A crash of the server may lose the last of them and
-- nothing else: never a claim, a submit, an end or a lease's renewal (PostgresDb.DURABLE_RENEWALS), which
-- stay durable, as a prompt number that replaces an earlier attempt's does (leases.record_prompt). A lost first
-- prompt number leaves the attempt's URL, recorded with its (durable) claim, and the prompt's id, the job's, to
-- find it by; a lost announcement's mark publishes it again (at least once).
SET LOCAL synchronous_commit = off

-- name: claim_plan
-- the claim walks tenants_share and jobs_tenant_ready (or jobs_tenant_affinity) in order and stops at its first row, whatever the table's
-- statistics say: on a table analysed while small (or never: autovacuum off, its first minute) the planner
-- took a bitmap scan of every queued row and a sort, 15 ms of server CPU a claim at 2,700 queued jobs and
-- growing with the queue, against 0.1-0.5 ms for the walk. For this transaction only.
SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true)

-- name: expire
-- running jobs whose lease passed go back to the queue and their attempts end; SKIP LOCKED: a row
-- another transaction is renewing or expiring is left to it
WITH expired AS (
    UPDATE jobs SET state = 'queued', owner = NULL, lease_until = NULL,
        reason = 'lease expired: the runner stopped renewing it'
    WHERE seq IN (SELECT seq FROM jobs WHERE state = 'running' AND lease_until < {now} FOR UPDATE SKIP LOCKED)
    RETURNING id, attempt)
UPDATE attempts a SET ended_at = {now}, outcome = 'lease_expired', kind = 'lease_expired', reason = 'lease expired'
FROM expired e WHERE a.job_id = e.id AND a.attempt = e.attempt AND a.ended_at IS NULL

-- name: insert_workflows
-- each new workflow text stored by hash; the upsert locks an existing row, so a concurrent prune keeps it
INSERT INTO workflows (hash, workflow) SELECT * FROM unnest(:hashes::text[], :texts::text[])
ON CONFLICT (hash) DO UPDATE SET hash = excluded.hash RETURNING hash, id

-- name: insert_jobs
-- a batch of new jobs in one statement; an id already there is left alone and judged after
INSERT INTO jobs (id, priority, submitted_at, spec_hash, workflow_name, workflow_id, extra_data, meta, params,
    callback_url, model_key, tenant)
SELECT t.id, t.priority, {now}, t.spec_hash, t.workflow_name, t.workflow_id, t.extra_data, t.meta, t.params,
    t.callback_url, t.model_key, t.tenant
FROM unnest(:ids::text[], :priorities::bigint[], :spec_hashes::text[], :workflow_names::text[],
    :workflow_ids::bigint[], :extra_datas::text[], :metas::text[], :paramses::text[], :callback_urls::text[],
    :model_keys::text[], :tenants::text[]) WITH ORDINALITY
    AS t(id, priority, spec_hash, workflow_name, workflow_id, extra_data, meta, params, callback_url, model_key, tenant,
    ord)
ORDER BY t.ord ON CONFLICT (id) DO NOTHING RETURNING id

-- name: claim_deliveries
-- due deliveries, each held for a while; SKIP LOCKED, as the job claim
UPDATE deliveries SET next_at = {now} + :hold WHERE id IN (SELECT id FROM deliveries
    WHERE next_at IS NOT NULL AND next_at <= {now} ORDER BY next_at LIMIT :limit FOR UPDATE SKIP LOCKED)
RETURNING {delivery_columns}

-- name: prune_batch
-- old terminal jobs (not one whose webhook is pending) with their attempts and deliveries
WITH gone AS (DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs j
    WHERE state IN ('done', 'dead', 'cancelled') AND finished_at < :before AND NOT EXISTS
    (SELECT 1 FROM deliveries d WHERE d.job_id = j.id AND d.next_at IS NOT NULL) AND NOT EXISTS
    (SELECT 1 FROM announcements n WHERE n.job_id = j.id AND n.sent_at IS NULL)
    LIMIT :limit FOR UPDATE SKIP LOCKED) RETURNING id, machine, workflow_id, seq),
a AS (DELETE FROM attempts WHERE job_id IN (SELECT id FROM gone)),
d AS (DELETE FROM deliveries WHERE job_id IN (SELECT id FROM gone)),
n AS (DELETE FROM announcements WHERE job_id IN (SELECT id FROM gone)),
o AS (DELETE FROM output_assets WHERE job_id IN (SELECT id FROM gone)),
p AS (DELETE FROM job_previews WHERE job_id IN (SELECT id FROM gone)),
r AS (DELETE FROM job_refusals WHERE seq IN (SELECT seq FROM gone))
SELECT id, machine, workflow_id FROM gone

-- name: prune_workflow
-- a workflow no job uses any more
DELETE FROM workflows w WHERE id = :id AND NOT EXISTS (SELECT 1 FROM jobs WHERE workflow_id = w.id)

-- name: fill_model_keys
-- v3's Python step reads the jobs still to run
SELECT j.seq, w.workflow, j.params FROM jobs j JOIN workflows w ON w.id = j.workflow_id
WHERE j.state IN ('queued', 'running')

-- name: import_job
-- a job copied from another queue as it is (state, attempts, times, tenant: its tenant's row is added with it)
INSERT INTO jobs (id, state, priority, run_after, attempt, owner, server, lease_until, started_at, cancel_requested,
    submitted_at, finished_at, reason, outputs, machine, last_server, last_prompt_number, spec_hash, workflow_name,
    workflow_id, extra_data, meta, params, progress, callback_url, model_key, staged_at, staged_in, staged_bytes,
    tenant)
VALUES (:id, :state, :priority, :run_after, :attempt, :owner, :server, :lease_until, :started_at, :cancel_requested, :submitted_at, :finished_at, :reason, :outputs, :machine, :last_server, :last_prompt_number, :spec_hash, :workflow_name, :workflow_id, :extra_data, :meta, :params, :progress, :callback_url, :model_key, :staged_at, :staged_in, :staged_bytes, :tenant)

-- name: import_attempt
-- an attempt copied with its job
INSERT INTO attempts (job_id, attempt, owner, server, started_at, ended_at, outcome, reason, prompt_number, kind,
    trace)
VALUES (:job_id, :attempt, :owner, :server, :started_at, :ended_at, :outcome, :reason, :prompt_number, :kind, :trace)

-- name: lock_claims
-- while a tenant has a cap: one claim at a time counts a tenant's running jobs (comfysup.queue.tenants)
SELECT pg_advisory_xact_lock(:key)

-- name: lock_tenant_queue
-- a submit to a tenant with max_queued counts its queued jobs alone (comfysup.queue.tenants)
SELECT pg_advisory_xact_lock(:kind, hashtext(:name))
