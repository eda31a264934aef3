-- wrk script for `python -m bench intake`: POSTs distinct Telegram message updates.
--
--   wrk -s bench/intake.lua URL -- FIRST_UPDATE_ID SECRET_TOKEN BODY_TEMPLATE
--
-- Thread t sends update_ids FIRST + t * 10^9 + 0, 1, 2, ...: distinct across threads and
-- connections. BODY_TEMPLATE is string.format'ed with (update_id, n, chat, chat, n), where n
-- counts this thread's requests and chat is one of 1,000 private chats, their ids spread over
-- 10^8 to 7.1 * 10^9 as Telegram's user ids are (consecutive ids would keep every index on the
-- chat next to its neighbours, as no real bot's traffic does). done() prints one JSON
-- line: completed requests, non-2xx answers, socket errors, p50/p99 in microseconds, and how
-- many requests were sent (some may still be in flight when wrk stops).

local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  first = tonumber(args[1]) + tid * 1e9
  template = args[3]
  sent = 0
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["X-Telegram-Bot-Api-Secret-Token"] = args[2]
end

function request()
  local update_id = first + sent
  local chat = 100000000 + (update_id % 1000) * 2654435761 % 7000000000
  local body = string.format(template, update_id, sent, chat, chat, sent)
  sent = sent + 1
  return wrk.format(nil, nil, nil, body)
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
