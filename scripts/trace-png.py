#!/usr/bin/env python3
"""trace-png.py - draws a dtrain trace (Chrome trace JSON, train.trace) as a PNG timeline.

    scripts/trace-png.py runs/quickstart-ddp/trace -o docs/trace-ddp.png
    scripts/trace-png.py trace.json [rank2.json ...] [-o out.png] [--width 1600] [--steps 3-5]
                         [--merge merged.json] [--title TEXT]

Input: a trace file, several (their events are put together: the rank<N>.json files of hosts
that did not share an output directory), or a directory (its trace.json, else its rank*.json).
Output: one row per track of every rank (pid = rank, tid = track, in the file's order), the
spans coloured by their category ("cat": step, data, forward, backward, comm, optim, ckpt, eval),
nested spans stacked downwards inside their row, a time axis in milliseconds from the first span
drawn, and a legend. --steps keeps the spans of those steps (args.step) only. --merge also
writes the events of every input as one JSON trace.

Only the Python standard library: the PNG is written with zlib and struct, the labels with a
5x7 bitmap font below, so it runs wherever python3 does (no matplotlib, no PIL).
"""
import argparse
import glob
import json
import os
import struct
import sys
import zlib

# ---- colours ---------------------------------------------------------------------------------

CAT_COLOURS = {
    "step": (205, 205, 205),
    "data": (120, 190, 100),
    "forward": (66, 133, 244),
    "backward": (251, 140, 0),
    "comm": (219, 55, 55),
    "optim": (142, 36, 170),
    "ckpt": (121, 85, 72),
    "eval": (0, 150, 136),
    "other": (120, 120, 120),
}
CAT_ORDER = ["step", "data", "forward", "backward", "comm", "optim", "ckpt", "eval", "other"]
BG = (255, 255, 255)
INK = (40, 40, 40)
GRID = (232, 232, 232)
RANK_BAND = (246, 246, 250)


def cat_colour(cat):
    if cat in CAT_COLOURS:
        return CAT_COLOURS[cat]
    h = zlib.crc32(cat.encode())
    return (64 + h % 160, 64 + (h >> 8) % 160, 64 + (h >> 16) % 160)


# ---- a 5x7 bitmap font (lower case; upper case is drawn as lower) ------------------------------

FONT = {
    "0": "01110 10001 10011 10101 11001 10001 01110",
    "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111",
    "3": "11111 00010 00100 00010 00001 10001 01110",
    "4": "00010 00110 01010 10010 11111 00010 00010",
    "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110",
    "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110",
    "9": "01110 10001 10001 01111 00001 00010 01100",
    "a": "00000 00000 01110 00001 01111 10001 01111",
    "b": "10000 10000 10110 11001 10001 10001 11110",
    "c": "00000 00000 01110 10000 10000 10001 01110",
    "d": "00001 00001 01101 10011 10001 10001 01111",
    "e": "00000 00000 01110 10001 11111 10000 01110",
    "f": "00110 01001 01000 11100 01000 01000 01000",
    "g": "00000 00000 01111 10001 01111 00001 01110",
    "h": "10000 10000 10110 11001 10001 10001 10001",
    "i": "00100 00000 01100 00100 00100 00100 01110",
    "j": "00010 00000 00110 00010 00010 10010 01100",
    "k": "10000 10000 10010 10100 11000 10100 10010",
    "l": "01100 00100 00100 00100 00100 00100 01110",
    "m": "00000 00000 11010 10101 10101 10001 10001",
    "n": "00000 00000 10110 11001 10001 10001 10001",
    "o": "00000 00000 01110 10001 10001 10001 01110",
    "p": "00000 00000 11110 10001 11110 10000 10000",
    "q": "00000 00000 01111 10001 01111 00001 00001",
    "r": "00000 00000 10110 11001 10000 10000 10000",
    "s": "00000 00000 01110 10000 01110 00001 11110",
    "t": "01000 01000 11100 01000 01000 01001 00110",
    "u": "00000 00000 10001 10001 10001 10011 01101",
    "v": "00000 00000 10001 10001 10001 01010 00100",
    "w": "00000 00000 10001 10001 10101 10101 01010",
    "x": "00000 00000 10001 01010 00100 01010 10001",
    "y": "00000 00000 10001 10001 01111 00001 01110",
    "z": "00000 00000 11111 00010 00100 01000 11111",
    " ": "00000 00000 00000 00000 00000 00000 00000",
    ".": "00000 00000 00000 00000 00000 01100 01100",
    ",": "00000 00000 00000 00000 01100 00100 01000",
    "-": "00000 00000 00000 11111 00000 00000 00000",
    "+": "00000 00100 00100 11111 00100 00100 00000",
    "=": "00000 00000 11111 00000 11111 00000 00000",
    "#": "01010 01010 11111 01010 11111 01010 01010",
    ":": "00000 01100 01100 00000 01100 01100 00000",
    "(": "00010 00100 01000 01000 01000 00100 00010",
    ")": "01000 00100 00010 00010 00010 00100 01000",
    "/": "00000 00001 00010 00100 01000 10000 00000",
    "_": "00000 00000 00000 00000 00000 00000 11111",
    "%": "11000 11001 00010 00100 01000 10011 00011",
    "?": "01110 10001 00001 00010 00100 00000 00100",
}
GLYPHS = {c: [int(r, 2) for r in rows.split()] for c, rows in FONT.items()}


class Canvas:
    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray(bytes(BG) * (w * h))

    def rect(self, x0, y0, x1, y1, rgb):
        """Fills [x0, x1) x [y0, y1), clipped."""
        x0, y0 = max(0, int(x0)), max(0, int(y0))
        x1, y1 = min(self.w, int(x1)), min(self.h, int(y1))
        if x1 <= x0 or y1 <= y0:
            return
        line = bytes(rgb) * (x1 - x0)
        for y in range(y0, y1):
            o = (y * self.w + x0) * 3
            self.px[o:o + len(line)] = line

    def text(self, x, y, s, scale, rgb=INK):
        """Draws s with its top-left corner at (x, y); returns the x after it."""
        for ch in s.lower():
            rows = GLYPHS.get(ch, GLYPHS["?"])
            for r, bits in enumerate(rows):
                for c in range(5):
                    if bits & (1 << (4 - c)):
                        self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale,
                                  y + (r + 1) * scale, rgb)
            x += 6 * scale
        return x

    def png(self):
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3])
                       for y in range(self.h))

        def chunk(kind, data):
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        ihdr = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)  # 8-bit RGB
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) +
                chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def text_w(s, scale):
    return 6 * scale * len(s)


# ---- reading ------------------------------------------------------------------------------------

def fail(msg):
    print("trace-png: " + msg, file=sys.stderr)
    sys.exit(2)


def inputs(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            merged = os.path.join(p, "trace.json")
            ranks = sorted(glob.glob(os.path.join(p, "rank*.json")),
                           key=lambda f: int("".join(c for c in os.path.basename(f) if c.isdigit()) or 0))
            if os.path.exists(merged):
                files.append(merged)
            elif ranks:
                files.extend(ranks)
            else:
                fail("%s holds neither trace.json nor rank*.json (is train.trace on?)" % p)
        else:
            files.append(p)
    return files


def load(files):
    events = []
    for f in files:
        try:
            with open(f) as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as e:
            fail("%s: not a readable JSON trace: %s" % (f, e))
        evs = doc.get("traceEvents") if isinstance(doc, dict) else doc
        if not isinstance(evs, list):
            fail("%s: no traceEvents list (not a Chrome trace)" % f)
        events.extend(e for e in evs if isinstance(e, dict))
    return events


def parse_steps(s):
    a, _, b = s.partition("-")
    try:
        lo = int(a)
        hi = int(b) if b else (lo if not _ else 1 << 62)
    except ValueError:
        fail("--steps %s: use N, A-B or A-" % s)
    return lo, hi


# ---- layout ----------------------------------------------------------------------------------------

def nice_step(span_ms, ticks):
    raw = span_ms / max(1, ticks)
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1
    while mag > raw:
        mag /= 10
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def fmt_ms(v):
    return ("%.3f" % v).rstrip("0").rstrip(".") if v else "0"


def draw(events, width, title, steps):
    spans = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))
             and isinstance(e.get("dur"), (int, float))]
    if steps:
        lo, hi = steps
        spans = [e for e in spans if lo <= (e.get("args") or {}).get("step", -1) <= hi]
    if not spans:
        fail("no spans (\"ph\": \"X\") to draw%s" % (" in those steps" if steps else ""))
    names, sort = {}, {}
    for e in events:
        if e.get("ph") != "M":
            continue
        key = (e.get("pid", 0), e.get("tid", 0))
        args = e.get("args") or {}
        if e.get("name") == "thread_name":
            names[key] = str(args.get("name", ""))
        elif e.get("name") == "thread_sort_index":
            sort[key] = args.get("sort_index", 0)
        elif e.get("name") == "process_name":
            names[(key[0], None)] = str(args.get("name", ""))

    # rows: (pid, tid), each with its spans stacked by nesting depth
    rows = {}
    for e in spans:
        rows.setdefault((e.get("pid", 0), e.get("tid", 0)), []).append(e)
    def ordered(v):  # pids and tids are numbers in dtrain's traces, strings in some others'
        return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))

    order = sorted(rows, key=lambda k: (ordered(k[0]), ordered(sort.get(k, k[1])), ordered(k[1])))
    depth_of = {}
    for k in order:
        stack, deepest = [], 0
        for e in sorted(rows[k], key=lambda e: (e["ts"], -e["dur"])):
            end = e["ts"] + e["dur"]
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            depth_of[id(e)] = len(stack)
            deepest = max(deepest, len(stack) + 1)
            stack.append(end)
        rows[k] = (rows[k], deepest)

    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    total_ms = max((t1 - t0) / 1000.0, 1e-3)

    scale = 2 if width >= 1000 else 1
    lane_h, pad = 7 * scale, 2 * scale
    labels = {}
    for k in order:
        pname = names.get((k[0], None), "rank %s" % k[0])
        labels[k] = "%s %s" % (pname, names.get(k, "tid %s" % k[1]))
    left = max(text_w(s, scale) for s in labels.values()) + 12 * scale
    right = 10 * scale
    top = 10 * scale + 12 * scale + 12 * scale  # title, legend
    rows_h = sum(rows[k][1] * lane_h + 2 * pad for k in order)
    bottom = 22 * scale
    height = top + rows_h + bottom
    plot_w = width - left - right
    if plot_w < 50:
        fail("--width %d leaves no room for the timeline next to the labels" % width)
    c = Canvas(width, height)

    def x_of(ts):
        return left + (ts - t0) / (t1 - t0 if t1 > t0 else 1) * plot_w

    # title and legend
    c.text(6 * scale, 4 * scale, title or "dtrain trace: %d rank%s, %s ms" % (
        len({k[0] for k in order}), "" if len({k[0] for k in order}) == 1 else "s",
        fmt_ms(round(total_ms, 1))), scale)
    x = 6 * scale
    cats = [cat for cat in CAT_ORDER if any(e.get("cat") == cat for e in spans)]
    cats += sorted({e.get("cat", "other") for e in spans} - set(cats))
    for cat in cats:
        c.rect(x, 16 * scale, x + 7 * scale, 23 * scale, cat_colour(cat))
        x = c.text(x + 9 * scale, 16 * scale, cat, scale) + 8 * scale

    # grid and axis
    step_ms = nice_step(total_ms, max(2, plot_w // (60 * scale)))
    ticks, v = [], 0.0
    while v <= total_ms + 1e-9:
        ticks.append(v)
        v += step_ms
    for v in ticks:
        x = x_of(t0 + v * 1000)
        c.rect(x, top, x + 1, top + rows_h, GRID)

    # rows
    y = top
    prev_pid = None
    band = False
    for k in order:
        evs, deepest = rows[k]
        h = deepest * lane_h + 2 * pad
        if k[0] != prev_pid:
            band = not band
            prev_pid = k[0]
            c.rect(0, y, width, y + 1, (190, 190, 200))
        if band:
            c.rect(0, y + 1, left - 4 * scale, y + h, RANK_BAND)
        c.text(4 * scale, y + (h - 7 * scale) // 2, labels[k], scale)
        for e in evs:
            d = depth_of[id(e)]
            x0, x1 = x_of(e["ts"]), x_of(e["ts"] + e["dur"])
            if x1 - x0 < 1:
                x1 = x0 + 1
            rgb = cat_colour(e.get("cat", "other"))
            yy = y + pad + d * lane_h
            c.rect(x0, yy, x1, yy + lane_h - 1, rgb)
            if x1 - x0 >= 4:  # a darker left edge tells neighbours of one colour apart
                c.rect(x0, yy, x0 + 1, yy + lane_h - 1, tuple(v * 3 // 5 for v in rgb))
        y += h
    c.rect(0, y, width, y + 1, (190, 190, 200))

    # axis labels
    c.rect(left, y + 1, left + plot_w, y + 2, INK)
    last_x = -1
    for v in ticks:
        x = int(x_of(t0 + v * 1000))
        c.rect(x, y + 1, x + 1, y + 4 * scale, INK)
        label = fmt_ms(round(v, 6)) + (" ms" if v == ticks[-1] or v == 0 else "")
        lx = x - text_w(label, scale) // 2
        if lx > last_x and lx + text_w(label, scale) <= width:
            c.text(lx, y + 6 * scale, label, scale)
            last_x = lx + text_w(label, scale) + 4 * scale
    return c, len(order), len(spans), total_ms


def main():
    ap = argparse.ArgumentParser(description="Draw a dtrain trace (train.trace) as a PNG timeline.")
    ap.add_argument("inputs", nargs="+", help="trace.json, rank<N>.json files, or a trace directory")
    ap.add_argument("-o", "--output", help="the PNG (default: trace.png beside the first input)")
    ap.add_argument("--width", type=int, default=1600, help="pixels (default 1600)")
    ap.add_argument("--steps", help="only the spans of these steps: N, A-B or A-")
    ap.add_argument("--title", help="the line above the legend")
    ap.add_argument("--merge", metavar="OUT.json", help="also write every input's events as one trace")
    a = ap.parse_args()
    if a.width < 200 or a.width > 20000:
        fail("--width %d: use 200 to 20000" % a.width)
    files = inputs(a.inputs)
    events = load(files)
    if a.merge:
        with open(a.merge, "w") as fh:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh)
    out = a.output
    if not out:
        first = a.inputs[0]
        out = os.path.join(first if os.path.isdir(first) else os.path.dirname(first) or ".", "trace.png")
    canvas, nrows, nspans, total_ms = draw(events, a.width, a.title,
                                           parse_steps(a.steps) if a.steps else None)
    with open(out, "wb") as fh:
        fh.write(canvas.png())
    print("trace-png: wrote %s (%dx%d): %d tracks, %d spans, %.1f ms" % (
        out, canvas.w, canvas.h, nrows, nspans, total_ms))


if __name__ == "__main__":
    main()
