WITH tail AS
  (UPDATE outbox_outboxmessage
   SET followed = TRUE
   WHERE id =
       (SELECT t.id
        FROM outbox_outboxmessage t
        WHERE t.key = %s
          AND NOT (t.key = '')
          AND t.status IN ('pending',
                           'parked')
        ORDER BY t.id DESC
        LIMIT 1)
     AND status IN ('pending',
                    'parked') RETURNING id)
INSERT INTO outbox_outboxmessage (message_id, event_type, key, payload_json, headers, status, attempts, available_at, created_at, updated_at, last_error, leased_by, held, followed)
VALUES (%s, %s, %s, %s, %s, %s, 0, %s, %s, %s, '', '', EXISTS (SELECT 1 FROM tail), FALSE)
