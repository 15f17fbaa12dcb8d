WITH RECURSIVE queues(name) AS
  (SELECT
     (SELECT queue
      FROM jobs_job
      WHERE status = 'queued'
        AND sequence_held = 0
        AND NOT sequence_held
      ORDER BY queue
      LIMIT 1) AS name
   UNION ALL SELECT
     (SELECT queue
      FROM jobs_job
      WHERE status = 'queued'
        AND sequence_held = 0
        AND NOT sequence_held
        AND queue > q.name
      ORDER BY queue
      LIMIT 1)
   FROM queues AS q
   WHERE q.name IS NOT NULL),
               lines AS
  (SELECT l.name
   FROM queues AS l
   WHERE l.name IS NOT NULL
     AND l.name NOT IN
       (SELECT name
        FROM jobs_queue
        WHERE paused))
SELECT h.id,
       h.handler,
       h.queue,
       h.scope_hash,
       h.limit_key,
       h.cost
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
LIMIT %(limit)s
