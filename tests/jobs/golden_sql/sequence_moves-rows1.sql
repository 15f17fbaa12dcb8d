INSERT INTO jobs_sequence AS s (scope_hash, sequence_key, open, updated_at)
SELECT m.scope_hash,
       m.sequence_key,
       m.open,
       %(now)s
FROM
  (SELECT v.column1 AS scope_hash,
          v.column2 AS sequence_key,
          v.column3 AS open
   FROM (
         VALUES (%(scope_hash_0)s,
                 %(sequence_key_0)s,
                 %(open_0)s)) AS v) AS m
WHERE EXISTS
    (SELECT 1
     FROM jobs_sequence AS e
     WHERE e.scope_hash = m.scope_hash
       AND e.sequence_key = m.sequence_key)
ORDER BY m.scope_hash,
         m.sequence_key ON CONFLICT (scope_hash,
                                     sequence_key) DO
UPDATE
SET open = s.open + excluded.open,
           updated_at = excluded.updated_at RETURNING scope_hash,
                                                      sequence_key,
                                                      open
