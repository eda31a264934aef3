-- wrk script for `python -m bench api`: one fixed request, repeated.
--
--   wrk -s bench/api.lua URL -- METHOD BODY AUTHORIZATION
--
-- done() prints one JSON line as bench/intake.lua does: completed requests, non-2xx answers,
-- socket errors, p50/p99 in milliseconds.

function init(args)
  wrk.method = args[1]
  if args[2] ~= "" then
    wrk.body = args[2]
    wrk.headers["Content-Type"] = "application/json"
  end
  if args[3] ~= "" then
    wrk.headers["Authorization"] = args[3]
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "seconds": %.6f, "non2xx": %d, "socket_errors": %d, '
      .. '"p50_ms": %.3f, "p99_ms": %.3f, "sent": %d}\n',
    summary.requests, summary.duration / 1e6, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50) / 1e3, latency:percentile(99) / 1e3, summary.requests
  ))
end
