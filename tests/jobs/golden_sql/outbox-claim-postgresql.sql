UPDATE outbox_outboxmessage
SET attempts = attempts + 1,
    leased_by = %s,
    lease_token = %s,
    lease_expires_at = %s,
    updated_at = %s
WHERE id = ANY(ARRAY
                 (SELECT id
                  FROM outbox_outboxmessage
                  WHERE status = %s
                    AND lease_token IS NULL
                    AND held = %s
                    AND available_at <= %s
                  ORDER BY available_at, id
                  LIMIT %s
                  FOR UPDATE SKIP LOCKED)) RETURNING id,
                                                     message_id,
                                                     event_type,
                                                     key,
                                                     payload_json,
                                                     headers,
                                                     attempts,
                                                     created_at
