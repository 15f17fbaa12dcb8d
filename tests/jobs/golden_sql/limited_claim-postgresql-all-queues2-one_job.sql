WITH keys AS
  (SELECT *
   FROM (
         VALUES ('h'::text,
                 %(lim_0)s::text,
                 %(lim_0_key)s::text,
                 %(lim_0_max)s::bigint - (COALESCE(
                                                     (SELECT running
                                                      FROM jobs_limitcounter
                                                      WHERE key = %(lim_0_key)s::text), 0)),
                 COALESCE(
                            (SELECT CASE
                                        WHEN %(lim_0_r_t)s::bigint IS NOT NULL THEN (%(now_ns)s::bigint + %(lim_0_r_burst)s::bigint * %(lim_0_r_t)s::bigint - GREATEST(b.tat, %(now_ns)s::bigint)) / %(lim_0_r_t)s::bigint
                                        ELSE NULL::bigint -
                                               (SELECT COALESCE(sum((e->>1)::bigint), 0)
                                                FROM jsonb_array_elements(COALESCE(b.stamps, jsonb_build_array())) AS e
                                                WHERE (e->>0)::bigint > %(now_ns)s::bigint - NULL::bigint)
                                    END
                             FROM jobs_ratebucket AS b
                             WHERE b.key = %(lim_0_key)s::text), %(lim_0_r_burst)s::bigint, NULL::bigint),
                 %(lim_0_scope)s::bigint,
                 %(lim_0_pkey)s::bigint,
                 %(lim_0_max)s::bigint,
                 COALESCE(%(lim_0_r_burst)s::bigint, NULL::bigint),
                 %(lim_0_rk_count)s::bigint,
                 NULL::bigint,
                 NULL::bigint,
                 %(lim_0_rk_span)s::bigint), ('q'::text,
                                              %(lim_1)s::text,
                                              %(lim_1_key)s::text,
                                              %(lim_1_max)s::bigint - (COALESCE(
                                                                                  (SELECT running
                                                                                   FROM jobs_limitcounter
                                                                                   WHERE key = %(lim_1_key)s::text), 0)),
                                              COALESCE(
                                                         (SELECT CASE
                                                                     WHEN NULL::bigint IS NOT NULL THEN (%(now_ns)s::bigint + NULL::bigint * NULL::bigint - GREATEST(b.tat, %(now_ns)s::bigint)) / NULL::bigint
                                                                     ELSE %(lim_1_r_count)s::bigint -
                                                                            (SELECT COALESCE(sum((e->>1)::bigint), 0)
                                                                             FROM jsonb_array_elements(COALESCE(b.stamps, jsonb_build_array())) AS e
                                                                             WHERE (e->>0)::bigint > %(now_ns)s::bigint - %(lim_1_r_span)s::bigint)
                                                                 END
                                                          FROM jobs_ratebucket AS b
                                                          WHERE b.key = %(lim_1_key)s::text), NULL::bigint, %(lim_1_r_count)s::bigint),
                                              %(lim_1_scope)s::bigint,
                                              %(lim_1_pkey)s::bigint,
                                              %(lim_1_max)s::bigint,
                                              COALESCE(NULL::bigint, %(lim_1_r_count)s::bigint),
                                              NULL::bigint,
                                              %(lim_1_rk_burst)s::bigint,
                                              %(lim_1_rk_t)s::bigint,
                                              NULL::bigint)) AS k(kind, name, key, room, units, scope, keyed, cap, r_cap, rk_count, rk_burst, rk_t, rk_span)),
     candidates AS
  (SELECT id,
          handler,
          queue,
          scope_hash,
          limit_key,
          cost,
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
     AND queue IN (%(queue_0)s,
                   %(queue_1)s)
     AND scope_hash = %(scope_hash)s
     AND job_id = %(job_id)s
     AND NOT EXISTS
       (SELECT 1
        FROM keys AS k_h
        WHERE k_h.kind = 'h'
          AND k_h.name = jobs_job.handler
          AND k_h.room < 1)
     AND NOT EXISTS
       (SELECT 1
        FROM keys AS k_h
        WHERE k_h.kind = 'h'
          AND k_h.name = jobs_job.handler
          AND k_h.scope IS NOT NULL
          AND (COALESCE(
                          (SELECT running
                           FROM jobs_limitcounter
                           WHERE key = k_h.key || ':' || jobs_job.scope_hash), 0)) >= k_h.scope)
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
     AND NOT EXISTS
       (SELECT 1
        FROM keys AS k_h
        WHERE k_h.kind = 'h'
          AND k_h.name = jobs_job.handler
          AND k_h.units < LEAST(jobs_job.cost, k_h.r_cap))
     AND NOT EXISTS
       (SELECT 1
        FROM keys AS k_h
        WHERE k_h.kind = 'h'
          AND k_h.name = jobs_job.handler
          AND COALESCE(k_h.rk_burst, k_h.rk_count) IS NOT NULL
          AND jobs_job.limit_key <> ''
          AND COALESCE(
                         (SELECT CASE
                                     WHEN k_h.rk_t IS NOT NULL THEN (%(now_ns)s::bigint + k_h.rk_burst * k_h.rk_t - GREATEST(b.tat, %(now_ns)s::bigint)) / k_h.rk_t
                                     ELSE k_h.rk_count -
                                            (SELECT COALESCE(sum((e->>1)::bigint), 0)
                                             FROM jsonb_array_elements(COALESCE(b.stamps, jsonb_build_array())) AS e
                                             WHERE (e->>0)::bigint > %(now_ns)s::bigint - k_h.rk_span)
                                 END
                          FROM jobs_ratebucket AS b
                          WHERE b.key = k_h.key || '#' || jobs_job.limit_key), k_h.rk_burst, k_h.rk_count) < LEAST(jobs_job.cost, COALESCE(k_h.rk_burst, k_h.rk_count)))
     AND NOT EXISTS
       (SELECT 1
        FROM keys AS k_q
        WHERE k_q.kind = 'q'
          AND k_q.name = jobs_job.queue
          AND k_q.room < 1)
     AND NOT EXISTS
       (SELECT 1
        FROM keys AS k_q
        WHERE k_q.kind = 'q'
          AND k_q.name = jobs_job.queue
          AND k_q.scope IS NOT NULL
          AND (COALESCE(
                          (SELECT running
                           FROM jobs_limitcounter
                           WHERE key = k_q.key || ':' || jobs_job.scope_hash), 0)) >= k_q.scope)
     AND NOT EXISTS
       (SELECT 1
        FROM keys AS k_q
        WHERE k_q.kind = 'q'
          AND k_q.name = jobs_job.queue
          AND k_q.keyed IS NOT NULL
          AND jobs_job.limit_key <> ''
          AND (COALESCE(
                          (SELECT running
                           FROM jobs_limitcounter
                           WHERE key = k_q.key || '#' || jobs_job.limit_key), 0)) >= k_q.keyed)
     AND NOT EXISTS
       (SELECT 1
        FROM keys AS k_q
        WHERE k_q.kind = 'q'
          AND k_q.name = jobs_job.queue
          AND k_q.units < LEAST(jobs_job.cost, k_q.r_cap))
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
   LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED),
     ranks AS
  (SELECT c.*,
          row_number() OVER (PARTITION BY c.handler
                             ORDER BY priority DESC, fair_at, id) AS n_h,
          row_number() OVER (PARTITION BY c.handler, c.scope_hash
                             ORDER BY priority DESC, fair_at, id) AS n_hs,
          row_number() OVER (PARTITION BY c.handler, c.limit_key
                             ORDER BY priority DESC, fair_at, id) AS n_hk,
          sum(LEAST(c.cost, COALESCE(k_h.r_cap, 1))) OVER (PARTITION BY c.handler
                                                           ORDER BY priority DESC, fair_at, id) AS u_h,
          sum(LEAST(c.cost, COALESCE(k_h.rk_burst, k_h.rk_count, 1))) OVER (PARTITION BY c.handler, c.limit_key
                                                                            ORDER BY priority DESC, fair_at, id) AS u_hk,
          row_number() OVER (PARTITION BY c.queue
                             ORDER BY priority DESC, fair_at, id) AS n_q,
          row_number() OVER (PARTITION BY c.queue, c.scope_hash
                             ORDER BY priority DESC, fair_at, id) AS n_qs,
          row_number() OVER (PARTITION BY c.queue, c.limit_key
                             ORDER BY priority DESC, fair_at, id) AS n_qk,
          sum(LEAST(c.cost, COALESCE(k_q.r_cap, 1))) OVER (PARTITION BY c.queue
                                                           ORDER BY priority DESC, fair_at, id) AS u_q,
          sum(LEAST(c.cost, COALESCE(k_q.rk_burst, k_q.rk_count, 1))) OVER (PARTITION BY c.queue, c.limit_key
                                                                            ORDER BY priority DESC, fair_at, id) AS u_qk
   FROM candidates AS c
   LEFT JOIN keys AS k_h ON k_h.kind = 'h'
   AND k_h.name = c.handler
   LEFT JOIN keys AS k_q ON k_q.kind = 'q'
   AND k_q.name = c.queue),
     ranked AS
  (SELECT r.id,
          CASE
              WHEN NOT (k_h.room IS NULL
                        OR r.n_h <= k_h.room) THEN 'handler.max_running'
              WHEN NOT (k_h.scope IS NULL
                        OR r.n_hs + (COALESCE(
                                                (SELECT running
                                                 FROM jobs_limitcounter
                                                 WHERE key = k_h.key || ':' || r.scope_hash), 0)) <= k_h.scope) THEN 'handler.max_running_per_scope'
              WHEN NOT (k_h.keyed IS NULL
                        OR r.limit_key = ''
                        OR r.n_hk + (COALESCE(
                                                (SELECT running
                                                 FROM jobs_limitcounter
                                                 WHERE key = k_h.key || '#' || r.limit_key), 0)) <= k_h.keyed) THEN 'handler.max_running_per_key'
              WHEN NOT (k_h.units IS NULL
                        OR r.u_h <= k_h.units) THEN 'handler.rate'
              WHEN NOT (COALESCE(k_h.rk_burst, k_h.rk_count) IS NULL
                        OR r.limit_key = ''
                        OR r.u_hk <= COALESCE(
                                                (SELECT CASE
                                                            WHEN k_h.rk_t IS NOT NULL THEN (%(now_ns)s::bigint + k_h.rk_burst * k_h.rk_t - GREATEST(b.tat, %(now_ns)s::bigint)) / k_h.rk_t
                                                            ELSE k_h.rk_count -
                                                                   (SELECT COALESCE(sum((e->>1)::bigint), 0)
                                                                    FROM jsonb_array_elements(COALESCE(b.stamps, jsonb_build_array())) AS e
                                                                    WHERE (e->>0)::bigint > %(now_ns)s::bigint - k_h.rk_span)
                                                        END
                                                 FROM jobs_ratebucket AS b
                                                 WHERE b.key = k_h.key || '#' || r.limit_key), k_h.rk_burst, k_h.rk_count)) THEN 'handler.rate_per_key'
              WHEN NOT (k_q.room IS NULL
                        OR r.n_q <= k_q.room) THEN 'queue.max_running'
              WHEN NOT (k_q.scope IS NULL
                        OR r.n_qs + (COALESCE(
                                                (SELECT running
                                                 FROM jobs_limitcounter
                                                 WHERE key = k_q.key || ':' || r.scope_hash), 0)) <= k_q.scope) THEN 'queue.max_running_per_scope'
              WHEN NOT (k_q.keyed IS NULL
                        OR r.limit_key = ''
                        OR r.n_qk + (COALESCE(
                                                (SELECT running
                                                 FROM jobs_limitcounter
                                                 WHERE key = k_q.key || '#' || r.limit_key), 0)) <= k_q.keyed) THEN 'queue.max_running_per_key'
              WHEN NOT (k_q.units IS NULL
                        OR r.u_q <= k_q.units) THEN 'queue.rate'
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
   LEFT JOIN keys AS k_h ON k_h.kind = 'h'
   AND k_h.name = r.handler
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
       limit_keys = NULLIF(array_to_json(array_remove(ARRAY[CASE
                                                                WHEN handler = %(lim_0)s::text THEN %(lim_0_key)s::text
                                                            END, CASE
                                                                     WHEN handler = %(lim_0)s::text THEN %(lim_0_key)s::text || ':' || scope_hash
                                                                 END, CASE
                                                                          WHEN handler = %(lim_0)s::text
                                                                               AND limit_key <> '' THEN %(lim_0_key)s::text || '#' || limit_key
                                                                      END, CASE
                                                                               WHEN queue = %(lim_1)s::text THEN %(lim_1_key)s::text
                                                                           END, CASE
                                                                                    WHEN queue = %(lim_1)s::text THEN %(lim_1_key)s::text || ':' || scope_hash
                                                                                END, CASE
                                                                                         WHEN queue = %(lim_1)s::text
                                                                                              AND limit_key <> '' THEN %(lim_1_key)s::text || '#' || limit_key
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
                                         END, CASE
                                                  WHEN c.handler = %(lim_0)s::text THEN %(lim_0_key)s::text || ':' || c.scope_hash
                                              END, CASE
                                                       WHEN c.handler = %(lim_0)s::text
                                                            AND c.limit_key <> '' THEN %(lim_0_key)s::text || '#' || c.limit_key
                                                   END, CASE
                                                            WHEN c.queue = %(lim_1)s::text THEN %(lim_1_key)s::text
                                                        END, CASE
                                                                 WHEN c.queue = %(lim_1)s::text THEN %(lim_1_key)s::text || ':' || c.scope_hash
                                                             END, CASE
                                                                      WHEN c.queue = %(lim_1)s::text
                                                                           AND c.limit_key <> '' THEN %(lim_1_key)s::text || '#' || c.limit_key
                                                                  END], ARRAY[%(lim_0_max)s::bigint, %(lim_0_scope)s::bigint, %(lim_0_pkey)s::bigint, %(lim_1_max)s::bigint, %(lim_1_scope)s::bigint, %(lim_1_pkey)s::bigint]) AS t(key, cap)
         WHERE t.key IS NOT NULL) AS u
      GROUP BY u.key) AS d
   WHERE n <> 0
   ORDER BY key ON CONFLICT (key) DO UPDATE
   SET running = c.running + excluded.running,
       cap = CASE
                 WHEN excluded.running > 0 THEN excluded.cap
                 ELSE c.cap
             END),
     rates AS
  (SELECT *
   FROM (
         VALUES ('h'::text,
                 %(lim_0)s::text,
                 %(lim_0_key)s::text,
                 FALSE,
                 NULL::bigint,
                 %(lim_0_r_burst)s::bigint,
                 %(lim_0_r_t)s::bigint,
                 NULL::bigint,
                 NULL::bigint), ('h'::text,
                                 %(lim_0)s::text,
                                 %(lim_0_key)s::text,
                                 TRUE,
                                 %(lim_0_rk_count)s::bigint,
                                 NULL::bigint,
                                 NULL::bigint,
                                 %(lim_0_rk_span)s::bigint,
                                 %(lim_0_rk_grain)s::bigint), ('q'::text,
                                                               %(lim_1)s::text,
                                                               %(lim_1_key)s::text,
                                                               FALSE,
                                                               %(lim_1_r_count)s::bigint,
                                                               NULL::bigint,
                                                               NULL::bigint,
                                                               %(lim_1_r_span)s::bigint,
                                                               %(lim_1_r_grain)s::bigint), ('q'::text,
                                                                                            %(lim_1)s::text,
                                                                                            %(lim_1_key)s::text,
                                                                                            TRUE,
                                                                                            NULL::bigint,
                                                                                            %(lim_1_rk_burst)s::bigint,
                                                                                            %(lim_1_rk_t)s::bigint,
                                                                                            NULL::bigint,
                                                                                            NULL::bigint)) AS r(kind, name, key, keyed, count, burst, t, span, grain)),
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
  (SELECT id,
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
     AND queue IN (%(queue_0)s,
                   %(queue_1)s)
     AND scope_hash = %(scope_hash)s
     AND job_id = %(job_id)s
   ORDER BY priority DESC,
            fair_at,
            id
   LIMIT %(limit)s), held AS
  (SELECT f.queue,
          f.handler,
          COALESCE(r.refused, CASE
                                  WHEN EXISTS
                                         (SELECT 1
                                          FROM keys AS k_h
                                          WHERE k_h.kind = 'h'
                                            AND k_h.name = f.handler
                                            AND k_h.room < 1) THEN 'handler.max_running'
                                  WHEN EXISTS
                                         (SELECT 1
                                          FROM keys AS k_h
                                          WHERE k_h.kind = 'h'
                                            AND k_h.name = f.handler
                                            AND k_h.scope IS NOT NULL
                                            AND (COALESCE(
                                                            (SELECT running
                                                             FROM jobs_limitcounter
                                                             WHERE key = k_h.key || ':' || f.scope_hash), 0)) >= k_h.scope) THEN 'handler.max_running_per_scope'
                                  WHEN EXISTS
                                         (SELECT 1
                                          FROM keys AS k_h
                                          WHERE k_h.kind = 'h'
                                            AND k_h.name = f.handler
                                            AND k_h.keyed IS NOT NULL
                                            AND f.limit_key <> ''
                                            AND (COALESCE(
                                                            (SELECT running
                                                             FROM jobs_limitcounter
                                                             WHERE key = k_h.key || '#' || f.limit_key), 0)) >= k_h.keyed) THEN 'handler.max_running_per_key'
                                  WHEN EXISTS
                                         (SELECT 1
                                          FROM keys AS k_h
                                          WHERE k_h.kind = 'h'
                                            AND k_h.name = f.handler
                                            AND k_h.units < LEAST(f.cost, k_h.r_cap)) THEN 'handler.rate'
                                  WHEN EXISTS
                                         (SELECT 1
                                          FROM keys AS k_h
                                          WHERE k_h.kind = 'h'
                                            AND k_h.name = f.handler
                                            AND COALESCE(k_h.rk_burst, k_h.rk_count) IS NOT NULL
                                            AND f.limit_key <> ''
                                            AND COALESCE(
                                                           (SELECT CASE
                                                                       WHEN k_h.rk_t IS NOT NULL THEN (%(now_ns)s::bigint + k_h.rk_burst * k_h.rk_t - GREATEST(b.tat, %(now_ns)s::bigint)) / k_h.rk_t
                                                                       ELSE k_h.rk_count -
                                                                              (SELECT COALESCE(sum((e->>1)::bigint), 0)
                                                                               FROM jsonb_array_elements(COALESCE(b.stamps, jsonb_build_array())) AS e
                                                                               WHERE (e->>0)::bigint > %(now_ns)s::bigint - k_h.rk_span)
                                                                   END
                                                            FROM jobs_ratebucket AS b
                                                            WHERE b.key = k_h.key || '#' || f.limit_key), k_h.rk_burst, k_h.rk_count) < LEAST(f.cost, COALESCE(k_h.rk_burst, k_h.rk_count))) THEN 'handler.rate_per_key'
                                  WHEN EXISTS
                                         (SELECT 1
                                          FROM keys AS k_q
                                          WHERE k_q.kind = 'q'
                                            AND k_q.name = f.queue
                                            AND k_q.room < 1) THEN 'queue.max_running'
                                  WHEN EXISTS
                                         (SELECT 1
                                          FROM keys AS k_q
                                          WHERE k_q.kind = 'q'
                                            AND k_q.name = f.queue
                                            AND k_q.scope IS NOT NULL
                                            AND (COALESCE(
                                                            (SELECT running
                                                             FROM jobs_limitcounter
                                                             WHERE key = k_q.key || ':' || f.scope_hash), 0)) >= k_q.scope) THEN 'queue.max_running_per_scope'
                                  WHEN EXISTS
                                         (SELECT 1
                                          FROM keys AS k_q
                                          WHERE k_q.kind = 'q'
                                            AND k_q.name = f.queue
                                            AND k_q.keyed IS NOT NULL
                                            AND f.limit_key <> ''
                                            AND (COALESCE(
                                                            (SELECT running
                                                             FROM jobs_limitcounter
                                                             WHERE key = k_q.key || '#' || f.limit_key), 0)) >= k_q.keyed) THEN 'queue.max_running_per_key'
                                  WHEN EXISTS
                                         (SELECT 1
                                          FROM keys AS k_q
                                          WHERE k_q.kind = 'q'
                                            AND k_q.name = f.queue
                                            AND k_q.units < LEAST(f.cost, k_q.r_cap)) THEN 'queue.rate'
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
