UPDATE outbox_outboxmessage
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
                 'parked') RETURNING id
