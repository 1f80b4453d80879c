"""Open a report page in headless Chromium with the network off and check it (scripts/test-browser).

    check_page.py PAGE.html OUT_DIR [--expect-charts N] [--sections ID,...] [--may-be-flat NAME,...]

1. ``--dump-dom``: the page's own marks on <body>: ``data-charts`` = "<drawn>/<expected>" with
   drawn == expected > 0 (and == N when given), ``data-errors`` = "0" (script errors, console.error
   calls and requests refused by the page's Content-Security-Policy are all counted there), the
   error box still hidden, and no ``data-xss`` (the fixture's hostile names set it if they ever run).
2. Chromium's own log: no console message at all (the page logs nothing when it works).
3. ``--screenshot`` of the whole page: inside every chart's plot area (the rectangles the page
   leaves in ``data-chart-rects``) there must be drawn data: enough pixels in the series colours
   (grid, axes, text and the pale shaded ranges are none of them; for the heat map, any strong
   colour) and some contrast.
4. The step charts (``data-step-marks``): each draws every step above its axis that the page's
   data carries (``modes[].above``) as a triangle in the top 5 % of its plot, on the y axis the
   data gives (``modes[].y``).
5. The findings' evidence: tables (``table.evidence``, ``table.evidence-rows``) with no JSON text
   (no ``{"`` or ``["``, no ``"key":`` and a value) and no number with more than 3 decimals.
6. ``--sections``: each named window section has what it draws without script, in the DOM
   (``detailed``: the busy/idle bar with its parts and the kernel-class and top tables;
   ``native``: the redrawn flame graph, an inline ``<svg>`` with frames; ``python-windows``:
   the windows' table with named windows), and no ``<script`` inside any of them.
7. ``--may-be-flat``: charts (by name) whose series may all be zero in that job (a job with no
   network traffic draws its line on the x axis, which the screenshot cannot tell from blank);
   they must still have drawn (step 1), only the pixel test is skipped for them.

The network is off: ``unshare -n`` when run as root (an empty network namespace), and always a
host-resolver rule that resolves nothing plus a proxy on a closed port.
"""

import argparse
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from PIL import Image, ImageStat

WIDTH = 1400
MAX_HEIGHT = 16000
# A uPlot plot area passes with at least this share of pixels in one of the series colours
# (COLORS in report/assets/page.js; the shaded ranges, grid and text are none of them), the
# heat map with this share of coloured pixels (|max - min channel| > 40)...
MIN_DRAWN = 0.001
PALETTE = [(0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e), (0x2c, 0xa0, 0x2c), (0xd6, 0x27, 0x28), (0x94, 0x67, 0xbd),
           (0x8c, 0x56, 0x4b), (0xe3, 0x77, 0xc2), (0x7f, 0x7f, 0x7f), (0xbc, 0xbd, 0x22), (0x17, 0xbe, 0xcf)]
NEAR = 40 ** 2
# ...and this standard deviation of its grey levels.
MIN_STDDEV = 4.0


def series_colour(p):
    return any((p[0] - c[0]) ** 2 + (p[1] - c[1]) ** 2 + (p[2] - c[2]) ** 2 < NEAR for c in PALETTE)


def coloured(p):
    return max(p) - min(p) > 40


def chromium_argv(page, profile, extra):
    argv = []
    if os.geteuid() == 0 and shutil.which("unshare"):
        argv += ["unshare", "-n"]
    argv += [
        shutil.which("chromium") or "chromium",
        "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
        "--force-device-scale-factor=1", "--disable-extensions", "--disable-background-networking",
        "--disable-component-update", "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
        "--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000",
    ]
    return argv + extra + ["file://" + os.path.abspath(page)]


def run_chromium(page, profile, extra, timeout=120):
    proc = subprocess.run(chromium_argv(page, profile, extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)
    console = [l for l in proc.stderr.splitlines() if ":CONSOLE" in l]
    return proc, console


class BodyAttrs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.body = None
        self.errors_box = None
        self.in_errors_list = False
        self.errors_text = ""
        self.in_data = False
        self.data_text = ""
        self.evidence_depth = 0
        self.evidence_tables = 0
        self.evidence_text = []
        self.report_page = False  # `trainprof compare`'s page has no report data, no step charts

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body" and self.body is None:
            self.body = attrs
        if attrs.get("id") == "page-errors":
            self.errors_box = attrs
        if attrs.get("id") == "page-errors-list":
            self.in_errors_list = True
        if tag == "script" and attrs.get("id") == "report-data":
            self.in_data = True
            self.report_page = True
        if tag == "table" and (attrs.get("class") or "") in ("evidence", "evidence-rows"):
            self.evidence_depth = 1
            self.evidence_tables += 1
            self.evidence_text.append("")
        elif tag == "table" and self.evidence_depth:
            self.evidence_depth += 1

    def handle_endtag(self, tag):
        if tag == "pre":
            self.in_errors_list = False
        if tag == "script":
            self.in_data = False
        if tag == "table" and self.evidence_depth:
            self.evidence_depth -= 1

    def handle_data(self, data):
        if self.in_errors_list:
            self.errors_text += data
        if self.in_data:
            self.data_text += data
        if self.evidence_depth:
            self.evidence_text[-1] += data + " "


LONG_DECIMAL = re.compile(r"\d\.\d{4,}")
JSON_TEXT = re.compile(r'[{\[]\s*"|"\s*:\s*[-\d{\["tfn]')


def check_step_marks(body, data_text, failures):
    """Every step above a step chart's axis is drawn at its top edge, on the data's axis."""
    try:
        data = json.loads(data_text)
    except ValueError as e:
        failures.append("the page's data is unreadable: %s" % e)
        return
    marks = json.loads(body.get("data-step-marks") or "{}")
    for m in data.get("modes", []):
        mode, above, y = m.get("mode"), len(m.get("above") or []), m.get("y")
        got = marks.get(mode)
        if got is None:
            failures.append("step chart %r left no data-step-marks" % mode)
            continue
        print("step chart %-8s axis %s ms, %d steps above it, %d drawn, %d at the top edge"
              % (mode, y, above, got.get("drawn", -1), got.get("at_top", -1)))
        if got.get("y") != y:
            failures.append("step chart %r drew the axis %r, the data gives %r" % (mode, got.get("y"), y))
        if got.get("above") != above or got.get("drawn") != above or got.get("at_top") != above:
            failures.append("step chart %r: %d steps above the axis, marks %r" % (mode, above, got))


def check_evidence(parser, failures):
    """The findings' evidence: tables, rounded, no JSON text."""
    print("evidence tables: %d" % parser.evidence_tables)
    for text in parser.evidence_text:
        # JSON's marks: an object or list opening on a key or string, a key and its colon (a
        # name from the trainer may hold quotes or braces, not in that shape).
        m = JSON_TEXT.search(text)
        if m:
            failures.append("evidence as JSON text (%r): %s" % (m.group(0), text.strip()[:200]))
        m = LONG_DECIMAL.search(text)
        if m:
            failures.append("an unrounded number in the evidence: %s" % m.group(0))


def region_stats(img, rect, test):
    x, y, w, h = (int(v) for v in rect[:4])
    # 2 px in from the edges: the plot area's border is not data.
    box = (x + 2, y + 2, x + w - 2, y + h - 2)
    if box[2] <= box[0] or box[3] <= box[1] or box[3] > img.height or box[2] > img.width:
        return None
    crop = img.crop(box)
    grey = ImageStat.Stat(crop.convert("L")).stddev[0]
    px = crop.getdata()
    drawn = sum(1 for p in px if test(p))
    return grey, drawn / max(1, len(px))


def section_html(dom, sid):
    """The markup of the element with id ``sid`` up to the next section (or the end)."""
    m = re.search(r'<(section|h3|div|details)[^>]*\bid="%s"' % re.escape(sid), dom)
    if not m:
        return None
    end = dom.find("<section", m.end())
    return dom[m.start():end if end >= 0 else len(dom)]


SECTION_CHECKS = {
    "detailed": [(r'class="dw-bar"', 1, "the busy/idle bar"), (r'<div title="[^"]*%" style="width:', 2, "the bar's parts (busy, idle)"),
                 (r"<table", 3, "the busy/idle, kernel-class and top tables")],
    "native": [(r"<svg", 1, "the flame graph"), (r"<rect", 10, "flame graph frames")],
    "python-windows": [(r"<table", 1, "the windows' table"), (r"· cProfile|· pyinstrument", 1, "a named window")],
}


def check_sections(dom, ids, failures):
    for sid in ids:
        part = section_html(dom, sid)
        if part is None:
            failures.append("no section %r on the page" % sid)
            continue
        if "<script" in part:
            failures.append("section %r holds a script element" % sid)
        for pattern, least, what in SECTION_CHECKS.get(sid, []):
            n = len(re.findall(pattern, part))
            if what and n < least:
                failures.append("section %r: %s missing (%d of at least %d)" % (sid, what, n, least))
        print("section %-16s %7d characters" % (sid, len(part)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("page")
    ap.add_argument("out")
    ap.add_argument("--expect-charts", type=int)
    ap.add_argument("--sections", default="", help="comma list of window sections that must be drawn")
    ap.add_argument("--may-be-flat", default="", help="comma list of chart names whose series may all be 0")
    args = ap.parse_args()
    failures = []
    profile = tempfile.mkdtemp(prefix="trainprof-chromium-")
    try:
        proc, console = run_chromium(args.page, profile, ["--window-size=%d,1000" % WIDTH, "--dump-dom"])
        if proc.returncode != 0:
            failures.append("chromium --dump-dom exited with %d" % proc.returncode)
        parser = BodyAttrs()
        parser.feed(proc.stdout)
        body = parser.body or {}
        charts = body.get("data-charts", "")
        m = re.fullmatch(r"(\d+)/(\d+)", charts)
        print("charts drawn: %s, errors recorded: %s, all drawn %s ms after navigation started"
              % (charts or "(no mark)", body.get("data-errors"), body.get("data-drawn-ms", "?")))
        if not m or m.group(1) != m.group(2) or int(m.group(2)) == 0:
            failures.append("not every chart drew: data-charts=%r" % charts)
        elif args.expect_charts is not None and int(m.group(2)) != args.expect_charts:
            failures.append("the page planned %s charts, expected %d" % (m.group(2), args.expect_charts))
        if body.get("data-errors") != "0":
            failures.append("the page recorded errors: %r" % parser.errors_text.strip())
        if parser.errors_box is None or "hidden" not in parser.errors_box:
            failures.append("the error box is missing or shown")
        if "data-xss" in body:
            failures.append("a hostile name ran as script: data-xss=%r" % body["data-xss"])
        if parser.report_page:
            check_step_marks(body, parser.data_text, failures)
        check_evidence(parser, failures)
        check_sections(proc.stdout, [x for x in args.sections.split(",") if x], failures)
        flat = {x for x in args.may_be_flat.split(",") if x}
        rects = json.loads(body.get("data-chart-rects") or "[]")
        height = min(MAX_HEIGHT, int(body.get("data-page-height") or 2000))

        shot = os.path.join(args.out, "report.png")
        proc2, console2 = run_chromium(args.page, profile,
                                       ["--window-size=%d,%d" % (WIDTH, height), "--screenshot=" + shot])
        for line in console + console2:
            failures.append("console: " + line)
        if not os.path.exists(shot):
            failures.append("no screenshot (chromium exited with %d)" % proc2.returncode)
        else:
            img = Image.open(shot).convert("RGB")
            print("screenshot: %s (%d × %d px)" % (shot, img.width, img.height))
            print("%-34s %10s %10s" % ("plot area", "grey sd", "drawn"))
            for r in rects:
                name = str(r[4]) if len(r) > 4 else "?"
                st = region_stats(img, r, coloured if len(r) > 5 and r[5] == "heat" else series_colour)
                if st is None:
                    failures.append("chart %r lies outside the screenshot: %r" % (name, r))
                    continue
                sd, col = st
                ok = sd >= MIN_STDDEV and col >= MIN_DRAWN
                print("%-34s %10.1f %9.2f%% %s" % (name[:34], sd, 100 * col, "" if ok else "BLANK"))
                if not ok and name in flat:
                    print("%-34s (may be flat: its series are all 0 in this job)" % "")
                elif not ok:
                    failures.append("chart %r looks blank (grey sd %.1f, drawn %.3f%%)" % (name, sd, 100 * col))
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nbrowser tier: OK (%d charts drawn, no console message, no error, network off)" % len(rects))
    return 0


if __name__ == "__main__":
    sys.exit(main())
