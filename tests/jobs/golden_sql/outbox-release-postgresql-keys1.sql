UPDATE outbox_outboxmessage
SET held = %s,
    updated_at = %s
WHERE id = ANY(ARRAY
                 (SELECT
                    (SELECT h.id
                     FROM outbox_outboxmessage h
                     WHERE h.key = k.column1
                       AND h.held = %s
                     ORDER BY h.id
                     LIMIT 1)
                  FROM (
                        VALUES (%s)) AS k)) RETURNING id
