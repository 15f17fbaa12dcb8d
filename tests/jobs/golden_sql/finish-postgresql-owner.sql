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
     AND j.leased_by = %(leased_by)s
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
     AND j.leased_by = %(leased_by)s
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
     given_back AS
  (INSERT INTO jobs_limitcounter AS c (key, running, cap) SELECT key,
                                                                 n,
                                                                 cap
   FROM
     (SELECT key, -count(*) AS n,
                   NULL::bigint AS cap
      FROM
        (SELECT k.key
         FROM finished AS s,
              jsonb_array_elements_text(s.limit_keys::jsonb) AS k(key)) AS u
      GROUP BY key) AS d
   WHERE n <> 0
   ORDER BY key ON CONFLICT (key) DO UPDATE
   SET running = c.running + excluded.running,
       cap = CASE
                 WHEN excluded.running > 0 THEN excluded.cap
                 ELSE c.cap
             END),
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
                                                         open)
SELECT 'finished' AS kind,
       token,
       id,
       status,
       queue,
       token IN
  (SELECT token
   FROM finished_attempts) AS attempt_finished,
                scope_hash,
                job_id,
                handler,
                batch_id,
                sequence_key
FROM finished
UNION ALL
SELECT 'orphan',
       token,
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
