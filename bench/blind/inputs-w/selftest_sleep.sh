#!/bin/sh
# a well-behaved stand-in that obeys Ctrl-C: the harness self-test of its signal delivery (pipe and pty)
exec sleep 20
