WITH running AS
  (SELECT handler,
          queue,
          scope_hash
   FROM jobs_job
   WHERE current_token IS NOT NULL
     AND status = 'running'
     AND (handler IN (%(lim_0)s)
          OR queue IN (%(lim_1)s))),
     keys AS
  (SELECT *
   FROM (
         VALUES ('h'::text,
                 %(lim_0)s::text,
                 LEAST(%(lim_0_max)s::bigint -
                         (SELECT count(*)
                          FROM running
                          WHERE handler = %(lim_0)s), %(lim_0_rate)s::bigint -
                         (SELECT count(*)
                          FROM jobs_claimstart
                          WHERE key = %(lim_0_key)s
                            AND started_at > %(lim_0_since)s)),
                 %(lim_0_scope)s::bigint,
                 %(lim_0_key)s::text), ('q'::text,
                                        %(lim_1)s::text,
                                        LEAST(%(lim_1_max)s::bigint -
                                                (SELECT count(*)
                                                 FROM running
                                                 WHERE queue = %(lim_1)s), %(lim_1_rate)s::bigint -
                                                (SELECT count(*)
                                                 FROM jobs_claimstart
                                                 WHERE key = %(lim_1_key)s
                                                   AND started_at > %(lim_1_since)s)),
                                        %(lim_1_scope)s::bigint,
                                        %(lim_1_key)s::text)) AS k(kind, name, room, scope, key)),
     candidates AS
  (SELECT id,
          handler,
          queue,
          scope_hash,
          priority,
          next_run_at
   FROM jobs_job
   WHERE status = 'queued'
     AND NOT cancel_requested
     AND next_run_at <= %(now)s
     AND attempt_count < max_attempts
     AND queue NOT IN
       (SELECT name
        FROM jobs_queue
        WHERE paused)
     AND handler NOT IN
       (SELECT name
        FROM keys
        WHERE kind = 'h'
          AND room <= 0)
     AND scope_hash || handler NOT IN
       (SELECT u.scope_hash || u.handler
        FROM running AS u
        JOIN keys AS k ON k.kind = 'h'
        AND k.name = u.handler
        WHERE k.scope IS NOT NULL
        GROUP BY u.scope_hash,
                 u.handler,
                 k.scope
        HAVING count(*) >= k.scope)
     AND queue NOT IN
       (SELECT name
        FROM keys
        WHERE kind = 'q'
          AND room <= 0)
     AND scope_hash || queue NOT IN
       (SELECT u.scope_hash || u.queue
        FROM running AS u
        JOIN keys AS k ON k.kind = 'q'
        AND k.name = u.queue
        WHERE k.scope IS NOT NULL
        GROUP BY u.scope_hash,
                 u.queue,
                 k.scope
        HAVING count(*) >= k.scope)
   ORDER BY priority DESC,
            next_run_at,
            id
   LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED),
     ranked AS
  (SELECT id,
          handler,
          queue,
          scope_hash,
          row_number() OVER (PARTITION BY handler
                             ORDER BY priority DESC, next_run_at, id) AS n_h,
          row_number() OVER (PARTITION BY handler, scope_hash
                             ORDER BY priority DESC, next_run_at, id) AS n_hs,
          row_number() OVER (PARTITION BY queue
                             ORDER BY priority DESC, next_run_at, id) AS n_q,
          row_number() OVER (PARTITION BY queue, scope_hash
                             ORDER BY priority DESC, next_run_at, id) AS n_qs
   FROM candidates),
     ample AS
  (SELECT bool_and((room IS NULL
                    OR room >= %(limit)s)
                   AND (scope IS NULL
                        OR scope >= %(limit)s + COALESCE(
                                                           (SELECT max(n)
                                                            FROM
                                                              (SELECT count(*) AS n
                                                               FROM running AS u
                                                               WHERE (k.kind = 'h'
                                                                      AND u.handler = k.name)
                                                                 OR (k.kind = 'q'
                                                                     AND u.queue = k.name)
                                                               GROUP BY u.scope_hash) AS busiest), 0))) AS yes
   FROM keys AS k),
     chosen AS
  (SELECT id
   FROM candidates
   WHERE
       (SELECT yes
        FROM ample)
   UNION ALL SELECT r.id
   FROM ranked AS r
   LEFT JOIN keys AS k_h ON k_h.kind = 'h'
   AND k_h.name = r.handler
   LEFT JOIN keys AS k_q ON k_q.kind = 'q'
   AND k_q.name = r.queue
   WHERE NOT
       (SELECT yes
        FROM ample)
     AND (k_h.room IS NULL
          OR r.n_h <= k_h.room)
     AND (k_h.scope IS NULL
          OR r.n_hs +
            (SELECT count(*)
             FROM running AS u
             WHERE u.handler = r.handler
               AND u.scope_hash = r.scope_hash) <= k_h.scope)
     AND (k_q.room IS NULL
          OR r.n_q <= k_q.room)
     AND (k_q.scope IS NULL
          OR r.n_qs +
            (SELECT count(*)
             FROM running AS u
             WHERE u.queue = r.queue
               AND u.scope_hash = r.scope_hash) <= k_q.scope)),
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
       finished_at = NULL
   WHERE id = ANY(ARRAY
                    (SELECT id
                     FROM chosen))
     AND status = 'queued' RETURNING id,
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
                                     attempt_count + snooze_count + release_count AS number,
                                     priority,
                                     next_run_at,
                                     leased_by,
                                     started_at),
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
     starts AS
  (INSERT INTO jobs_claimstart (key, started_at) SELECT k.key,
                                                        %(now)s
   FROM claimed AS c
   JOIN keys AS k ON k.key IS NOT NULL
   AND ((k.kind = 'h'
         AND k.name = c.handler)
        OR (k.kind = 'q'
            AND k.name = c.queue)))
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
       trace_context, number, priority,
                              next_run_at,
                              leased_by,
                              started_at
FROM claimed
UNION ALL
SELECT 'skipped',
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
FROM
  (SELECT 1
   WHERE
       (SELECT count(*)
        FROM candidates) >
       (SELECT count(*)
        FROM chosen)) AS s
