INSERT INTO jobs_queue (name, paused, paused_at, updated_at)
VALUES (%(name)s, TRUE, %(now)s, %(now)s) ON CONFLICT (name) DO
UPDATE
SET paused = TRUE,
             paused_at = excluded.paused_at,
             updated_at = excluded.updated_at
WHERE NOT jobs_queue.paused RETURNING name
