INSERT INTO outbox_outboxmessage (message_id, event_type, key, payload_json, headers, status, attempts, available_at, created_at, updated_at, last_error, leased_by, held, followed)
VALUES (%s, %s, %s, %s, %s, %s, 0, %s, %s, %s, '', '', FALSE, FALSE)
