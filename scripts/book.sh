#!/usr/bin/env bash
# Builds the book (docs/ → target/book) with a pinned mdBook, fails on a broken link, then loads
# the introduction and a chapter in headless Chromium and fails unless every SVG chart on them
# rendered. Screenshots of both go to target/book-render/ (CI's artefacts).
# Installs what it lacks: mdBook from crates.io into target/tools (kept between runs with the
# target dir), Chromium from Debian's packages. Needs python3 (the link check, a local server).
# Usage: scripts/book.sh            (≈ 2 min the first time, seconds after)
set -euo pipefail
cd "$(dirname "$0")/.."

MDBOOK_VERSION=0.4.52
tools=target/tools
mdbook=$tools/bin/mdbook
render=target/book-render
# The chapter whose charts are checked: it has a line chart and bar charts.
chapter=03-mixed-precision.html

if [[ "$("$mdbook" --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]]; then
  echo "== installing mdBook $MDBOOK_VERSION into $tools"
  cargo install mdbook --version "$MDBOOK_VERSION" --locked --root "$tools" \
    --no-default-features --features search --quiet
fi

echo "== mdbook build docs"
rm -rf target/book
"$mdbook" build docs 2>&1 | grep -v '\[INFO\]' || true
[[ -f target/book/index.html ]] || { echo "book: mdbook wrote no target/book/index.html" >&2; exit 1; }

echo "== links"
python3 scripts/check-book-links.py target/book

if ! command -v chromium >/dev/null; then
  echo "== installing Chromium (Debian's package) for the render check"
  sudo=""
  [[ "$(id -u)" == 0 ]] || sudo="sudo"
  command -v apt-get >/dev/null || { echo "book: the render check needs chromium" >&2; exit 1; }
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

echo "== render: introduction and $chapter in headless Chromium"
rm -rf "$render"
mkdir -p "$render"
work=$(mktemp -d)
server=""
cleanup() {
  [[ -z "$server" ]] || kill "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The check page lives outside the book; the server maps it in beside the pages (same origin,
# so it can look inside the frames).
cp scripts/book-render-check.html "$work/"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 - "$port" "$work/book-render-check.html" >"$work/server.log" 2>&1 <<'EOF' &
import functools, http.server, os, sys
port, check = int(sys.argv[1]), sys.argv[2]
class Handler(http.server.SimpleHTTPRequestHandler):
    def translate_path(self, path):
        if path.split("?")[0] == "/book-render-check.html":
            return check
        return super().translate_path(path)
handler = functools.partial(Handler, directory=os.path.abspath("target/book"))
http.server.ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()
EOF
server=$!
for _ in $(seq 50); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/index.html')" \
    2>/dev/null && break
  sleep 0.2
done

# Flags: no sandbox (CI runs as root), and no background networking (this network is closed).
chrome() {
  timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$work/profile" "$@" 2>>"$work/chromium.log"
}
chrome --virtual-time-budget=30000 --dump-dom \
  "http://127.0.0.1:$port/book-render-check.html?pages=introduction.html,$chapter" \
  >"$work/dom.html" || true
result=$(sed -n '/<pre id="result">/,/<\/pre>/p' "$work/dom.html" | sed -e 's/<[^>]*>//g')
echo "$result" | tee "$render/render-check.txt"
for page in introduction.html "$chapter"; do
  chrome --window-size=1200,2400 --screenshot="$render/${page%.html}.png" \
    "http://127.0.0.1:$port/$page" >/dev/null || true
done
ls "$render"

grep -q '^done$' <<<"$result" || { echo "book: the render check did not finish" >&2; exit 1; }
if grep -q 'BROKEN\|MISSING' <<<"$result"; then
  echo "book: a page or chart did not render (above)" >&2
  exit 1
fi
grep -q "^$chapter: .*, [1-9][0-9]* SVG charts rendered of" <<<"$result" \
  || { echo "book: $chapter showed no SVG chart" >&2; exit 1; }
echo "book: built, links whole, charts rendered"
