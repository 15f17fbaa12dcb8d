INSERT INTO jobs_limitcounter AS c (key, running, cap)
SELECT key,
       n,
       cap
FROM
  (SELECT key,
          -1 AS n,
          NULL::bigint AS cap
   FROM jsonb_array_elements_text(%(limit_keys)s::jsonb) AS k(key)) AS d
WHERE n <> 0
ORDER BY key ON CONFLICT (key) DO
UPDATE
SET running = c.running + excluded.running,
    cap = CASE
              WHEN excluded.running > 0 THEN excluded.cap
              ELSE c.cap
          END
