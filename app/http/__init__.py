"""What faces the network, before any route runs: the HTTP server's connection limits
(`server`, which enforces `connection_limits`), the request guard that refuses before a body
is read (`guard`) with the API keys it looks up (`keys`), and the one strict JSON reader the
webhook and the `/v1` API share (`strict_json`). Below the intake and the API, which both stand
on it."""
