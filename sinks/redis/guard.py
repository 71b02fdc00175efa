"""The version guard: Lua scripts that apply a change only if its version is newer than the key's.

Loaded once per server (``SCRIPT LOAD``, on every master of a cluster) and called with EVALSHA in
pipelines. After a server restart or a failover the script cache is empty: the writer sees
NOSCRIPT, loads the scripts again and resends the pipeline (every call is idempotent).

``ROW`` takes two keys of one hash slot, the row key and its version companion (keys.py), so it
is one atomic step on one server even in a cluster; ``ROWS`` applies many rows in one call on a
single server (a script call costs the server several times a plain SET; one call per row was
most of the server's time). Versions are signed 64-bit integers sent in decimal and compared as
decimal strings (Lua numbers are doubles and would lose the low bits of a large MySQL version).
Per row: ``op version payload...``, with the live TTL and the tombstone retention (ms) once per
call:

* ``h`` hash, ``s`` string, ``j`` RedisJSON: if newer, replace the value (a hash is replaced, not
  merged, so a dropped column disappears) and store ``version`` in the companion; a live TTL, when
  configured, is set on both.
* ``x`` invalidate: if newer, delete the row key and keep ``version`` for ``tombstone_ms``.
* ``d`` delete: if newer, delete the row key and keep ``D<version>`` for ``tombstone_ms``, so a
  replayed older write cannot bring the row back (never resurrect).
* ``t`` a log tombstone (no version): delete the row key; forget a live version (the writes that
  follow it in the log must apply again) but keep a delete's.

Returns 0 when nothing was done (the change is not newer than what is stored; a tombstone found
no row), 1 written, 2 deleted.

``APPLIED`` raises ``<namespace>:applied:<source>`` to a version, never lowers it.
"""

from __future__ import annotations

_NEWER = """
local function newer(a, b)
  local an, bn = string.sub(a, 1, 1) == '-', string.sub(b, 1, 1) == '-'
  if an ~= bn then return bn end
  if an then a = string.sub(a, 2); b = string.sub(b, 2) end
  local gt
  if #a ~= #b then gt = #a > #b else gt = a > b end
  if an then return (not gt) and a ~= b end
  return gt
end
"""

_APPLY = """
local function apply(row, comp, live_ttl, tomb_ttl, op, version, first, last)
  local stored = redis.call('GET', comp)
  if op == 't' then
    local removed = redis.call('DEL', row)
    if stored and string.sub(stored, 1, 1) ~= 'D' then redis.call('DEL', comp) end
    if removed > 0 then return 2 end
    return 0
  end
  if stored then
    if string.sub(stored, 1, 1) == 'D' then stored = string.sub(stored, 2) end
    if not newer(version, stored) then return 0 end
  end
  if op == 'd' then
    redis.call('DEL', row)
    redis.call('SET', comp, 'D' .. version, 'PX', tomb_ttl)
    return 2
  end
  if op == 'x' then
    redis.call('DEL', row)
    redis.call('SET', comp, version, 'PX', tomb_ttl)
    return 1
  end
  if op == 'h' then
    redis.call('DEL', row)
    if last >= first then redis.call('HSET', row, unpack(ARGV, first, last)) end
  elseif op == 's' then
    redis.call('SET', row, ARGV[first])
  else
    redis.call('JSON.SET', row, '$', ARGV[first])
  end
  if live_ttl > 0 then
    redis.call('PEXPIRE', row, live_ttl)
    redis.call('SET', comp, version, 'PX', live_ttl)
  else
    redis.call('SET', comp, version)
  end
  return 1
end
"""

# One row: KEYS row, companion; ARGV live_ttl_ms, tombstone_ms, op, version, payload...
ROW = _NEWER + _APPLY + """
return apply(KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4], 5, #ARGV)
"""

# Many rows of one server (not for a cluster: their keys are in many slots): KEYS row1, comp1,
# row2, comp2, ...; ARGV live_ttl_ms, tombstone_ms, then per row: op, version, n, n payload values.
ROWS = _NEWER + _APPLY + """
local live, tomb = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
local at = 3
for i = 1, #KEYS, 2 do
  local n = tonumber(ARGV[at + 2])
  out[#out + 1] = apply(KEYS[i], KEYS[i + 1], live, tomb, ARGV[at], ARGV[at + 1], at + 3, at + 2 + n)
  at = at + 3 + n
end
return out
"""

APPLIED = _NEWER + """
local stored = redis.call('GET', KEYS[1])
if stored and not newer(ARGV[1], stored) then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""

OP_CODES = {"hash": "h", "json": "s", "redisjson": "j", "invalidate": "x"}
