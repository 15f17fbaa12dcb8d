WITH moved AS
  (UPDATE jobs_job
   SET status = 'expired',
       finished_at = %(now)s,
       updated_at = %(now)s,
       error = %(error)s
   WHERE id = ANY(ARRAY
                    (SELECT id
                     FROM jobs_job
                     WHERE status = 'queued'
                       AND start_by IS NOT NULL
                       AND start_by <= %(now)s
                     ORDER BY start_by
                     LIMIT %(limit)s
                     FOR UPDATE SKIP LOCKED))
     AND status = 'queued'
     AND start_by IS NOT NULL
     AND start_by <= %(now)s RETURNING id,
                                       scope_hash,
                                       job_id,
                                       handler,
                                       queue,
                                       status,
                                       batch_id,
                                       sequence_key),
     source AS
  (SELECT scope_hash,
          batch_id,
          sequence_key,
          'queued' AS was,
          status
   FROM moved), batch_moves AS
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
   FROM source
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
      FROM source
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
SELECT *
FROM moved
