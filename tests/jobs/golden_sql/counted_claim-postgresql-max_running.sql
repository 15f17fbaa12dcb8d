WITH claimed AS
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
                                                                WHEN handler = %(lim_0)s::text THEN %(lim_0_key)s::text
                                                            END], NULL))::text, '[]')
   WHERE id = ANY(ARRAY
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
                                             WHEN c.handler = %(lim_0)s::text THEN %(lim_0_key)s::text
                                         END], ARRAY[%(lim_0_max)s::bigint]) AS t(key, cap)
         WHERE t.key IS NOT NULL) AS u
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
                             started_at
FROM claimed
