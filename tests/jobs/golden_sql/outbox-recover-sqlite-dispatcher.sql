UPDATE outbox_outboxmessage
SET status = CASE
                 WHEN attempts >= %s THEN %s
                 ELSE %s
             END,
             last_error = CASE
                              WHEN attempts >= %s THEN %s
                              ELSE last_error
                          END,
                          leased_by = '',
                          lease_token = NULL,
                          lease_expires_at = NULL,
                          updated_at = %s
WHERE id IN
    (SELECT id
     FROM outbox_outboxmessage
     WHERE status = %s
       AND lease_token IS NOT NULL
       AND leased_by = %s
     ORDER BY lease_expires_at,
              id
     LIMIT %s) RETURNING status
