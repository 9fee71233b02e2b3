-- SQLite's dialect: the fragments queries.sql leaves open, and the statements only SQLite runs. Time is
-- always a parameter (the local clock, taken once the write lock is held); INDEXED BY hints stand where
-- the planner, without statistics, would pick jobs_state and sort every queued row.

-- name: now
-- the operation's time: the parameter :now
:now

-- name: greatest
-- the larger of two numbers
max

-- name: for_update
-- BEGIN IMMEDIATE already holds the write lock

-- name: by_jobs_state
-- walk the (state, finished_at) index
INDEXED BY jobs_state

-- name: by_jobs_ready
-- walk the ready index, whose entries hold run_after
INDEXED BY jobs_ready

-- name: job_from
-- a job with its spec row and its stored workflow
jobs JOIN job_specs ON job_specs.seq = jobs.seq JOIN workflows ON workflows.id = job_specs.workflow_id

-- name: attempt_order
-- attempts in the order they were opened
rowid

-- name: trace_nodes
-- nodes run in an attempt's trace (0 when the list is missing or not a list)
coalesce(json_array_length(a.trace, '$.nodes'), 0)

-- name: trace_cached
-- nodes served from ComfyUI's cache in an attempt's trace
coalesce(json_array_length(a.trace, '$.cached'), 0)

-- name: trace_wait
-- seconds an attempt waited in ComfyUI's queue, from its trace (NULL without one)
json_extract(a.trace, '$.comfyui_wait_s')

-- name: trace_run
-- seconds an attempt ran (its claim to its end, less that wait), from its trace
json_extract(a.trace, '$.run_s')

-- name: first_wait
-- of a job's first attempt (f): seconds it waited in ComfyUI's queue, from its trace
json_extract(f.trace, '$.comfyui_wait_s')

-- name: trace_doc
-- SQLite reads the trace text as it is

-- name: state_counts
-- running, storing and queued jobs counted through the index, finished ones as their triggers counted them; posted:
-- the running jobs that wait in their server's queue (counted among running too)
SELECT state, count(*) AS n FROM jobs INDEXED BY jobs_state WHERE state IN ('queued', 'running', 'storing') GROUP BY state
UNION ALL SELECT state, n FROM finished_counts
UNION ALL SELECT 'posted', count(*) FROM jobs INDEXED BY jobs_state WHERE state = 'running' AND waiting_since IS NOT NULL

-- name: oldest_queued
-- a queued job has no finished_at, so jobs_state hands min(seq) over at once
SELECT submitted_at FROM jobs WHERE seq = (SELECT min(seq) FROM jobs WHERE state = 'queued' AND finished_at IS NULL)

-- name: head
-- the fair head: tenants walked in the order of their share used (seconds executed and expected of the running
-- over weight, tenants_share), passing over one at its max_running, and the first whose own head (priority, then
-- seq: jobs_tenant_ready) is ready; a job that the claiming server's catalogue :cat refused is passed over (one
-- primary-key probe a job). expected: the seconds the claim adds to its tenant's share until its attempt ends (its
-- last attempt's, at least a millisecond so that tenants level with each other take turns; none while default is
-- the only tenant)
SELECT seq, priority, tenant, coalesce((SELECT CASE WHEN t.name <> 'default'
        OR EXISTS (SELECT 1 FROM tenants o WHERE o.name < 'default') OR EXISTS (SELECT 1 FROM tenants o
        WHERE o.name > 'default') THEN max(t.last_seconds, 0.001) ELSE 0 END
    FROM tenants t WHERE t.name = jobs.tenant), 0) AS expected
FROM jobs WHERE seq = (SELECT (SELECT j.seq FROM jobs j INDEXED BY jobs_tenant_ready
        WHERE j.tenant = t.name AND j.state = 'queued' AND j.run_after <= :now
        AND NOT EXISTS (SELECT 1 FROM job_refusals r WHERE r.seq = j.seq AND r.catalogue_id = :cat)
        ORDER BY j.priority DESC, j.seq LIMIT 1) AS ready
    FROM tenants t INDEXED BY tenants_share
    WHERE (t.max_running IS NULL OR (SELECT count(*) FROM jobs r INDEXED BY jobs_tenant_running
        WHERE r.tenant = t.name AND r.state = 'running') < t.max_running) AND ready IS NOT NULL
    ORDER BY (t.gpu_seconds + t.running_seconds) / t.weight, t.name LIMIT 1)

-- name: pick
-- the fair head and, unless it has been passed over for :wait seconds, the first job of its tenant and priority
-- with model :key
WITH head AS ({head}) SELECT head.seq AS head, head.priority AS priority, head.tenant AS tenant,
    head.expected AS expected,
    CASE WHEN coalesce((SELECT min(at) FROM affinity_skips s WHERE s.tenant = head.tenant
        AND s.priority = head.priority AND s.seq_bound > head.seq), :now) > :now - :wait
    THEN (SELECT seq FROM jobs INDEXED BY jobs_tenant_affinity WHERE state = 'queued' AND tenant = head.tenant
        AND model_key = :key AND priority = head.priority AND run_after <= :now
        AND NOT EXISTS (SELECT 1 FROM job_refusals r WHERE r.seq = jobs.seq AND r.catalogue_id = :cat)
        ORDER BY seq LIMIT 1) END AS affine FROM head

-- name: take
-- the claimed job's row
UPDATE jobs SET state = 'running', attempt = attempt + 1, owner = :owner, server = :server, lease_until = :lease_until, started_at = :now,
    progress = NULL, waiting_since = NULL WHERE seq = :seq
RETURNING id, attempt, last_server, last_prompt_number, reason, cancel_requested, model_key

-- name: spec
-- the claimed job's workflow id and own data
SELECT workflow_id, extra_data, params FROM job_specs WHERE seq = :seq

-- name: open_attempt
-- the attempt row a claim opens, with the seconds its tenant is expected to hold until it ends
INSERT INTO attempts (job_id, attempt, owner, server, started_at, url, expected_seconds)
VALUES (:job_id, :attempt, :owner, :server, :now, :url, :expected)

-- name: hold_share
-- a claim's expected seconds added to its tenant's share, taken back by the attempt's end (attempts_ended_charge)
UPDATE tenants SET running_seconds = running_seconds + :expected WHERE name = :tenant

-- name: any_expired
-- a read first: an UPDATE that changes nothing still cost a fifth of a claim's statements
SELECT 1 FROM jobs INDEXED BY jobs_state WHERE state = 'running' AND lease_until < :now LIMIT 1

-- name: expire
-- running jobs whose lease passed go back to the queue (read through jobs_state: running rows are few)
UPDATE jobs INDEXED BY jobs_state SET state = 'queued', owner = NULL, lease_until = NULL,
    reason = 'lease expired: the runner stopped renewing it'
WHERE state = 'running' AND lease_until < :now RETURNING id, attempt

-- name: end_expired
-- the attempt whose lease expired
UPDATE attempts SET ended_at = :now, outcome = 'lease_expired', kind = 'lease_expired', reason = 'lease expired'
WHERE job_id = :job_id AND attempt = :attempt AND ended_at IS NULL

-- name: last_seq
-- the last seq given out: a batch numbers its rows itself, so the spec row needs no round trip
SELECT coalesce(max(seq), 0) AS seq FROM jobs

-- name: workflow_id
-- a stored workflow's id by hash
SELECT id FROM workflows WHERE hash = :hash

-- name: insert_workflow
-- a workflow text stored for the first time
INSERT INTO workflows (hash, workflow) VALUES (:hash, :workflow)

-- name: insert_job
-- a new job's row
INSERT INTO jobs (seq, id, priority, submitted_at, spec_hash, workflow_name, callback_url, model_key, tenant)
VALUES (:seq, :id, :priority, :now, :spec_hash, :workflow_name, :callback_url, :model_key, :tenant)

-- name: insert_spec
-- a new job's workflow id and own data, beside the row every claim rewrites
INSERT INTO job_specs (seq, workflow_id, extra_data, meta, params) VALUES (:seq, :workflow_id, :extra_data, :meta, :params)

-- name: any_due
-- a read first: an idle deliverer's poll must not take the write lock
SELECT 1 FROM deliveries WHERE next_at IS NOT NULL AND next_at <= :now LIMIT 1

-- name: due_deliveries
-- due deliveries, soonest first
SELECT {delivery_columns} FROM deliveries WHERE next_at IS NOT NULL AND next_at <= :now ORDER BY next_at LIMIT :limit

-- name: hold_delivery
-- a delivery held by this deliverer until next_at
UPDATE deliveries SET next_at = :until WHERE id = :id

-- name: prune_batch
-- terminal jobs finished before a time whose webhook is not pending
SELECT seq, id, machine FROM jobs INDEXED BY jobs_state WHERE state IN ('done', 'dead', 'cancelled')
AND finished_at < :before AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.job_id = jobs.id AND d.next_at IS NOT NULL)
AND NOT EXISTS (SELECT 1 FROM announcements a WHERE a.job_id = jobs.id AND a.sent_at IS NULL)
LIMIT :limit

-- name: prune_workflows_of
-- the workflows the pruned jobs used
SELECT DISTINCT workflow_id FROM job_specs WHERE seq IN (SELECT value FROM json_each(:seqs))

-- name: prune_jobs
-- the pruned jobs' rows
DELETE FROM jobs WHERE seq IN (SELECT value FROM json_each(:seqs))

-- name: prune_specs
-- the pruned jobs' spec rows
DELETE FROM job_specs WHERE seq IN (SELECT value FROM json_each(:seqs))

-- name: prune_refusals
-- the pruned jobs' catalogue refusals
DELETE FROM job_refusals WHERE seq IN (SELECT value FROM json_each(:seqs))

-- name: prune_attempts
-- the pruned jobs' attempts
DELETE FROM attempts WHERE job_id = ANY(:ids)

-- name: prune_deliveries
-- the pruned jobs' deliveries
DELETE FROM deliveries WHERE job_id = ANY(:ids)

-- name: prune_announcements
-- the pruned jobs' broker announcements
DELETE FROM announcements WHERE job_id = ANY(:ids)

-- name: prune_output_assets
-- the pruned jobs' output asset ids
DELETE FROM output_assets WHERE job_id = ANY(:ids)

-- name: prune_previews
-- the pruned jobs' previews (one outlives its attempt only when its runner died)
DELETE FROM job_previews WHERE job_id = ANY(:ids)

-- name: prune_workflow
-- a workflow no remaining job uses
DELETE FROM workflows WHERE id = :id AND NOT EXISTS (SELECT 1 FROM job_specs WHERE workflow_id = :id)
