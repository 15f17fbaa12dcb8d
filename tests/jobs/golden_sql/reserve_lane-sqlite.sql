INSERT INTO jobs_lane AS l (queue, scope_hash, tail, step, taken)
SELECT CAST(%(queue)s AS varchar),
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
WHERE CAST(%(units)s AS bigint) > 0 ON CONFLICT (queue,
                                                 scope_hash) DO
  UPDATE
  SET tail = MAX(excluded.tail, l.tail + excluded.taken * excluded.step),
      step = excluded.step,
      taken = excluded.taken RETURNING queue,
                                       scope_hash,
                                       tail,
                                       step
