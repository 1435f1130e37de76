"""``pdml-ray watch``: ``pdml-ray status``, refreshed every few seconds until Ctrl-C (or ``--count``).

On a terminal each refresh redraws the screen; piped, refreshes follow each other under a time stamp
(with ``--json``, one JSON object per line). Ctrl-C ends it quietly with exit status 0; a scheduler
that goes away (the run ended) is said once per refresh, and watching goes on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from pdml_ray.cli import status
from pdml_ray.cli.args import float_range, int_range
from pdml_ray.errors import SchedulerUnavailableError

DESCRIPTION = "show the running schedulers' priorities, refreshed until Ctrl-C"
CLEAR = "\x1b[H\x1b[2J"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    status.add_arguments(parser)
    parser.add_argument("--interval", type=float_range(0.1, 3600.0, hint=" seconds"), default=2.0,
                        help="seconds between refreshes (default 2)")
    parser.add_argument("--count", type=int_range(0, 10**9), default=0,
                        help="stop after this many refreshes (default 0: until Ctrl-C)")


def run(args: argparse.Namespace) -> int:
    from pdml_ray.cli.cluster import connect

    connect(args.address)  # a bad address fails here, once, not on every refresh
    redraw = sys.stdout.isatty() and not args.json
    shown = 0
    try:
        while True:
            stamp = time.strftime("%H:%M:%S")
            try:
                text = status.render(status.fetch_stats(args), args.json)
            except SchedulerUnavailableError as e:
                text = json.dumps({"error": str(e)}) if args.json else f"({e})"
            if args.json:
                text = json.dumps({"time": stamp, **json.loads(text)})
            elif redraw:
                text = f"{CLEAR}pdml-ray watch  {stamp}  every {args.interval:g}s, Ctrl-C to stop\n{text}"
            else:
                text = f"--- {stamp}\n{text}"
            print(text, flush=True)
            shown += 1
            if args.count and shown >= args.count:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        print("", flush=True)  # leave the prompt on a fresh line after ^C
        return 0
