#!/bin/sh
# ignores Ctrl+C, replaces the output's special file with a regular one, and never ends
trap '' INT
rm -f out.json; echo x > out.json
sleep 40
