WITH keys AS
  (SELECT *
   FROM (
         VALUES ('q'::text,
                 %(lim_0)s::text,
                 %(lim_0_key)s::text,
                 NULL::bigint,
                 NULL::bigint,
                 NULL::bigint,
                 NULL::bigint,
                 NULL::bigint,
                 COALESCE(NULL::bigint, NULL::bigint),
                 %(lim_0_rk_count)s::bigint,
                 NULL::bigint,
                 NULL::bigint,
                 %(lim_0_rk_span)s::bigint)) AS k(kind, name, key, room, units, scope, keyed, cap, r_cap, rk_count, rk_burst, rk_t, rk_span)),
     candidates AS
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
      WHERE q.name IS NOT NULL),
                  lines AS
     (SELECT l.name
      FROM queues AS l
      WHERE l.name IS NOT NULL
        AND l.name NOT IN
          (SELECT name
           FROM jobs_queue
           WHERE paused)
        AND NOT EXISTS
          (SELECT 1
           FROM keys AS k
           WHERE k.kind = 'q'
             AND k.name = l.name
             AND (k.room < 1
                  OR k.units < 1))),
                  firsts AS
     (SELECT h.queue,
             h.priority,
             h.fair_at,
             h.id
      FROM lines AS l
      CROSS JOIN LATERAL
        (SELECT cost,
                fair_at,
                handler,
                id,
                limit_key,
                priority,
                queue,
                scope_hash
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
           AND NOT EXISTS
             (SELECT 1
              FROM keys AS k_q
              WHERE k_q.kind = 'q'
                AND k_q.name = jobs_job.queue
                AND COALESCE(k_q.rk_burst, k_q.rk_count) IS NOT NULL
                AND jobs_job.limit_key <> ''
                AND COALESCE(
                               (SELECT CASE
                                           WHEN k_q.rk_t IS NOT NULL THEN (%(now_ns)s::bigint + k_q.rk_burst * k_q.rk_t - GREATEST(b.tat, %(now_ns)s::bigint)) / k_q.rk_t
                                           ELSE k_q.rk_count -
                                                  (SELECT COALESCE(sum((e->>1)::bigint), 0)
                                                   FROM jsonb_array_elements(COALESCE(b.stamps, jsonb_build_array())) AS e
                                                   WHERE (e->>0)::bigint > %(now_ns)s::bigint - k_q.rk_span)
                                       END
                                FROM jobs_ratebucket AS b
                                WHERE b.key = k_q.key || '#' || jobs_job.limit_key), k_q.rk_burst, k_q.rk_count) < LEAST(jobs_job.cost, COALESCE(k_q.rk_burst, k_q.rk_count)))
         ORDER BY priority DESC,
                  fair_at,
                  id
         LIMIT
           (SELECT CAST(%(limit)s AS bigint))) AS h
      ORDER BY h.priority DESC,
               h.fair_at,
               h.id
      LIMIT
        (SELECT CAST(%(limit)s AS bigint))),
                  shares AS
     (SELECT queue AS name,
             count(*) AS n
      FROM firsts
      GROUP BY queue) SELECT h.id,
                             h.handler,
                             h.queue,
                             h.scope_hash,
                             h.limit_key,
                             h.cost,
                             h.priority,
                             h.fair_at
   FROM shares AS s
   CROSS JOIN LATERAL
     (SELECT id,
             handler,
             queue,
             scope_hash,
             limit_key,
             cost,
             priority,
             fair_at
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
        AND NOT EXISTS
          (SELECT 1
           FROM keys AS k_q
           WHERE k_q.kind = 'q'
             AND k_q.name = jobs_job.queue
             AND COALESCE(k_q.rk_burst, k_q.rk_count) IS NOT NULL
             AND jobs_job.limit_key <> ''
             AND COALESCE(
                            (SELECT CASE
                                        WHEN k_q.rk_t IS NOT NULL THEN (%(now_ns)s::bigint + k_q.rk_burst * k_q.rk_t - GREATEST(b.tat, %(now_ns)s::bigint)) / k_q.rk_t
                                        ELSE k_q.rk_count -
                                               (SELECT COALESCE(sum((e->>1)::bigint), 0)
                                                FROM jsonb_array_elements(COALESCE(b.stamps, jsonb_build_array())) AS e
                                                WHERE (e->>0)::bigint > %(now_ns)s::bigint - k_q.rk_span)
                                    END
                             FROM jobs_ratebucket AS b
                             WHERE b.key = k_q.key || '#' || jobs_job.limit_key), k_q.rk_burst, k_q.rk_count) < LEAST(jobs_job.cost, COALESCE(k_q.rk_burst, k_q.rk_count)))
      ORDER BY priority DESC,
               fair_at,
               id
      LIMIT s.n
      FOR UPDATE SKIP LOCKED) AS h),
     ranks AS
  (SELECT c.*,
          sum(LEAST(c.cost, COALESCE(k_q.rk_burst, k_q.rk_count, 1))) OVER (PARTITION BY c.queue, c.limit_key
                                                                            ORDER BY priority DESC, fair_at, id) AS u_qk
   FROM candidates AS c
   LEFT JOIN keys AS k_q ON k_q.kind = 'q'
   AND k_q.name = c.queue),
     ranked AS
  (SELECT r.id,
          CASE
              WHEN NOT (COALESCE(k_q.rk_burst, k_q.rk_count) IS NULL
                        OR r.limit_key = ''
                        OR r.u_qk <= COALESCE(
                                                (SELECT CASE
                                                            WHEN k_q.rk_t IS NOT NULL THEN (%(now_ns)s::bigint + k_q.rk_burst * k_q.rk_t - GREATEST(b.tat, %(now_ns)s::bigint)) / k_q.rk_t
                                                            ELSE k_q.rk_count -
                                                                   (SELECT COALESCE(sum((e->>1)::bigint), 0)
                                                                    FROM jsonb_array_elements(COALESCE(b.stamps, jsonb_build_array())) AS e
                                                                    WHERE (e->>0)::bigint > %(now_ns)s::bigint - k_q.rk_span)
                                                        END
                                                 FROM jobs_ratebucket AS b
                                                 WHERE b.key = k_q.key || '#' || r.limit_key), k_q.rk_burst, k_q.rk_count)) THEN 'queue.rate_per_key'
          END AS refused
   FROM ranks AS r
   LEFT JOIN keys AS k_q ON k_q.kind = 'q'
   AND k_q.name = r.queue),
     chosen AS
  (SELECT id
   FROM ranked
   WHERE refused IS NULL),
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
       limit_keys = NULL
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
     rates AS
  (SELECT *
   FROM (
         VALUES ('q'::text,
                 %(lim_0)s::text,
                 %(lim_0_key)s::text,
                 TRUE,
                 %(lim_0_rk_count)s::bigint,
                 NULL::bigint,
                 NULL::bigint,
                 %(lim_0_rk_span)s::bigint,
                 %(lim_0_rk_grain)s::bigint)) AS r(kind, name, key, keyed, count, burst, t, span, grain)),
     buckets AS
  (INSERT INTO jobs_ratebucket AS b (key, tat, horizon, stamps, used, cap, window_start, ends) SELECT n.key,
                                                                                                      %(now_ns)s::bigint + n.units * n.t,
                                                                                                      COALESCE(%(now_ns)s::bigint + n.burst * n.t, %(now_ns)s::bigint - n.span - n.span / 8),
                                                                                                      CASE
                                                                                                          WHEN n.t IS NULL THEN jsonb_build_array(jsonb_build_array(((%(now_ns)s::bigint + n.grain - 1) / n.grain) * n.grain, n.units))
                                                                                                      END,
                                                                                                      CASE
                                                                                                          WHEN n.t IS NULL THEN n.units
                                                                                                      END,
                                                                                                      n.count,
                                                                                                      CASE
                                                                                                          WHEN n.t IS NULL THEN %(now_ns)s::bigint - n.span
                                                                                                      END,
                                                                                                      COALESCE(%(now_ns)s::bigint + n.units * n.t, ((%(now_ns)s::bigint + n.grain - 1) / n.grain) * n.grain + n.span)
   FROM
     (SELECT CASE
                 WHEN r.keyed THEN r.key || '#' || c.limit_key
                 ELSE r.key
             END AS key,
             sum(LEAST(c.cost, COALESCE(r.burst, r.count))) AS units,
             min(r.count) AS count,
             min(r.burst) AS burst,
             min(r.t) AS t,
             min(r.span) AS span,
             min(r.grain) AS grain
      FROM claimed AS c
      JOIN rates AS r ON ((r.kind = 'h'
                           AND r.name = c.handler)
                          OR (r.kind = 'q'
                              AND r.name = c.queue))
      AND (NOT r.keyed
           OR c.limit_key <> '')
      GROUP BY 1) AS n
   ORDER BY n.key ON CONFLICT (key) DO UPDATE
   SET tat = GREATEST(b.tat, %(now_ns)s::bigint) + excluded.tat - %(now_ns)s::bigint,
       horizon = excluded.horizon,
       stamps = CASE
                    WHEN excluded.stamps IS NOT NULL THEN
                           (SELECT jsonb_agg(jsonb_build_array(s.t, s.n)
                                             ORDER BY s.t)
                            FROM
                              (SELECT (e->>0)::bigint AS t,
                                      sum((e->>1)::bigint) AS n
                               FROM jsonb_array_elements(COALESCE(b.stamps, jsonb_build_array()) || excluded.stamps) AS e
                               WHERE (e->>0)::bigint > excluded.horizon
                               GROUP BY 1) AS s)
                END,
                used = CASE
                           WHEN excluded.stamps IS NOT NULL THEN excluded.used +
                                  (SELECT COALESCE(sum((e->>1)::bigint), 0)
                                   FROM jsonb_array_elements(COALESCE(b.stamps, jsonb_build_array())) AS e
                                   WHERE (e->>0)::bigint > excluded.window_start)
                       END,
                       cap = excluded.cap,
                       window_start = excluded.window_start,
                       ends = CASE
                                  WHEN excluded.tat IS NOT NULL THEN GREATEST(b.tat, %(now_ns)s::bigint) + excluded.tat - %(now_ns)s::bigint
                                  ELSE GREATEST(b.ends, excluded.ends)
                              END),
     first AS
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
      WHERE q.name IS NOT NULL),
                  lines AS
     (SELECT l.name
      FROM queues AS l
      WHERE l.name IS NOT NULL
        AND l.name NOT IN
          (SELECT name
           FROM jobs_queue
           WHERE paused)) SELECT h.id,
                                 h.handler,
                                 h.queue,
                                 h.scope_hash,
                                 h.limit_key,
                                 h.cost
   FROM lines AS l
   CROSS JOIN LATERAL
     (SELECT cost,
             fair_at,
             handler,
             id,
             limit_key,
             priority,
             queue,
             scope_hash
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
      ORDER BY priority DESC,
               fair_at,
               id
      LIMIT
        (SELECT CAST(%(limit)s AS bigint))) AS h
   ORDER BY h.priority DESC,
            h.fair_at,
            h.id
   LIMIT
     (SELECT CAST(%(limit)s AS bigint))), held AS
  (SELECT f.queue,
          f.handler,
          COALESCE(r.refused, CASE
                                  WHEN EXISTS
                                         (SELECT 1
                                          FROM keys AS k_q
                                          WHERE k_q.kind = 'q'
                                            AND k_q.name = f.queue
                                            AND COALESCE(k_q.rk_burst, k_q.rk_count) IS NOT NULL
                                            AND f.limit_key <> ''
                                            AND COALESCE(
                                                           (SELECT CASE
                                                                       WHEN k_q.rk_t IS NOT NULL THEN (%(now_ns)s::bigint + k_q.rk_burst * k_q.rk_t - GREATEST(b.tat, %(now_ns)s::bigint)) / k_q.rk_t
                                                                       ELSE k_q.rk_count -
                                                                              (SELECT COALESCE(sum((e->>1)::bigint), 0)
                                                                               FROM jsonb_array_elements(COALESCE(b.stamps, jsonb_build_array())) AS e
                                                                               WHERE (e->>0)::bigint > %(now_ns)s::bigint - k_q.rk_span)
                                                                   END
                                                            FROM jobs_ratebucket AS b
                                                            WHERE b.key = k_q.key || '#' || f.limit_key), k_q.rk_burst, k_q.rk_count) < LEAST(f.cost, COALESCE(k_q.rk_burst, k_q.rk_count))) THEN 'queue.rate_per_key'
                              END) AS rule
   FROM first AS f
   LEFT JOIN ranked AS r ON r.id = f.id
   WHERE NOT EXISTS
       (SELECT 1
        FROM chosen
        WHERE chosen.id = f.id))
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
                             started_at,
                             NULL::text AS rule,
                             NULL::bigint AS n
FROM claimed
UNION ALL
SELECT 'held',
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       held_handler,
       NULL,
       NULL,
       held_queue,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       NULL,
       rule,
       n
FROM
  (SELECT queue AS held_queue,
          handler AS held_handler,
          rule,
          count(*) AS n
   FROM held
   WHERE rule IS NOT NULL
   GROUP BY 1,
            2,
            3) AS h
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
       NULL,
       NULL::text,
       NULL::bigint
FROM
  (SELECT 1
   WHERE EXISTS
       (SELECT 1
        FROM ranked
        WHERE refused IS NOT NULL)) AS s
