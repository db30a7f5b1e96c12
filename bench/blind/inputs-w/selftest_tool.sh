#!/bin/sh
# A careless stand-in for `hangscope watch` (the harness's own self-test: run.py --tool selftest_tool.sh):
# runs --on-hang through a shell, writes through out/history.jsonl whatever it is, chmods nothing right,
# removes the user's files in --out, leaves a process behind and prints a traceback.
out=hangscope-watch; hook=
while [ $# -gt 0 ]; do
  case "$1" in --out) out="$2"; shift;; --on-hang) hook="$2"; shift;; esac
  shift
done
mkdir -p "$out" 2>/dev/null; chmod 755 "$out" 2>/dev/null
echo '{"sample":1}' >> "$out/history.jsonl" 2>/dev/null
rm -rf "$out"/2020* 2>/dev/null
[ -n "$hook" ] && sh -c "$hook" </dev/null >/dev/null 2>&1
sleep 100 &
echo 'Traceback (most recent call last)' >&2
exit 0
