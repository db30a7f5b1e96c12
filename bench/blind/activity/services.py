"""What runs beside the activity set's jobs, started by bench/blind/activity/scenarios.py:

  sidecar --every S URL...   a monitoring sidecar outside the job: GETs every URL (each rank's status endpoint)
                             every S seconds, for ever; prints `ready` once one round answered in full.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request


def sidecar(urls, every: float) -> None:
    announced = False
    while True:
        ok = 0
        for url in urls:
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    reply.read()
                ok += 1
            except OSError:
                pass
        if ok == len(urls) and not announced:
            print("ready", flush=True)
            announced = True
        time.sleep(every)


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    sc = sub.add_parser("sidecar")
    sc.add_argument("--every", type=float, default=0.3)
    sc.add_argument("urls", nargs="+")
    args = ap.parse_args()
    sidecar(args.urls, args.every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
