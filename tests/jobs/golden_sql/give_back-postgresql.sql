INSERT INTO jobs_limitcounter AS c (key, running)
SELECT key,
       n
FROM
  (SELECT key,
          -1 AS n
   FROM jsonb_array_elements_text(%(limit_keys)s::jsonb) AS k(key)) AS d
WHERE n <> 0
ORDER BY key ON CONFLICT (key) DO
UPDATE
SET running = c.running + excluded.running
