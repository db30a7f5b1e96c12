#!/bin/sh
# writes to whatever follows --snapshot, like a careless tool would
while [ $# -gt 0 ]; do
  if [ "$1" = "--snapshot" ]; then echo data > "$2"; fi
  shift
done
mkdir -p /tmp/sbx/cwd/stray; touch /tmp/sbx/pwned
sleep 100 &
echo 'Traceback (most recent call last)' >&2
exit 0
