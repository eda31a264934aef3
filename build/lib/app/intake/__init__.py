"""The webhook intake: POST /telegram/{bot} records each update, then answers."""
