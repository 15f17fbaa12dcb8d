WITH keys AS
  (SELECT *
   FROM (
         VALUES ('h'::text,
                 %(lim_0)s::text,
                 NULL::bigint,
                 NULL::bigint,
                 %(lim_0_key)s::text,
                 FALSE,
                 NULL::bigint,
                 %(lim_0_pkey)s::bigint)) AS k(kind, name, room, scope, key, rated, cap, keyed)),
     candidates AS
  (SELECT id,
          handler,
          queue,
          scope_hash,
          limit_key,
          priority,
          fair_at
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
     AND NOT EXISTS
       (SELECT 1
        FROM keys AS k_h
        WHERE k_h.kind = 'h'
          AND k_h.name = jobs_job.handler
          AND k_h.keyed IS NOT NULL
          AND jobs_job.limit_key <> ''
          AND (COALESCE(
                          (SELECT running
                           FROM jobs_limitcounter
                           WHERE key = k_h.key || '#' || jobs_job.limit_key), 0)) >= k_h.keyed)
   ORDER BY priority DESC,
            fair_at,
            id
   LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED),
     ranked AS
  (SELECT id,
          handler,
          queue,
          scope_hash,
          limit_key,
          row_number() OVER (PARTITION BY handler, limit_key
                             ORDER BY priority DESC, fair_at, id) AS n_hk
   FROM candidates),
     ample AS
  (SELECT
     (SELECT bool_and(room IS NULL
                      OR room >= %(limit)s)
      FROM keys)
   AND NOT EXISTS
     (SELECT 1
      FROM candidates AS r
      JOIN keys AS k_h ON k_h.kind = 'h'
      AND k_h.name = r.handler
      WHERE k_h.keyed IS NOT NULL
        AND r.limit_key <> ''
        AND k_h.keyed < %(limit)s + (COALESCE(
                                                (SELECT running
                                                 FROM jobs_limitcounter
                                                 WHERE key = k_h.key || '#' || r.limit_key), 0))) AS yes),
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
   WHERE NOT
       (SELECT yes
        FROM ample)
     AND (k_h.keyed IS NULL
          OR r.limit_key = ''
          OR r.n_hk + (COALESCE(
                                  (SELECT running
                                   FROM jobs_limitcounter
                                   WHERE key = k_h.key || '#' || r.limit_key), 0)) <= k_h.keyed)),
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
                                     sequence_key,
                                     attempt_count + snooze_count + release_count + interruption_count AS number,
                                     priority,
                                     next_run_at,
                                     fair_at,
                                     leased_by,
                                     started_at,
                                     limit_keys),
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
             COALESCE(
                        (SELECT k.cap
                         FROM keys AS k
                         WHERE k.key = u.key),
                        (SELECT k.scope
                         FROM keys AS k
                         WHERE k.key || ':' || right(u.key, 64) = u.key),
                        (SELECT k.keyed
                         FROM keys AS k
                         WHERE strpos(u.key, '#') > 0
                           AND k.key = split_part(u.key, '#', 1))) AS cap
      FROM
        (SELECT key,
                1 AS n
         FROM
           (SELECT k.key
            FROM claimed AS s,
                 jsonb_array_elements_text(s.limit_keys::jsonb) AS k(key)) AS c) AS u
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
