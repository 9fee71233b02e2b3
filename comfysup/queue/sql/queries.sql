-- Queries both backends run, written once. ``:name`` is a named parameter (PostgreSQL's ``%(name)s``, translated
-- by comfysup.queue.queries); ``{name}`` is a fragment each dialect file defines: ``{now}`` is the
-- operation's time (the parameter :now on SQLite, the caller's ``now`` or the database clock on PostgreSQL),
-- ``{by_jobs_state}`` and the like are SQLite's index hints (empty on PostgreSQL).

-- name: fence
-- the guard of every write after the claim: the row is still this claim's
WHERE id = :id AND attempt = :attempt AND owner = :owner AND state = 'running'

-- name: set_progress
-- a running job's progress, fenced
UPDATE jobs SET progress = :progress {fence} RETURNING 1

-- name: heartbeat
-- renew the lease, fenced; says whether a cancel was requested
UPDATE jobs SET lease_until = {now} + :lease {fence} RETURNING cancel_requested

-- name: record_prompt
-- the prompt a running job was queued as on its server, and whether it waits there behind another (since now), fenced
UPDATE jobs SET last_server = :server, last_prompt_number = :number, waiting_since = CASE WHEN :waiting THEN {now} END {fence} RETURNING 1

-- name: set_waiting
-- a running job waits for its server (since now), or no longer does: its execution started, fenced
UPDATE jobs SET waiting_since = CASE WHEN :waiting THEN {now} END {fence} RETURNING 1

-- name: executing
-- the execution of a job queued behind the one that ends in this transaction started (read before
-- that end): no longer waiting; nothing when that job's claim no longer holds (its own attempt finds out)
UPDATE jobs SET waiting_since = NULL {fence}

-- name: complete
-- the job is done: its outputs and the machine that holds them, fenced
UPDATE jobs SET state = 'done', outputs = :outputs, finished_at = {now}, reason = NULL, owner = NULL, lease_until = NULL,
    machine = :machine {fence} RETURNING 1

-- name: stage
-- the job's outputs are staged on its machine (downloaded, hashed, fsynced): storing until the bucket has them,
-- held by no owner and no lease, fenced
UPDATE jobs SET state = 'storing', outputs = :outputs, reason = NULL, owner = NULL, lease_until = NULL,
    machine = :machine, staged_at = {now}, staged_in = :staged_in, staged_bytes = :staged_bytes {fence} RETURNING 1

-- name: staged_fence
-- the guard of an uploader's write: the job is still storing the files that attempt staged then (a job requeued
-- and staged again has the same attempt number, never the same time)
WHERE id = :id AND attempt = :attempt AND staged_at = :staged_at AND state = 'storing'

-- name: stored
-- every object of a storing job confirmed in the bucket: done, with the objects as its outputs
UPDATE jobs SET state = 'done', outputs = :outputs, finished_at = {now}, reason = NULL {staged_fence} RETURNING 1

-- name: stored_for_tenant
-- a storing job made done by its uploader: one more job done for its tenant (the attempt's end, which the trigger
-- counts, ended it storing, not done); kept only once a tenant other than default exists, as the trigger keeps it
UPDATE tenants SET done = done + 1 WHERE name = :tenant
    AND (EXISTS (SELECT 1 FROM tenants WHERE name < 'default') OR EXISTS (SELECT 1 FROM tenants WHERE name > 'default'))

-- name: storing_dead
-- a storing job given up on ([store] upload_give_up_hours)
UPDATE jobs SET state = 'dead', reason = :reason, finished_at = {now} {staged_fence} RETURNING 1

-- name: upload_failed
-- why the last try of a storing job's upload failed, shown until it is done
UPDATE jobs SET reason = :reason {staged_fence}

-- name: staged_jobs
-- one machine's storing jobs, oldest first
SELECT id, attempt, machine, staged_in, staged_at, staged_bytes, outputs, reason, tenant FROM jobs
WHERE state = 'storing' AND machine = :machine ORDER BY staged_at LIMIT :limit

-- name: staging_bytes
-- what one machine's storing jobs hold in its staging folder
SELECT coalesce(sum(staged_bytes), 0) AS n FROM jobs WHERE state = 'storing' AND machine = :machine

-- name: outbox_uploads
-- the upload outbox: storing jobs, their staged bytes, the age of the oldest (on the clock that stamped it)
SELECT count(*) AS n, coalesce(sum(staged_bytes), 0) AS bytes, {now} - min(staged_at) AS age FROM jobs
{by_jobs_state} WHERE state = 'storing'

-- name: outbox_uploads_by_machine
-- the upload outbox per machine whose staging folder holds the files (one gone for good shows here)
SELECT machine, count(*) AS n, coalesce(sum(staged_bytes), 0) AS bytes, {now} - min(staged_at) AS age FROM jobs
{by_jobs_state} WHERE state = 'storing' GROUP BY machine ORDER BY machine

-- name: outbox_webhooks
-- the webhook outbox: deliveries still to send, the age of the oldest
SELECT count(*) AS n, {now} - min(created_at) AS age FROM deliveries WHERE next_at IS NOT NULL

-- name: outbox_broker
-- the broker outbox: announcements not yet confirmed, the age of the oldest
SELECT count(*) AS n, {now} - min(created_at) AS age FROM announcements WHERE sent_at IS NULL

-- name: cancel_storing
-- a storing job cancelled by a person: its staged files are dropped by its uploader
UPDATE jobs SET state = 'cancelled', finished_at = {now}, reason = 'cancelled by user while its files were stored'
WHERE id = :id AND state = 'storing'

-- name: forget_output_assets
-- the output asset ids of a job done before (a person's retry of it): its new outputs replace them
DELETE FROM output_assets WHERE job_id = :job_id

-- name: add_output_asset
-- an output's asset id, in the transaction that ends its job done
INSERT INTO output_assets (id, job_id) VALUES (:asset_id, :job_id)

-- name: output_asset_job
-- the job whose outputs an asset id names
SELECT job_id FROM output_assets WHERE id = :asset_id

-- name: set_preview
-- a running job's latest preview, replacing the one before; fenced (a lost claim writes nothing)
INSERT INTO job_previews (job_id, n, node_id, content_type, data) SELECT id, 1, :node_id, :content_type, :data FROM jobs {fence}
ON CONFLICT (job_id) DO UPDATE SET n = job_previews.n + 1, node_id = excluded.node_id,
    content_type = excluded.content_type, data = excluded.data

-- name: preview_numbers
-- how many times each watched job's preview was replaced: the reader fetches only the ones that moved
SELECT job_id, n FROM job_previews WHERE job_id = ANY(:ids)

-- name: previews
-- the latest previews of some jobs
SELECT job_id, n, node_id, content_type, data FROM job_previews WHERE job_id = ANY(:ids)

-- name: forget_preview
-- an attempt ended: its job's preview goes
DELETE FROM job_previews WHERE job_id = :job_id

-- name: retry_later
-- back to the queue until run_after (given, else the delay from now); the prompt number is forgotten
UPDATE jobs SET state = 'queued', run_after = coalesce(CAST(:given AS double precision), {now} + :delay), reason = :reason,
    owner = NULL, lease_until = NULL, last_prompt_number = NULL {fence} RETURNING run_after <= {now} AS due

-- name: finish
-- a terminal state other than done (dead, cancelled), fenced
UPDATE jobs SET state = :state, reason = :reason, finished_at = {now}, owner = NULL, lease_until = NULL {fence} RETURNING 1

-- name: release
-- put a claimed job back at once (its attempt counted or not), fenced
UPDATE jobs SET state = 'queued', owner = NULL, lease_until = NULL, reason = :reason, attempt = attempt - :uncount,
    last_prompt_number = NULL {fence} RETURNING 1

-- name: attempt_row
-- the open attempt row of a claim
WHERE job_id = :id AND attempt = :attempt AND owner = :owner AND ended_at IS NULL

-- name: end_attempt
-- close the claim's attempt with its outcome, reason class and trace
UPDATE attempts SET ended_at = {now}, outcome = :outcome, reason = :end_reason, kind = :kind, trace = :trace {attempt_row}

-- name: attempt_prompt
-- the prompt number, server and server URL of the claim's open attempt (a caller that names no URL keeps the claim's)
UPDATE attempts SET prompt_number = :number, server = :server, url = coalesce(:url, url) {attempt_row}

-- name: passed_over
-- an affinity claim took a job behind its tenant's head: that tenant's jobs of its priority before it are passed
-- over from now, unless an older row already covers them (a staircase); ON CONFLICT: two machines passing over at once
INSERT INTO affinity_skips (tenant, priority, seq_bound, at) SELECT :tenant, :priority, :taken, {now}
WHERE NOT EXISTS (SELECT 1 FROM affinity_skips WHERE tenant = :tenant AND priority = :priority AND seq_bound >= :taken)
ON CONFLICT DO NOTHING

-- name: head_taken
-- an affinity claim took its tenant's head: rows covering only jobs before it (claimed, or waiting to retry) go
DELETE FROM affinity_skips WHERE tenant = :tenant AND priority = :priority AND seq_bound <= :head

-- name: deliver
-- a terminal job's webhook (its own url, else the default), due at once
INSERT INTO deliveries (job_id, url, created_at, next_at)
SELECT id, coalesce(nullif(callback_url, ''), :url), {now}, {now} FROM jobs
WHERE id = :job_id AND coalesce(nullif(callback_url, ''), :url) != ''

-- name: release_owner
-- every job of one owner back to the queue; the attempt each held
UPDATE jobs SET state = 'queued', owner = NULL, lease_until = NULL, reason = :reason, attempt = attempt - :uncount
WHERE state = 'running' AND owner = :owner RETURNING id, attempt + :uncount AS attempt

-- name: end_owner_attempt
-- close one attempt of a released owner
UPDATE attempts SET ended_at = {now}, outcome = :outcome, reason = :reason, kind = :kind
WHERE job_id = :job_id AND attempt = :attempt AND owner = :owner AND ended_at IS NULL

-- name: job_state
-- one job's state, locked for the change that follows (cancel, requeue)
SELECT state FROM jobs WHERE id = :id {for_update}

-- name: cancel_queued
-- a queued job cancelled by a person
UPDATE jobs SET state = 'cancelled', finished_at = {now}, reason = 'cancelled by user' WHERE id = :id

-- name: cancel_running
-- ask the runner of a running job to stop it
UPDATE jobs SET cancel_requested = true WHERE id = :id

-- name: requeue
-- a dead job (or a storing one whose files are lost with their machine) runs afresh: no earlier prompt is looked
-- for, so its old failure is not adopted
UPDATE jobs SET state = 'queued', attempt = 0, run_after = 0, reason = NULL, finished_at = NULL,
    cancel_requested = false, last_server = NULL, last_prompt_number = NULL, outputs = NULL, staged_at = NULL,
    staged_in = NULL, staged_bytes = NULL

-- name: requeue_one
-- requeue one dead job
{requeue} WHERE id = :id

-- name: requeue_all
-- requeue every dead job
{requeue} WHERE state = 'dead' RETURNING id

-- name: known_ids
-- the spec hashes of the ids of a batch already in the table
SELECT id, spec_hash FROM jobs WHERE id = ANY(:ids)

-- name: workflow_text
-- a stored workflow by id (a runner's template cache missed)
SELECT workflow FROM workflows WHERE id = :id

-- name: job_columns
-- what a JobRecord is read from
jobs.id AS id, state, priority, attempt, workflows.workflow AS workflow, extra_data, meta, params, workflow_name,
submitted_at, run_after, owner, server, lease_until, started_at, finished_at, reason, outputs, cancel_requested,
machine, spec_hash, last_server, last_prompt_number, progress, callback_url, model_key, waiting_since, staged_at,
staged_in, tenant

-- name: ids_starting
-- the ids that begin with a prefix a person typed, as git takes a commit's (at most a few)
SELECT id FROM jobs WHERE id LIKE :prefix ORDER BY id LIMIT :limit

-- name: jobs_by_id
-- the records of some jobs
SELECT {job_columns} FROM {job_from} WHERE jobs.id = ANY(:ids)

-- name: jobs_page
-- a page of every job, in submission order
SELECT jobs.seq AS seq, {job_columns} FROM {job_from} WHERE jobs.seq > :after ORDER BY jobs.seq LIMIT :limit

-- name: jobs_page_newest
-- a page of every job, newest first, below a seq (the API's GET /api/v2/jobs and its cursor)
SELECT jobs.seq AS seq, {job_columns} FROM {job_from} WHERE jobs.seq < :before ORDER BY jobs.seq DESC LIMIT :limit

-- name: jobs_page_in_states
-- a page of the jobs in some states, in submission order
SELECT jobs.seq AS seq, {job_columns} FROM {job_from} WHERE jobs.seq > :after AND state = ANY(:states)
ORDER BY jobs.seq LIMIT :limit

-- name: attempts_of
-- the attempts of some jobs, in the order they were opened
SELECT job_id, attempt, owner, server, started_at, ended_at, outcome, reason, prompt_number, kind, trace
FROM attempts WHERE job_id = ANY(:ids) ORDER BY {attempt_order}

-- name: attempt_urls
-- where the job's attempts (but the one given: attempt, owner) ran it or were to run it, newest first: the server's
-- URL (named at the claim, or with the prompt) and the prompt number recorded there
SELECT url, prompt_number FROM attempts WHERE job_id = :job_id AND url IS NOT NULL AND NOT (attempt = :attempt AND owner = :owner)
ORDER BY started_at DESC, attempt DESC LIMIT 100

-- name: states
-- id and state of some jobs as people see it (posted: running, waiting in its server's queue), without workflows
SELECT id, CASE WHEN state = 'running' AND waiting_since IS NOT NULL THEN 'posted' ELSE state END AS state
FROM jobs WHERE id = ANY(:ids)

-- name: pulses
-- what the API's event streams watch of some jobs (state, attempt, cancel flag, progress), without their workflows
SELECT id, state, attempt, cancel_requested, progress, waiting_since FROM jobs WHERE id = ANY(:ids)

-- name: place_of
-- what a job's place in line is read from: its state, priority and seq, its runner and since when it
-- waits in that runner's server (posted), and whether some catalogue refused it
SELECT state, priority, seq, owner, waiting_since,
    EXISTS (SELECT 1 FROM job_refusals r WHERE r.seq = jobs.seq) AS refused FROM jobs WHERE id = :id

-- name: posted_ahead
-- the jobs posted to one runner's server that wait there ahead of one posted at (waiting_since, seq)
SELECT count(*) AS n FROM jobs WHERE state = 'running' AND owner = :owner AND waiting_since IS NOT NULL
    AND (waiting_since < :since OR (waiting_since = :since AND seq < :seq))

-- name: posted_count
-- the jobs that wait in their servers' queues: each starts before any queued job
SELECT count(*) AS n FROM jobs {by_jobs_state} WHERE state = 'running' AND waiting_since IS NOT NULL

-- name: queued_ahead
-- the ready queued jobs a claim takes before the job at (priority, seq): two ranges of jobs_ready
SELECT (SELECT count(*) FROM jobs {by_jobs_ready} WHERE state = 'queued' AND priority > :priority AND run_after <= {now})
    + (SELECT count(*) FROM jobs {by_jobs_ready} WHERE state = 'queued' AND priority = :priority AND seq < :seq
        AND run_after <= {now}) AS n

-- name: able_both
-- (a fragment) some server's current catalogue can run both the job at :seq and the row of jobs
EXISTS (SELECT 1 FROM server_catalogues s
    WHERE NOT EXISTS (SELECT 1 FROM job_refusals r WHERE r.seq = :seq AND r.catalogue_id = s.catalogue_id)
    AND NOT EXISTS (SELECT 1 FROM job_refusals r WHERE r.seq = jobs.seq AND r.catalogue_id = s.catalogue_id))

-- name: queued_ahead_able
-- queued_ahead for a job some catalogue refused: only the jobs that a server able to run it could run instead
SELECT (SELECT count(*) FROM jobs {by_jobs_ready} WHERE state = 'queued' AND priority > :priority AND run_after <= {now}
        AND {able_both})
    + (SELECT count(*) FROM jobs {by_jobs_ready} WHERE state = 'queued' AND priority = :priority AND seq < :seq
        AND run_after <= {now} AND {able_both}) AS n

-- name: waiting
-- queued jobs waiting to retry
SELECT count(*) AS n FROM jobs {by_jobs_ready} WHERE state = 'queued' AND run_after > {now}

-- name: running
-- the running jobs (those that wait in their server's queue too), oldest start first
SELECT id, owner, server, attempt, started_at, lease_until, progress, waiting_since FROM jobs WHERE state = 'running'
ORDER BY started_at

-- name: recent_dead
-- the newest dead jobs
SELECT id, finished_at, reason FROM jobs WHERE state = 'dead' ORDER BY finished_at DESC LIMIT :limit

-- name: recent_done
-- the newest done jobs
SELECT id, finished_at FROM jobs WHERE state = 'done' ORDER BY finished_at DESC LIMIT :limit

-- name: finished_counts
-- jobs that reached each terminal state since a time
SELECT state, count(*) AS n FROM jobs WHERE state IN ('done', 'dead', 'cancelled') AND finished_at >= :since
GROUP BY state

-- name: ended_since
-- attempts that ended since a time, with the numbers metrics take from their traces (counted here)
SELECT a.job_id AS job_id, a.attempt AS attempt, a.outcome AS outcome, a.kind AS kind, a.started_at AS started_at,
    a.ended_at AS ended_at, {trace_nodes} AS nodes_run, {trace_cached} AS nodes_cached,
    {trace_wait} AS comfyui_wait_s, {trace_run} AS run_s,
    j.workflow_name AS workflow_name, j.submitted_at AS submitted_at,
    (SELECT min(f.started_at) FROM attempts f WHERE f.job_id = a.job_id) AS first_started_at,
    CASE WHEN a.outcome IN ('done', 'dead', 'cancelled') THEN (SELECT {first_wait} FROM attempts f
        WHERE f.job_id = a.job_id ORDER BY f.started_at, f.attempt LIMIT 1) END AS first_comfyui_wait_s
FROM attempts a JOIN jobs j ON j.id = a.job_id {trace_doc} WHERE a.ended_at >= :since ORDER BY a.ended_at LIMIT :limit

-- name: ended_count
-- how many attempts ended in a range of time (an index range)
SELECT count(*) AS n FROM attempts WHERE ended_at >= :since AND ended_at <= :until

-- name: ended_keys
-- the attempts that ended in a range of time, oldest end first
SELECT job_id, attempt, started_at, ended_at FROM attempts WHERE ended_at >= :since AND ended_at <= :until ORDER BY ended_at

-- name: active_count
-- jobs a runner may still take or holds (a storing job waits for its machine's uploader, not for a runner)
SELECT count(*) AS n FROM jobs WHERE state IN ('queued', 'running')

-- name: running_owners
-- the owners holding jobs
SELECT DISTINCT owner FROM jobs WHERE state = 'running'

-- name: delivery_columns
-- what a Delivery is read from
id, job_id, url, attempts, created_at, next_at, last_status, last_error, delivered_at

-- name: deliveries
-- the webhook deliveries of one job, oldest first
SELECT {delivery_columns} FROM deliveries WHERE job_id = :job_id ORDER BY id

-- name: pending_deliveries
-- deliveries still to send
SELECT count(*) AS n FROM deliveries WHERE next_at IS NOT NULL

-- name: delivery_result
-- one try of a delivery: delivered, due again at next_at, or given up
UPDATE deliveries SET attempts = attempts + 1, last_status = :status, last_error = :error,
    delivered_at = CASE WHEN :delivered THEN {now} END, next_at = :next_at WHERE id = :id

-- name: prunable
-- terminal jobs finished before a time
SELECT count(*) AS n FROM jobs {by_jobs_state} WHERE state IN ('done', 'dead', 'cancelled') AND finished_at < :before

-- name: forget_machine
-- a supervisor starts: earlier rows of its host go
DELETE FROM machines WHERE host = :host

-- name: machine_heartbeat
-- a supervisor's row, inserted or refreshed
INSERT INTO machines (host, pid, slots, started_at, heartbeat_at) VALUES (:host, :pid, :slots, {now}, {now})
ON CONFLICT (host, pid) DO UPDATE SET slots = excluded.slots, heartbeat_at = excluded.heartbeat_at

-- name: machines
-- every supervisor, with the age of its heartbeat on the clock that stamped it
SELECT host, pid, slots, started_at, heartbeat_at, {now} - heartbeat_at AS age FROM machines ORDER BY host, pid

-- name: insert_catalogue
-- a server's /object_info, stored once per distinct text (by its sha256)
INSERT INTO catalogues (hash, info, recorded_at) VALUES (:hash, :info, {now}) ON CONFLICT (hash) DO NOTHING

-- name: catalogue_id
-- a stored catalogue's id by hash
SELECT id FROM catalogues WHERE hash = :hash

-- name: server_catalogue
-- the catalogue a runner's server (runner name, machine) has now
INSERT INTO server_catalogues (runner, machine, catalogue_id, recorded_at) VALUES (:runner, :machine, :catalogue_id, {now})
ON CONFLICT (runner, machine) DO UPDATE SET catalogue_id = excluded.catalogue_id, recorded_at = excluded.recorded_at

-- name: stranded_jobs
-- queued jobs that every server's current catalogue has refused: no claim will ever take them (driven from the
-- refusals, which are few, not from the queued jobs, which may be a million)
SELECT DISTINCT j.id FROM job_refusals r JOIN jobs j ON j.seq = r.seq WHERE j.state = 'queued'
    AND NOT EXISTS (SELECT 1 FROM server_catalogues s WHERE NOT EXISTS (
        SELECT 1 FROM job_refusals q WHERE q.seq = j.seq AND q.catalogue_id = s.catalogue_id))

-- name: dead_queued
-- a queued job no server can run, dead-lettered without a claim (there is no attempt to end)
UPDATE jobs SET state = 'dead', finished_at = {now}, reason = :reason WHERE id = :id AND state = 'queued'

-- name: current_catalogues
-- the catalogues some server has now, with the servers that have each
SELECT c.id, c.info, s.runner, s.machine FROM server_catalogues s JOIN catalogues c ON c.id = s.catalogue_id
ORDER BY c.id, s.machine, s.runner

-- name: insert_refusal
-- a job that a catalogue cannot run, and why: the claim of a server with that catalogue passes it over
INSERT INTO job_refusals (seq, catalogue_id, reason) SELECT seq, :catalogue_id, :reason FROM jobs WHERE id = :job_id
ON CONFLICT (seq, catalogue_id) DO NOTHING

-- name: able_servers
-- how many servers have a catalogue that has not refused the job
SELECT count(*) AS n FROM server_catalogues s WHERE NOT EXISTS (SELECT 1 FROM job_refusals r JOIN jobs j ON j.seq = r.seq
    WHERE j.id = :id AND r.catalogue_id = s.catalogue_id)

-- name: refusals_of
-- why catalogues refused a job
SELECT r.catalogue_id, r.reason FROM job_refusals r JOIN jobs j ON j.seq = r.seq WHERE j.id = :id ORDER BY r.catalogue_id

-- name: asset_size
-- whether an input file is stored, and its size
SELECT size FROM assets WHERE hash = :hash

-- name: insert_asset
-- an input file's row, once per content (its bytes are stored first, in the same transaction or before it)
INSERT INTO assets (hash, size, name, stored_at) VALUES (:hash, :size, :name, :stored_at) ON CONFLICT DO NOTHING

-- name: insert_asset_chunk
-- a piece of an input file kept in the database
INSERT INTO asset_chunks (hash, n, data) VALUES (:hash, :n, :data) ON CONFLICT DO NOTHING

-- name: asset_chunks
-- an input file kept in the database, in order
SELECT data FROM asset_chunks WHERE hash = :hash ORDER BY n

-- name: insert_job_asset
-- a job needs an input file (idempotent: the same job submitted again)
INSERT INTO job_assets (seq, hash) SELECT seq, :hash FROM jobs WHERE id = :job_id ON CONFLICT DO NOTHING

-- name: assets_needed
-- the input files of queued and running jobs: a server's copy of them is never evicted
SELECT DISTINCT ja.hash FROM job_assets ja JOIN jobs j ON j.seq = ja.seq WHERE j.state IN ('queued', 'running')

-- name: server_assets
-- what a server has been given: name, size, last use
SELECT hash, name, size, used_at FROM server_assets WHERE server = :server

-- name: record_upload
-- an input file uploaded to a server (again: counted)
INSERT INTO server_assets (server, hash, name, size, uploads, used_at) VALUES (:server, :hash, :name, :size, 1, :used_at)
ON CONFLICT (server, hash) DO UPDATE SET name = excluded.name, uploads = server_assets.uploads + 1,
    used_at = excluded.used_at

-- name: touch_upload
-- a server's copy of an input file used again (the LRU's clock)
UPDATE server_assets SET used_at = :used_at WHERE server = :server AND hash = :hash

-- name: forget_upload
-- a server's copy removed (evicted, or found missing)
DELETE FROM server_assets WHERE server = :server AND hash = :hash

-- name: asset_totals
-- status and metrics: input files stored, their bytes, uploads to servers
SELECT (SELECT count(*) FROM assets) AS assets, (SELECT coalesce(sum(size), 0) FROM assets) AS bytes,
    (SELECT coalesce(sum(uploads), 0) FROM server_assets) AS uploads

-- name: prune_job_assets
-- the links of jobs that prune removed
DELETE FROM job_assets WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.seq = job_assets.seq)

-- name: unreferenced_assets
-- input files no job needs any more and no API upload keeps (until the upload expires)
SELECT hash, size FROM assets a WHERE NOT EXISTS (SELECT 1 FROM job_assets ja WHERE ja.hash = a.hash)
    AND NOT EXISTS (SELECT 1 FROM api_assets u WHERE u.hash = a.hash)

-- name: delete_asset
-- an input file no job needs and no API upload keeps (its chunks too, below)
DELETE FROM assets WHERE hash = :hash AND NOT EXISTS (SELECT 1 FROM job_assets ja WHERE ja.hash = :hash)
    AND NOT EXISTS (SELECT 1 FROM api_assets u WHERE u.hash = :hash)

-- name: delete_asset_chunks
-- the database's copy of a removed input file
DELETE FROM asset_chunks WHERE hash = :hash

-- name: asset_chunk
-- one piece of an input file kept in the database (a ranged read of an uploaded asset)
SELECT data FROM asset_chunks WHERE hash = :hash AND n = :n

-- name: api_asset
-- an asset uploaded through the API, with its content's size
SELECT u.id, u.hash, a.size, u.file_path, u.content_type, u.created_at, u.expires_at, u.tenant
FROM api_assets u JOIN assets a ON a.hash = u.hash WHERE u.id = :id

-- name: api_asset_by_key
-- an upload's record by its Idempotency-Key (a retried upload)
SELECT u.id, u.hash, a.size, u.file_path, u.content_type, u.created_at, u.expires_at, u.tenant
FROM api_assets u JOIN assets a ON a.hash = u.hash WHERE u.idem_key = :key

-- name: api_asset_same
-- a live record of this content under this name of this tenant (POST /assets/from-hash answers it, not a new one)
SELECT u.id, u.hash, a.size, u.file_path, u.content_type, u.created_at, u.expires_at, u.tenant
FROM api_assets u JOIN assets a ON a.hash = u.hash WHERE u.hash = :hash AND u.file_path = :file_path AND u.expires_at > :at
    AND u.tenant = :tenant
ORDER BY u.created_at LIMIT 1

-- name: insert_api_asset
-- an asset record minted over stored content
INSERT INTO api_assets (id, hash, file_path, content_type, created_at, expires_at, idem_key, tenant)
VALUES (:id, :hash, :file_path, :content_type, :created_at, :expires_at, :idem_key, :tenant)

-- name: insert_keyed_api_asset
-- an uploaded asset's record under its Idempotency-Key; no row back: another upload with the key committed first
INSERT INTO api_assets (id, hash, file_path, content_type, created_at, expires_at, idem_key, tenant)
VALUES (:id, :hash, :file_path, :content_type, :created_at, :expires_at, :idem_key, :tenant) ON CONFLICT (idem_key) DO NOTHING RETURNING id

-- name: extend_api_asset
-- content referenced again: its record lives at least until the new deadline (never shortened)
UPDATE api_assets SET expires_at = :until WHERE id = :id AND expires_at < :until

-- name: delete_api_asset
-- DELETE /api/v2/assets/{id}: the record goes; its content stays while a job or another record needs it
DELETE FROM api_assets WHERE id = :id RETURNING hash

-- name: prune_api_assets
-- upload records past their retention (their content then goes with prune's unreferenced assets)
DELETE FROM api_assets WHERE expires_at <= :at

-- name: announce
-- a terminal job's broker announcement ([rabbitmq] url set), in the transaction that ended it
INSERT INTO announcements (job_id, state, created_at) SELECT id, state, {now} FROM jobs WHERE id = :job_id

-- name: pending_announcements
-- the oldest announcements not yet confirmed by the broker
SELECT id, job_id, state FROM announcements WHERE sent_at IS NULL ORDER BY id LIMIT :limit

-- name: announced
-- the broker confirmed an announcement
UPDATE announcements SET sent_at = {now} WHERE id = :id

-- name: announcement_backlog
-- announcements still to publish
SELECT count(*) AS n FROM announcements WHERE sent_at IS NULL

-- name: announcements_of
-- one job's announcements, oldest first
SELECT id, job_id, state, created_at, sent_at FROM announcements WHERE job_id = :job_id ORDER BY id

-- name: advertise_api
-- a machine's API: where the other machines reach it, inserted or refreshed (a new process takes the row over)
INSERT INTO api_endpoints (host, url, pid, started_at, heartbeat_at) VALUES (:host, :url, :pid, {now}, {now})
ON CONFLICT (host) DO UPDATE SET url = excluded.url, pid = excluded.pid, heartbeat_at = excluded.heartbeat_at,
    started_at = CASE WHEN api_endpoints.pid = excluded.pid THEN api_endpoints.started_at ELSE excluded.started_at END

-- name: withdraw_api
-- a stopping API's own row goes (not a newer process's of the same host)
DELETE FROM api_endpoints WHERE host = :host AND pid = :pid

-- name: api_endpoint
-- a machine's advertised API with the age of its heartbeat on the clock that stamped it
SELECT url, {now} - heartbeat_at AS age FROM api_endpoints WHERE host = :host

-- name: declare_tenant
-- a tenant the config declares, with its weight and cap (NULL: none); its seconds used are kept
INSERT INTO tenants (name, weight, max_running) VALUES (:name, :weight, :max_running)
ON CONFLICT (name) DO UPDATE SET weight = excluded.weight, max_running = excluded.max_running

-- name: level_tenant
-- a tenant with no job queued or running (idle, or new) starts level with the least-served tenant that has work
-- (when none has, with the most-served tenant), and until an attempt of its own ends, expects its attempts to take
-- as long as that tenant's last: its share counts while it has work, so credit does not pile up while it is away
UPDATE tenants SET gpu_seconds = {greatest}(tenants.gpu_seconds, tenants.weight * coalesce(l.share,
        (SELECT max((t.gpu_seconds + t.running_seconds) / t.weight) FROM tenants t), 0)),
    running_seconds = 0,
    last_seconds = CASE WHEN tenants.last_seconds > 0 THEN tenants.last_seconds ELSE coalesce(l.seed_seconds, 0) END
FROM (SELECT 1 AS one) d LEFT JOIN (SELECT (t.gpu_seconds + t.running_seconds) / t.weight AS share,
        t.last_seconds AS seed_seconds FROM tenants t WHERE t.name <> :name
        AND (EXISTS (SELECT 1 FROM jobs j WHERE j.tenant = t.name AND j.state = 'queued')
        OR EXISTS (SELECT 1 FROM jobs j WHERE j.tenant = t.name AND j.state = 'running'))
        ORDER BY (t.gpu_seconds + t.running_seconds) / t.weight, t.name LIMIT 1) l ON 1 = 1
WHERE tenants.name = :name AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.tenant = :name AND j.state = 'queued')
    AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.tenant = :name AND j.state = 'running')

-- name: seed_default
-- before the first tenant other than default: default's jobs done so far, which no trigger counted while it was
-- alone (its seconds need no seed: the first other tenant starts level with it)
UPDATE tenants SET done = (SELECT count(*) FROM jobs WHERE tenant = 'default' AND state = 'done')
WHERE name = 'default' AND :name <> 'default' AND NOT EXISTS (SELECT 1 FROM tenants WHERE name <> 'default')

-- name: add_tenant
-- a tenant a submit names, kept as it is when known
INSERT INTO tenants (name) VALUES (:name) ON CONFLICT (name) DO NOTHING

-- name: tenant_queued
-- a tenant's queued jobs (jobs_tenant_ready)
SELECT count(*) AS n FROM jobs WHERE tenant = :name AND state = 'queued'

-- name: tenant_counts
-- each tenant's queued and running jobs (through their indexes), jobs done and seconds used (kept as they change)
SELECT t.name AS tenant, t.weight, t.max_running, t.gpu_seconds, t.done,
    (SELECT count(*) FROM jobs j WHERE j.tenant = t.name AND j.state = 'queued') AS queued,
    (SELECT count(*) FROM jobs j WHERE j.tenant = t.name AND j.state = 'running') AS running
FROM tenants t ORDER BY t.name
