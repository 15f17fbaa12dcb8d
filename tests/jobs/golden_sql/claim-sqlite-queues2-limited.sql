UPDATE jobs_job
SET status = 'running',
    attempt_count = attempt_count + 1,
    current_token = lower(hex(randomblob(16))),
    leased_by = %(worker_id)s,
    lease_expires_at = %(lease_expires_at)s,
    started_at = %(now)s,
    updated_at = %(now)s,
    progress = NULL,
    progress_message = '',
    error = '',
    result_ref = NULL,
    finished_at = NULL,
    limit_keys = NULL
WHERE id IN
    (WITH RECURSIVE queues(name) AS
       (SELECT CAST(%(queue_0)s AS varchar) AS name
        UNION SELECT CAST(%(queue_1)s AS varchar) AS name),
                    lines AS
       (SELECT l.name
        FROM queues AS l
        WHERE l.name IS NOT NULL
          AND l.name NOT IN
            (SELECT name
             FROM jobs_queue
             WHERE paused)) SELECT h.id
     FROM lines AS l,
          jobs_job AS h
     WHERE h.id IN
         (SELECT id
          FROM jobs_job
          WHERE queue = l.name
            AND status = 'queued'
            AND sequence_held = 0
            AND NOT sequence_held
            AND status = 'queued'
            AND NOT cancel_requested
            AND NOT sequence_held
            AND next_run_at <= %(now)s
            AND attempt_count < max_attempts
            AND (start_by IS NULL
                 OR start_by > %(now)s)
          ORDER BY priority DESC,
                   fair_at,
                   id
          LIMIT %(limit)s)
     ORDER BY h.priority DESC,
              h.fair_at,
              h.id
     LIMIT %(limit)s) RETURNING id,
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
                                cost
