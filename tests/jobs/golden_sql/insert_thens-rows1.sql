INSERT INTO jobs_job (scope_hash, job_id, handler, handler_version, payload_json, queue, priority, max_attempts, initial_not_before, cost, trace_context, next_run_at, fair_at, start_by, limit_key, status, attempt_count, snooze_count, cancel_requested, progress_message, error, leased_by, created_at, updated_at)
SELECT COALESCE(b.then_scope_hash, b.scope_hash),
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
  (SELECT v.column1 AS scope_hash,
          v.column2 AS batch_id
   FROM (
         VALUES (%(scope_hash_0)s,
                 %(batch_id_0)s)) AS v) AS d
JOIN jobs_batch AS b ON b.scope_hash = d.scope_hash
AND b.batch_id = d.batch_id
WHERE b.then_handler IS NOT NULL
ORDER BY b.scope_hash,
         b.batch_id ON CONFLICT (scope_hash,
                                 job_id) DO NOTHING RETURNING queue,
                                                              next_run_at
