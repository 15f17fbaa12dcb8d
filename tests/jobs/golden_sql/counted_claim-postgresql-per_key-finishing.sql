WITH done AS
  (SELECT *
   FROM unnest(%(tokens)s::text[], %(outcomes)s::text[], %(results)s::text[], %(errors)s::text[], %(summaries)s::text[]) AS d(token, outcome, result_ref, error, summary)),
     orphans AS
  (SELECT done.token
   FROM done
   JOIN jobs_job AS j ON j.current_token = done.token
   WHERE j.current_token = ANY(%(tokens)s::text[])
     AND j.current_token = done.token
     AND j.status = 'running'
     AND NOT EXISTS
       (SELECT 1
        FROM jobs_jobattempt AS a
        WHERE a.job_id = j.id
          AND a.token = done.token
          AND a.status = 'running')),
     finished AS
  (UPDATE jobs_job AS j
   SET status = CASE
                    WHEN j.cancel_requested THEN 'cancelled'
                    ELSE done.outcome
                END,
                result_ref = CASE
                                 WHEN j.cancel_requested THEN NULL
                                 ELSE done.result_ref
                             END,
                             error = done.summary,
                             finished_at = %(now)s,
                             updated_at = %(now)s,
                             current_token = NULL,
                             leased_by = '',
                             lease_expires_at = NULL
   FROM done,
        jobs_jobattempt AS a
   WHERE j.current_token = ANY(%(tokens)s::text[])
     AND j.current_token = done.token
     AND j.status = 'running'
     AND a.job_id = j.id
     AND a.token = done.token
     AND a.status = 'running'
     AND NOT EXISTS
       (SELECT 1
        FROM orphans) RETURNING j.id,
                                j.status,
                                j.queue,
                                j.cancel_requested,
                                j.limit_keys,
                                done.token,
                                done.outcome,
                                done.result_ref,
                                done.error,
                                j.scope_hash,
                                j.job_id,
                                j.handler,
                                j.batch_id,
                                j.sequence_key,
                                j.attempt_count,
                                j.max_attempts),
     finished_attempts AS
  (UPDATE jobs_jobattempt AS a
   SET status = CASE
                    WHEN finished.cancel_requested
                         AND finished.outcome <> 'interrupted' THEN 'cancelled'
                    ELSE finished.outcome
                END,
                result_ref = CASE
                                 WHEN finished.cancel_requested THEN NULL
                                 ELSE finished.result_ref
                             END,
                             error = finished.error,
                             finished_at = %(now)s
   FROM finished
   WHERE a.job_id = finished.id
     AND a.token = finished.token
     AND a.status = 'running' RETURNING a.token),
     ending AS
  (SELECT scope_hash,
          batch_id,
          sequence_key,
          'running' AS was,
          CASE
              WHEN %(requeue)s
                   AND (finished.status IN ('failed')
                        AND NOT finished.cancel_requested
                        AND finished.attempt_count < finished.max_attempts) THEN 'queued'
              ELSE status
          END AS status
   FROM finished),
     batch_moves AS
  (SELECT scope_hash,
          batch_id,
          count(*) FILTER (
                           WHERE CASE
                                     WHEN status IN ('queued', 'running') THEN 'pending'
                                     WHEN status = 'interrupted' THEN 'failed'
                                     ELSE status
                                 END = 'pending') - count(*) FILTER (
                                                                     WHERE CASE
                                                                               WHEN was IN ('queued', 'running') THEN 'pending'
                                                                               WHEN was = 'interrupted' THEN 'failed'
                                                                               ELSE was
                                                                           END = 'pending') AS pending,
                   count(*) FILTER (
                                    WHERE CASE
                                              WHEN status IN ('queued', 'running') THEN 'pending'
                                              WHEN status = 'interrupted' THEN 'failed'
                                              ELSE status
                                          END = 'succeeded') - count(*) FILTER (
                                                                                WHERE CASE
                                                                                          WHEN was IN ('queued', 'running') THEN 'pending'
                                                                                          WHEN was = 'interrupted' THEN 'failed'
                                                                                          ELSE was
                                                                                      END = 'succeeded') AS succeeded,
                            count(*) FILTER (
                                             WHERE CASE
                                                       WHEN status IN ('queued', 'running') THEN 'pending'
                                                       WHEN status = 'interrupted' THEN 'failed'
                                                       ELSE status
                                                   END = 'failed') - count(*) FILTER (
                                                                                      WHERE CASE
                                                                                                WHEN was IN ('queued', 'running') THEN 'pending'
                                                                                                WHEN was = 'interrupted' THEN 'failed'
                                                                                                ELSE was
                                                                                            END = 'failed') AS failed,
                                     count(*) FILTER (
                                                      WHERE CASE
                                                                WHEN status IN ('queued', 'running') THEN 'pending'
                                                                WHEN status = 'interrupted' THEN 'failed'
                                                                ELSE status
                                                            END = 'cancelled') - count(*) FILTER (
                                                                                                  WHERE CASE
                                                                                                            WHEN was IN ('queued', 'running') THEN 'pending'
                                                                                                            WHEN was = 'interrupted' THEN 'failed'
                                                                                                            ELSE was
                                                                                                        END = 'cancelled') AS cancelled,
                                              count(*) FILTER (
                                                               WHERE CASE
                                                                         WHEN status IN ('queued', 'running') THEN 'pending'
                                                                         WHEN status = 'interrupted' THEN 'failed'
                                                                         ELSE status
                                                                     END = 'expired') - count(*) FILTER (
                                                                                                         WHERE CASE
                                                                                                                   WHEN was IN ('queued', 'running') THEN 'pending'
                                                                                                                   WHEN was = 'interrupted' THEN 'failed'
                                                                                                                   ELSE was
                                                                                                               END = 'expired') AS expired
   FROM ending
   WHERE batch_id IS NOT NULL
   GROUP BY scope_hash,
            batch_id),
     batched AS
  (INSERT INTO jobs_batch AS b (scope_hash, batch_id, digest, total, pending, succeeded, failed, cancelled, expired, created_at) SELECT m.scope_hash,
                                                                                                                                        m.batch_id,
                                                                                                                                        '',
                                                                                                                                        0,
                                                                                                                                        m.pending,
                                                                                                                                        m.succeeded,
                                                                                                                                        m.failed,
                                                                                                                                        m.cancelled,
                                                                                                                                        m.expired,
                                                                                                                                        %(now)s
   FROM
     (SELECT *
      FROM batch_moves) AS m
   WHERE EXISTS
       (SELECT 1
        FROM jobs_batch AS e
        WHERE e.scope_hash = m.scope_hash
          AND e.batch_id = m.batch_id)
   ORDER BY m.scope_hash,
            m.batch_id ON CONFLICT (scope_hash,
                                    batch_id) DO UPDATE
   SET pending = b.pending + excluded.pending,
       succeeded = b.succeeded + excluded.succeeded,
       failed = b.failed + excluded.failed,
       cancelled = b.cancelled + excluded.cancelled,
       expired = b.expired + excluded.expired,
       finished_at = CASE
                         WHEN b.pending + excluded.pending = 0 THEN COALESCE(b.finished_at, excluded.created_at)
                         ELSE NULL
                     END RETURNING scope_hash,
                                   batch_id,
                                   pending),
     thens AS
  (INSERT INTO jobs_job (scope_hash, job_id, handler, handler_version, payload_json, queue, priority, max_attempts, initial_not_before, cost, trace_context, next_run_at, fair_at, start_by, limit_key, status, attempt_count, snooze_count, cancel_requested, progress_message, error, leased_by, created_at, updated_at) SELECT COALESCE(b.then_scope_hash, b.scope_hash),
                                                                                                                                                                                                                                                                                                                                  COALESCE(b.then_job_id, b.batch_id || ':then'),
                                                                                                                                                                                                                                                                                                                                  b.then_handler,
                                                                                                                                                                                                                                                                                                                                  b.then_version,
                                                                                                                                                                                                                                                                                                                                  b.then_payload_json,
                                                                                                                                                                                                                                                                                                                                  b.then_queue,
                                                                                                                                                                                                                                                                                                                                  b.then_priority,
                                                                                                                                                                                                                                                                                                                                  b.then_max_attempts,
                                                                                                                                                                                                                                                                                                                                  b.then_not_before,
                                                                                                                                                                                                                                                                                                                                  b.then_cost,
                                                                                                                                                                                                                                                                                                                                  b.trace_context,
                                                                                                                                                                                                                                                                                                                                  COALESCE(b.then_not_before, %(now)s),
                                                                                                                                                                                                                                                                                                                                  %(now_place)s,
                                                                                                                                                                                                                                                                                                                                  NULL,
                                                                                                                                                                                                                                                                                                                                  '',
                                                                                                                                                                                                                                                                                                                                  'queued',
                                                                                                                                                                                                                                                                                                                                  0,
                                                                                                                                                                                                                                                                                                                                  0,
                                                                                                                                                                                                                                                                                                                                  FALSE,
                                                                                                                                                                                                                                                                                                                                  '',
                                                                                                                                                                                                                                                                                                                                  '',
                                                                                                                                                                                                                                                                                                                                  '',
                                                                                                                                                                                                                                                                                                                                  %(now)s,
                                                                                                                                                                                                                                                                                                                                  %(now)s
   FROM
     (SELECT b.scope_hash,
             b.batch_id
      FROM batched AS b
      JOIN batch_moves AS m ON m.scope_hash = b.scope_hash
      AND m.batch_id = b.batch_id
      WHERE b.pending = 0
        AND m.pending < 0) AS d
   JOIN jobs_batch AS b ON b.scope_hash = d.scope_hash
   AND b.batch_id = d.batch_id
   WHERE b.then_handler IS NOT NULL
   ORDER BY b.scope_hash,
            b.batch_id ON CONFLICT (scope_hash,
                                    job_id) DO NOTHING RETURNING queue,
                                                                 next_run_at,
                                                                 CASE
                                                                     WHEN next_run_at <= %(now)s THEN pg_notify(%(channel)s, queue)
                                                                 END AS woke),
     sequenced AS
  (INSERT INTO jobs_sequence AS s (scope_hash, sequence_key, open, updated_at) SELECT m.scope_hash,
                                                                                      m.sequence_key,
                                                                                      m.open,
                                                                                      %(now)s
   FROM
     (SELECT scope_hash,
             sequence_key,
             count(*) FILTER (
                              WHERE status IN ('queued', 'running')) - count(*) FILTER (
                                                                                        WHERE was IN ('queued', 'running')) AS open
      FROM ending
      WHERE sequence_key IS NOT NULL
      GROUP BY scope_hash,
               sequence_key) AS m
   WHERE EXISTS
       (SELECT 1
        FROM jobs_sequence AS e
        WHERE e.scope_hash = m.scope_hash
          AND e.sequence_key = m.sequence_key)
   ORDER BY m.scope_hash,
            m.sequence_key ON CONFLICT (scope_hash,
                                        sequence_key) DO UPDATE
   SET open = s.open + excluded.open,
              updated_at = excluded.updated_at RETURNING scope_hash,
                                                         sequence_key,
                                                         open),
     freed AS
  (SELECT key,
          count(*) AS n
   FROM
     (SELECT k.key
      FROM finished AS s,
           jsonb_array_elements_text(s.limit_keys::jsonb) AS k(key)) AS f
   GROUP BY key),
     claimed AS
  (UPDATE jobs_job
   SET status = 'running',
       attempt_count = attempt_count + 1,
       current_token = lpad(to_hex((extract(epoch
                                            FROM clock_timestamp()) * 1000)::bigint), 12, '0') || left(replace(gen_random_uuid()::text, '-', ''), 12) || right(gen_random_uuid()::text, 8),
       leased_by = %(worker_id)s,
       lease_expires_at = %(lease_expires_at)s,
       started_at = %(now)s,
       updated_at = %(now)s,
       progress = NULL,
       progress_message = '',
       error = '',
       result_ref = NULL,
       finished_at = NULL,
       limit_keys = NULLIF(array_to_json(array_remove(ARRAY[CASE
                                                                WHEN handler = %(lim_0)s::text
                                                                     AND limit_key <> '' THEN %(lim_0_key)s::text || '#' || limit_key
                                                            END], NULL))::text, '[]')
   WHERE NOT EXISTS
       (SELECT 1
        FROM orphans)
     AND id = ANY(ARRAY
                    (WITH RECURSIVE queues(name) AS
                       (SELECT
                          (SELECT queue
                           FROM jobs_job
                           WHERE status = 'queued'
                             AND NOT sequence_held
                           ORDER BY queue
                           LIMIT 1) AS name
                        UNION ALL SELECT
                          (SELECT queue
                           FROM jobs_job
                           WHERE status = 'queued'
                             AND NOT sequence_held
                             AND queue > q.name
                           ORDER BY queue
                           LIMIT 1)
                        FROM queues AS q
                        WHERE q.name IS NOT NULL), lines AS
                       (SELECT l.name
                        FROM queues AS l
                        WHERE l.name IS NOT NULL
                          AND l.name NOT IN
                            (SELECT name
                             FROM jobs_queue
                             WHERE paused)), firsts AS
                       (SELECT h.queue, h.priority, h.fair_at, h.id
                        FROM lines AS l
                        CROSS JOIN LATERAL
                          (SELECT fair_at, id, priority, queue
                           FROM jobs_job
                           WHERE queue = l.name
                             AND status = 'queued'
                             AND NOT cancel_requested
                             AND NOT sequence_held
                             AND next_run_at <=
                               (SELECT CAST(%(now)s AS timestamptz))
                             AND attempt_count < max_attempts
                             AND (start_by IS NULL
                                  OR start_by >
                                    (SELECT CAST(%(now)s AS timestamptz)))
                           ORDER BY priority DESC, fair_at, id
                           LIMIT
                             (SELECT CAST(%(limit)s AS bigint))) AS h
                        ORDER BY h.priority DESC, h.fair_at, h.id
                        LIMIT
                          (SELECT CAST(%(limit)s AS bigint))), shares AS
                       (SELECT queue AS name, count(*) AS n
                        FROM firsts
                        GROUP BY queue) SELECT h.id
                     FROM shares AS s
                     CROSS JOIN LATERAL
                       (SELECT id
                        FROM jobs_job
                        WHERE queue = s.name
                          AND status = 'queued'
                          AND NOT cancel_requested
                          AND NOT sequence_held
                          AND next_run_at <=
                            (SELECT CAST(%(now)s AS timestamptz))
                          AND attempt_count < max_attempts
                          AND (start_by IS NULL
                               OR start_by >
                                 (SELECT CAST(%(now)s AS timestamptz)))
                        ORDER BY priority DESC, fair_at, id
                        LIMIT s.n
                        FOR UPDATE SKIP LOCKED) AS h)) RETURNING id,
                                                                 scope_hash,
                                                                 job_id,
                                                                 current_token AS token,
                                                                 attempt_count AS attempt,
                                                                 max_attempts,
                                                                 handler,
                                                                 handler_version,
                                                                 payload_json,
                                                                 queue,
                                                                 trace_context,
                                                                 sequence_key,
                                                                 attempt_count + snooze_count + release_count + interruption_count AS number,
                                                                 priority,
                                                                 next_run_at,
                                                                 fair_at,
                                                                 leased_by,
                                                                 started_at,
                                                                 limit_keys,
                                                                 limit_key,
                                                                 cost),
     attempts AS
  (INSERT INTO jobs_jobattempt (job_id, number, token, status, worker_id, progress, progress_message, error, result_ref, started_at, finished_at) SELECT id, number, token,
                                                                                                                                                                     'running',
                                                                                                                                                                     leased_by,
                                                                                                                                                                     NULL,
                                                                                                                                                                     '',
                                                                                                                                                                     '',
                                                                                                                                                                     NULL,
                                                                                                                                                                     started_at,
                                                                                                                                                                     NULL
   FROM claimed),
     counted AS
  (INSERT INTO jobs_limitcounter AS c (key, running, cap) SELECT key,
                                                                 n,
                                                                 cap
   FROM
     (SELECT u.key,
             sum(u.n) AS n,
             max(u.cap) AS cap
      FROM
        (SELECT t.key,
                1 AS n,
                t.cap
         FROM claimed AS c
         CROSS JOIN LATERAL unnest(ARRAY[CASE
                                             WHEN c.handler = %(lim_0)s::text
                                                  AND c.limit_key <> '' THEN %(lim_0_key)s::text || '#' || c.limit_key
                                         END], ARRAY[%(lim_0_pkey)s::bigint]) AS t(key, cap)
         WHERE t.key IS NOT NULL
         UNION ALL SELECT key, -n,
                                NULL::bigint
         FROM freed) AS u
      GROUP BY u.key) AS d
   WHERE n <> 0
   ORDER BY key ON CONFLICT (key) DO UPDATE
   SET running = c.running + excluded.running,
       cap = CASE
                 WHEN excluded.running > 0 THEN excluded.cap
                 ELSE c.cap
             END)
SELECT 'claimed' AS kind,
       id,
       scope_hash,
       job_id,
       token,
       attempt,
       max_attempts,
       handler,
       handler_version,
       payload_json,
       queue,
       trace_context,
       sequence_key, number, priority,
                             next_run_at,
                             fair_at,
                             leased_by,
                             started_at,
                             NULL AS status,
                             NULL AS attempt_finished,
                             NULL AS batch_id
FROM claimed
UNION ALL
SELECT 'finished',
       id,
       scope_hash,
       job_id,
       token,
       NULL,
       NULL,
       handler,
       NULL,
       NULL,
       queue,
       NULL,
       sequence_key,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       status,
       token IN
  (SELECT token
   FROM finished_attempts), batch_id
FROM finished
UNION ALL
SELECT 'orphan',
       NULL,
       NULL,
       NULL,
       token,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL
FROM orphans
