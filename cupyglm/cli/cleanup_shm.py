"""`cupyglm-cleanup-shm [--dry-run]`: remove stale cupyglm-* and MPICH mpich_shm_* shared-memory segments.

A segment is stale when the process that made it is gone (its pid and start time, from the segment's header) or
when it was left half-made (no header) longer than --min-age seconds ago. Live jobs' segments are kept. Segments
normally vanish from /dev/shm as soon as every rank has mapped them, so only a job that died during startup leaves
one behind. An MPICH segment (`mpich_shm_*`, in /dev/shm) is stale when no live process maps it and it is older
than --min-age (cupyglm.distributed.mpich_shm); one any process might map is kept.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cupyglm.distributed import mpich_shm
from cupyglm.distributed.shm import shm_dir, stale_segments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cupyglm-cleanup-shm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    parser.add_argument("--dir", type=Path, default=None,
                        help="segment directory (default: $CUPYGLM_SHM_DIR or /dev/shm)")
    parser.add_argument("--min-age", type=float, default=60.0, metavar="SECONDS",
                        help="age after which a segment without a header counts as stale (default 60)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only what is removed")
    ns = parser.parse_args(argv)
    directory = ns.dir or shm_dir()
    removed = kept = failed = 0
    verdicts = stale_segments(directory, min_age_s=ns.min_age)
    verdicts += mpich_shm.stale(directory, min_age_s=ns.min_age)
    for v in verdicts:
        if not v.stale:
            kept += 1
            if not ns.quiet:
                print(f"kept {v.path} ({v.reason})")
            continue
        size = f"{v.nbytes / 2**20:.1f} MiB"
        if ns.dry_run:
            print(f"would remove {v.path} ({v.reason}; {size})")
            removed += 1
            continue
        try:
            os.unlink(v.path)
        except FileNotFoundError:
            continue
        except OSError as e:
            print(f"could not remove {v.path}: {e.strerror or e}", file=sys.stderr)
            failed += 1
            continue
        removed += 1
        print(f"removed {v.path} ({v.reason}; {size})")
    verb = "would remove" if ns.dry_run else "removed"
    if not ns.quiet:
        tail = f", {failed} failed" if failed else ""
        print(f"{directory}: {verb} {removed} stale segment(s), kept {kept}{tail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
