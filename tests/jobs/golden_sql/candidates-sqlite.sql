SELECT id,
       handler,
       queue,
       scope_hash,
       limit_key,
       cost
FROM jobs_job
WHERE status = 'queued'
  AND NOT cancel_requested
  AND NOT sequence_held
  AND next_run_at <= %(now)s
  AND attempt_count < max_attempts
  AND (start_by IS NULL
       OR start_by > %(now)s)
  AND queue NOT IN
    (SELECT name
     FROM jobs_queue
     WHERE paused)
ORDER BY priority DESC,
         fair_at,
         id
LIMIT %(limit)s
