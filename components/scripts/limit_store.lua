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

-- A time-shared GPU's lease (models[].sleepMode; the guard's images/vllm_gke_guard/swap.py): one
-- awake server per GPU. KEYS: the GPU's lease (a hash; it expires with its holder's lease).
-- ARGV: op (take, renew, drop), the server, the lease's ms, the ms a waiter's claim stays fresh.
-- Returns {1 if the server holds the lease, the holder, the waiter}. A take that finds the lease
-- held records the server as its waiter unless another's claim is fresher: the holder sees it on
-- renewing and yields once idle; a free lease goes to its fresh waiter first.
-- Only a drop frees the lease at once (it marks the key free). A take that finds no key at all (a
-- holder that stopped renewing, or a store restarted empty: it persists nothing) cannot tell
-- whether a server is still awake: it fences the key and is granted only a lease's time later,
-- once a holder that lost it has seen that on renewing and slept.
local function lease(KEYS, ARGV)
  local key, op, me, ttl, fresh = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local h = redis.call('HMGET', key, 'holder', 'want', 'want_at', 'free', 'fence')
  local holder, want = h[1] or '', h[2] or ''
  if want ~= '' and now - (tonumber(h[3]) or 0) > fresh then want = '' end
  if op == 'drop' then
    if holder == me then
      -- free until taken: a day, then fenced again like a missing key
      redis.call('HDEL', key, 'holder')
      redis.call('HSET', key, 'free', now)
      redis.call('PEXPIRE', key, 86400000)
    end
    return {0, '', want}
  end
  local free = h[4] ~= false and h[4] ~= nil
  if op == 'take' and holder == '' and not free then
    local fence = tonumber(h[5])
    if fence == nil then
      fence = now
      redis.call('HSET', key, 'fence', now)
      redis.call('PEXPIRE', key, 2 * ttl)  -- outlives the fence, so it is not fenced anew
    end
    free = now - fence >= ttl
  end
  if holder == me or (op == 'take' and holder == '' and free and (want == '' or want == me)) then
    redis.call('HSET', key, 'holder', me)
    redis.call('HDEL', key, 'free', 'fence')
    if want == me then
      redis.call('HDEL', key, 'want', 'want_at')
      want = ''
    end
    redis.call('PEXPIRE', key, ttl)
    return {1, me, want}
  end
  if op == 'take' and (want == '' or want == me) then
    redis.call('HSET', key, 'want', me, 'want_at', now)
    want = me
  end
  return {0, holder, want}
end

redis.register_function('vllm_gke_lease_v1', lease)
