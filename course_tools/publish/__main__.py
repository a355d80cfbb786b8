"""Command line: ``python -m course_tools.publish {tag,nav,slides,site,assets}``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from course_tools.publish import assets, navigation, site, slides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_tools.publish", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_tag = sub.add_parser("tag", help="write the slide metadata of lectures by the rules")
    p_tag.add_argument("paths", nargs="+")
    p_nav = sub.add_parser(
        "nav", help="write each lecture's footer: exercise, next and previous unit"
    )
    p_nav.add_argument("paths", nargs="+")
    for name in ("slides", "site"):
        p = sub.add_parser(name, help=f"build the static {name} (offline)")
        p.add_argument("units", nargs="*", help="two-digit unit numbers (default: all)")
        p.add_argument("--out", type=Path, default=None)
    sub.add_parser("assets", help="fetch and check the pinned JavaScript packages")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        if args.command == "tag":
            for path in args.paths:
                changed = slides.tag(path)
                print(f"{path}: {'re-tagged' if changed else 'unchanged'}")
        elif args.command == "nav":
            for path in args.paths:
                changed = navigation.write_footer(path)
                print(f"{path}: {'footer written' if changed else 'unchanged'}")
        elif args.command == "assets":
            for asset in assets.ASSETS.values():
                assets.tarball(asset)
                print(f"{asset.name} {asset.version}: ok ({assets.vendor_dir()})")
        elif args.command == "slides":
            kw = {"out": args.out} if args.out else {}
            paths = site.build_slides(units=args.units or None, **kw)
            for path in paths:
                print(path)
        else:
            kw = {"out": args.out} if args.out else {}
            print(site.build(units=args.units or None, **kw))
    except (assets.AssetError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
