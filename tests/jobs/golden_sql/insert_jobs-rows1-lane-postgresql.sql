WITH lane AS
  (INSERT INTO jobs_lane AS l (queue, scope_hash, tail, step, taken) SELECT CAST(%(queue)s AS varchar),
                                                                            CAST(%(scope_hash)s AS varchar),
                                                                            COALESCE(
                                                                                       (SELECT h.fair_at
                                                                                        FROM jobs_job AS h
                                                                                        WHERE h.queue = CAST(%(queue)s AS varchar)
                                                                                          AND h.priority = CAST(%(priority)s AS smallint)
                                                                                          AND h.status = 'queued'
                                                                                          AND NOT h.sequence_held
                                                                                        ORDER BY h.fair_at
                                                                                        LIMIT 1), CAST(%(now_place)s AS bigint)) + CAST(%(units)s AS bigint) * w.step,
                                                                            w.step,
                                                                            CAST(%(units)s AS bigint)
   FROM
     (SELECT CAST(ROUND(CAST(%(quantum)s AS double precision) / COALESCE(
                                                                           (SELECT sw.weight
                                                                            FROM jobs_scopeweight AS sw
                                                                            WHERE sw.scope_hash = CAST(%(scope_hash)s AS varchar)), 1.0)) AS bigint) AS step) AS w
   WHERE CAST(%(units)s AS bigint) > 0
     AND NOT EXISTS
       (SELECT 1
        FROM jobs_job AS j
        WHERE j.scope_hash = CAST(%(scope_hash)s AS varchar)
          AND j.job_id = CAST(%(job_id)s AS varchar)) ON CONFLICT (queue,
                                                                   scope_hash) DO
     UPDATE
     SET tail = GREATEST(excluded.tail, l.tail + excluded.taken * excluded.step),
         step = excluded.step,
         taken = excluded.taken RETURNING queue,
                                          scope_hash,
                                          tail,
                                          step)
INSERT INTO jobs_job (scope_hash, job_id, handler, handler_version, payload_json, queue, priority, max_attempts, initial_not_before, cost, trace_context, next_run_at, fair_at, start_by, limit_key, status, attempt_count, snooze_count, cancel_requested, progress_message, error, leased_by, created_at, updated_at)
VALUES (%(scope_hash_0)s, %(job_id_0)s, %(handler_0)s, %(handler_version_0)s, %(payload_json_0)s, %(queue_0)s, %(priority_0)s, %(max_attempts_0)s, %(initial_not_before_0)s, %(cost_0)s, %(trace_context_0)s, %(next_run_at_0)s, COALESCE((SELECT tail FROM lane), %(fair_at_0)s), %(start_by_0)s, %(limit_key_0)s, %(status_0)s, %(attempt_count_0)s, %(snooze_count_0)s, %(cancel_requested_0)s, %(progress_message_0)s, %(error_0)s, %(leased_by_0)s, %(created_at_0)s, %(updated_at_0)s) ON CONFLICT (scope_hash, job_id) DO NOTHING RETURNING scope_hash,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                   job_id,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                   queue,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                   fair_at
