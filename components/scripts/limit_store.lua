#!lua name=vllm_gke_limits_v1
-- The tenants' rate-limit windows (the guard's images/vllm_gke_guard/store.py calls it): a Redis
-- function the store loads at start (components/limit_store.py), so the guards' ACL allows FCALL
-- and no EVAL: no client can run code of its own. The name carries the version of the arguments.
-- KEYS: the tenant's window (a hash). ARGV: bucket ms, buckets, max requests, max tokens (0: no
-- token limit), this request's tokens. Returns {1} when admitted, else {0, reason, ms until it
-- could be}. Every loop is bounded by the bucket count.
local function take(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local width, n = tonumber(ARGV[1]), tonumber(ARGV[2])
  local max_req, max_tok, tokens = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  local key = KEYS[1]
  local head = redis.call('HMGET', key, 'last', 'req', 'tok')
  local last, req, tok = tonumber(head[1]), tonumber(head[2]) or 0, tonumber(head[3]) or 0
  local b = math.floor(now / width)
  if last ~= nil and b < last then b = last end
  if last == nil or b - last >= n then
    if last ~= nil then redis.call('DEL', key) end
    req, tok = 0, 0
  elseif b > last then
    local gone = {}
    for i = last - n + 1, b - n do
      gone[#gone + 1] = 'r' .. (i % n)
      gone[#gone + 1] = 't' .. (i % n)
    end
    local old = redis.call('HMGET', key, unpack(gone))
    for j = 1, #old, 2 do
      req = req - (tonumber(old[j]) or 0)
      tok = tok - (tonumber(old[j + 1]) or 0)
    end
    redis.call('HDEL', key, unpack(gone))
  end
  local function wait_for(prefix, excess)
    local fields = {}
    for i = b - n + 1, b do fields[#fields + 1] = prefix .. (i % n) end
    local counts = redis.call('HMGET', key, unpack(fields))
    local freed = 0
    for j = 1, #counts do
      freed = freed + (tonumber(counts[j]) or 0)
      if freed >= excess then return (b + j) * width - now end
    end
    return n * width
  end
  local verdict
  if req + 1 > max_req then
    verdict = {0, 'requests', wait_for('r', req + 1 - max_req)}
  elseif max_tok > 0 and tok + tokens > max_tok then
    verdict = {0, 'tokens', wait_for('t', tok + tokens - max_tok)}
  else
    local slot = b % n
    redis.call('HINCRBY', key, 'r' .. slot, 1)
    if tokens > 0 then redis.call('HINCRBY', key, 't' .. slot, tokens) end
    req, tok = req + 1, tok + tokens
    verdict = {1}
  end
  redis.call('HSET', key, 'last', b, 'req', req, 'tok', tok)
  redis.call('PEXPIRE', key, n * width)
  return verdict
end

redis.register_function('vllm_gke_take_v1', take)
