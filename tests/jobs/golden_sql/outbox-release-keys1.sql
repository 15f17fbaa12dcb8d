UPDATE outbox_outboxmessage
SET held = %s,
    updated_at = %s
WHERE held
  AND id IN
    (SELECT
       (SELECT e.id
        FROM outbox_outboxmessage e
        WHERE e.key = k.column1
          AND NOT (e.key = '')
          AND e.status IN ('pending',
                           'parked')
        ORDER BY e.id
        LIMIT 1)
     FROM (
           VALUES (%s)) AS k) RETURNING id
