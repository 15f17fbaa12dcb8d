INSERT INTO outbox_outboxmessage (message_id, event_type, key, payload_json, headers, status, attempts, available_at, created_at, updated_at, last_error, leased_by, held)
VALUES (%s, %s, %s, %s, %s, %s, 0, %s, %s, %s, '', '', EXISTS (SELECT e.id FROM outbox_outboxmessage e WHERE e.key = %s AND NOT (e.key = '') AND e.status IN ('pending', 'parked') ORDER BY e.id LIMIT 1))
