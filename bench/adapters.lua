-- wrk script for `python -m bench adapters`: POSTs one forwarded update, as the service sends
-- it, again and again (the adapters verify each one; none of them refuses a replay within
-- the signature's tolerance, and the handlers store nothing).
--
--   wrk -s bench/adapters.lua URL -- BODY NAME VALUE [NAME VALUE ...]
--
-- done() prints bench/intake.lua's JSON line.

local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  sent = 0
  wrk.method = "POST"
  wrk.body = args[1]
  for i = 2, #args, 2 do
    wrk.headers[args[i]] = args[i + 1]
  end
end

function request()
  sent = sent + 1
  return wrk.format()
end

function done(summary, latency, requests)
  local total = 0
  for _, thread in ipairs(threads) do
    total = total + thread:get("sent")
  end
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "seconds": %.6f, "non2xx": %d, "socket_errors": %d, '
      .. '"p50_ms": %.3f, "p99_ms": %.3f, "sent": %d}\n',
    summary.requests, summary.duration / 1e6, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50) / 1e3, latency:percentile(99) / 1e3, total
  ))
end
