WITH r AS
  (SELECT r.ord - 1 AS ord,
          (%(scopes)s::varchar[])[(r.v->>0)::int] AS scope_hash,
          (r.v->>1)::varchar AS job_id,
          (r.v->>2)::varchar AS handler,
          (r.v->>3)::int AS handler_version,
          (r.v->>4)::text AS payload_json,
          (r.v->>5)::varchar AS queue,
          (r.v->>6)::smallint AS priority,
          (r.v->>7)::int AS max_attempts,
          (r.v->>8)::timestamptz AS initial_not_before,
          (r.v->>9)::int AS cost,
          %(trace_context)s::text AS trace_context,
          (r.v->>10)::bigint AS due_place,
          (r.v->>11)::timestamptz AS start_by,
          (r.v->>12)::varchar AS limit_key
   FROM jsonb_array_elements(%(rows)s::jsonb) WITH
   ORDINALITY AS r(v, ord)),
     laned AS
  (SELECT ord,
          queue,
          scope_hash,
          priority,
          row_number() OVER (PARTITION BY queue, scope_hash
                             ORDER BY ord) AS rank,
          count(*) OVER (PARTITION BY queue, scope_hash) AS n
   FROM r
   WHERE queue = ANY(%(fair_queues)s::varchar[])
     AND (initial_not_before IS NULL
          OR initial_not_before <= %(created_at)s)),
     lanes AS
  (INSERT INTO jobs_lane AS l (queue, scope_hash, tail, step, taken) SELECT g.queue,
                                                                            g.scope_hash,
                                                                            COALESCE(
                                                                                       (SELECT h.fair_at
                                                                                        FROM jobs_job AS h
                                                                                        WHERE h.queue = g.queue
                                                                                          AND h.priority = g.priority
                                                                                          AND h.status = 'queued'
                                                                                          AND NOT h.sequence_held
                                                                                        ORDER BY h.fair_at
                                                                                        LIMIT 1), %(now_place)s::bigint) + g.n * CAST(ROUND(CAST(%(quantum)s AS double precision) / COALESCE(
                                                                                                                                                                                               (SELECT sw.weight
                                                                                                                                                                                                FROM jobs_scopeweight AS sw
                                                                                                                                                                                                WHERE sw.scope_hash = g.scope_hash), 1.0)) AS bigint),
                                                                            CAST(ROUND(CAST(%(quantum)s AS double precision) / COALESCE(
                                                                                                                                          (SELECT sw.weight
                                                                                                                                           FROM jobs_scopeweight AS sw
                                                                                                                                           WHERE sw.scope_hash = g.scope_hash), 1.0)) AS bigint),
                                                                            g.n
   FROM
     (SELECT queue,
             scope_hash,
             max(priority) AS priority,
             max(n) AS n
      FROM laned
      GROUP BY queue,
               scope_hash) AS g ON CONFLICT (queue,
                                             scope_hash) DO UPDATE
   SET tail = GREATEST(excluded.tail, l.tail + excluded.taken * excluded.step),
       step = excluded.step,
       taken = excluded.taken RETURNING queue,
                                        scope_hash,
                                        tail,
                                        step),
     placed AS
  (SELECT r.*,
          COALESCE(lanes.tail - (laned.n - laned.rank) * lanes.step, r.due_place) AS fair_at
   FROM r
   LEFT JOIN laned ON laned.ord = r.ord
   LEFT JOIN lanes ON lanes.queue = laned.queue
   AND lanes.scope_hash = laned.scope_hash),
     inserted AS
  (INSERT INTO jobs_job (scope_hash, job_id, handler, handler_version, payload_json, queue, priority, max_attempts, initial_not_before, cost, trace_context, next_run_at, fair_at, start_by, limit_key, status, attempt_count, snooze_count, cancel_requested, progress_message, error, leased_by, created_at, updated_at) SELECT scope_hash,
                                                                                                                                                                                                                                                                                                                                  job_id,
                                                                                                                                                                                                                                                                                                                                  handler,
                                                                                                                                                                                                                                                                                                                                  handler_version,
                                                                                                                                                                                                                                                                                                                                  payload_json,
                                                                                                                                                                                                                                                                                                                                  queue,
                                                                                                                                                                                                                                                                                                                                  priority,
                                                                                                                                                                                                                                                                                                                                  max_attempts,
                                                                                                                                                                                                                                                                                                                                  initial_not_before,
                                                                                                                                                                                                                                                                                                                                  cost,
                                                                                                                                                                                                                                                                                                                                  trace_context,
                                                                                                                                                                                                                                                                                                                                  COALESCE(initial_not_before, %(created_at)s),
                                                                                                                                                                                                                                                                                                                                  fair_at,
                                                                                                                                                                                                                                                                                                                                  start_by,
                                                                                                                                                                                                                                                                                                                                  limit_key,
                                                                                                                                                                                                                                                                                                                                  %(status)s,
                                                                                                                                                                                                                                                                                                                                  %(attempt_count)s,
                                                                                                                                                                                                                                                                                                                                  %(snooze_count)s,
                                                                                                                                                                                                                                                                                                                                  %(cancel_requested)s,
                                                                                                                                                                                                                                                                                                                                  %(progress_message)s,
                                                                                                                                                                                                                                                                                                                                  %(error)s,
                                                                                                                                                                                                                                                                                                                                  %(leased_by)s,
                                                                                                                                                                                                                                                                                                                                  %(created_at)s,
                                                                                                                                                                                                                                                                                                                                  %(updated_at)s
   FROM placed AS r
   WHERE NOT EXISTS
       (SELECT
        FROM jobs_job AS j
        WHERE j.scope_hash = r.scope_hash
          AND j.job_id = r.job_id) RETURNING scope_hash,
                                             job_id,
                                             queue,
                                             next_run_at)
SELECT CASE
           WHEN
                  (SELECT count(*)
                   FROM inserted) = %(count)s THEN '{}'::bigint[]
           ELSE ARRAY
                  (SELECT r.ord
                   FROM r
                   WHERE NOT EXISTS
                       (SELECT
                        FROM inserted AS i
                        WHERE i.scope_hash = r.scope_hash
                          AND i.job_id = r.job_id)
                   ORDER BY r.ord)
       END AS skipped,

  (SELECT count(pg_notify(%(channel)s, d.queue))
   FROM
     (SELECT DISTINCT queue
      FROM inserted
      WHERE next_run_at <= %(created_at)s) AS d) AS notified
