#!/usr/bin/env python3
"""Fails on a broken link in the built book: every relative href/src in every page must name a
file of the build, and every #fragment an id in that file. External links are not fetched
(CI has no network for them); they are listed with --external.

Usage: scripts/check-book-links.py BOOK_DIR [--external]
"""

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class Page(HTMLParser):
    """The links and the ids of one HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name in ("href", "src") and value is not None:
                self.links.append((tag, value))


def parse(path, cache={}):
    if path not in cache:
        page = Page()
        page.feed(path.read_text(encoding="utf-8"))
        cache[path] = page
    return cache[path]


def main(argv):
    if len(argv) < 2 or not Path(argv[1]).is_dir():
        print("usage: check-book-links.py BOOK_DIR [--external]", file=sys.stderr)
        return 2
    root = Path(argv[1]).resolve()
    broken, external, checked = [], set(), 0
    pages = sorted(root.rglob("*.html"))
    for page_path in pages:
        # 404.html links from the site root, which a local build does not have.
        if page_path.name == "404.html":
            continue
        for tag, link in parse(page_path).links:
            parts = urlsplit(link)
            if parts.scheme in ("http", "https", "mailto"):
                external.add(link)
                continue
            if parts.scheme or link.startswith("//") or link.startswith("javascript:"):
                continue
            checked += 1
            target = page_path if not parts.path else (page_path.parent / unquote(parts.path))
            target = target.resolve()
            where = f"{page_path.relative_to(root)}: <{tag}> {link}"
            if not target.is_relative_to(root):
                broken.append(f"{where} leaves the book")
            elif target.is_dir():
                if not (target / "index.html").exists():
                    broken.append(f"{where} names a folder")
            elif not target.exists():
                broken.append(f"{where} names a missing file")
            elif parts.fragment and target.suffix == ".html":
                if unquote(parts.fragment) not in parse(target).ids:
                    broken.append(f"{where}: no id {parts.fragment!r} there")
    for line in broken:
        print(f"broken link: {line}", file=sys.stderr)
    if "--external" in argv:
        for link in sorted(external):
            print(f"external (not fetched): {link}")
    print(f"book links: {checked} internal links in {len(pages)} pages, {len(broken)} broken, "
          f"{len(external)} external not fetched")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
