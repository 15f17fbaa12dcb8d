UPDATE jobs_queue
SET paused = FALSE,
             paused_at = NULL,
             updated_at = %(now)s
WHERE name = %(name)s
  AND paused RETURNING name
