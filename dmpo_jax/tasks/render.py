"""Drawing instances as images for MM-NP-Bench (PIL only, deterministic)."""

from __future__ import annotations

import math

BG, FG, EDGE, NODE, GRID = "white", "black", (90, 90, 90), (222, 235, 255), (200, 200, 200)
PALETTE = [(66, 133, 244), (219, 68, 55), (244, 180, 0), (15, 157, 88), (171, 71, 188),
           (0, 172, 193), (255, 112, 67), (158, 157, 36)]


# PIL is imported where it draws, so that importing the tasks (and the training layer, and the
# device benchmark) does not need it.
def font(px: int):
  from PIL import ImageFont
  px = max(8, int(px))
  try:
    return ImageFont.load_default(size=px)
  except TypeError:  # Pillow < 10.1 has one bitmap size
    return ImageFont.load_default()


def canvas(size: int, title: str):
  from PIL import Image, ImageDraw
  img = Image.new("RGB", (size, size), BG)
  d = ImageDraw.Draw(img)
  d.text((size // 2, 4), title, fill=FG, font=font(size / 28), anchor="ma")
  return img, d, int(size / 28) + 12


def graph(size: int, title: str, n: int, edges, weights: dict | None = None):
  """Nodes on a circle with labels; weighted edges get their weight at the midpoint
  (when there are few enough to read) and a width that grows with the weight."""
  img, d, top = canvas(size, title)
  cx, cy = size / 2, (size + top) / 2
  r = (size - top) / 2 - size / 14
  node_r = max(6, min(size / 30, 0.8 * math.pi * r / max(n, 1) / 2))
  pos = [(cx + r * math.sin(2 * math.pi * i / n), cy - r * math.cos(2 * math.pi * i / n))
         for i in range(n)]
  wmax = max(weights.values()) if weights else 1
  for (u, v) in edges:
    w = weights[(u, v)] if weights else None
    width = 1 if w is None else 1 + int(3 * w / wmax)
    d.line([pos[u], pos[v]], fill=EDGE, width=width)
  if weights and len(edges) <= 60:
    f = font(size / 45)
    for (u, v) in edges:
      mx, my = (pos[u][0] + pos[v][0]) / 2, (pos[u][1] + pos[v][1]) / 2
      d.text((mx, my), f"{weights[(u, v)]:g}", fill=(180, 0, 0), font=f, anchor="mm",
             stroke_width=2, stroke_fill=BG)
  f = font(node_r * 1.1)
  for i, (x, y) in enumerate(pos):
    d.ellipse([x - node_r, y - node_r, x + node_r, y + node_r], fill=NODE, outline=FG)
    d.text((x, y), str(i), fill=FG, font=f, anchor="mm")
  return img


def table(size: int, title: str, header, rows, max_rows: int = 24):
  """A text table scaled to fit the image; long tables wrap into side-by-side blocks."""
  img, d, top = canvas(size, title)
  blocks = max(1, math.ceil(len(rows) / max_rows))
  per = math.ceil(len(rows) / blocks) if rows else 0
  block_w = (size - 16) / blocks
  texts = [list(map(str, header))] + [list(map(str, r)) for r in rows]
  ncols = len(header)
  widths = [max(len(t[c]) for t in texts) + 2 for c in range(ncols)]
  total = sum(widths)
  cell_h = min((size - top - 8) / (per + 1), size / 14)
  f = font(min(cell_h * 0.7, block_w / total * 1.6))
  for b in range(blocks):
    x0 = 8 + b * block_w
    xs = [x0]
    for w in widths:
      xs.append(xs[-1] + (block_w - 6) * w / total)
    chunk = [texts[0]] + texts[1 + b * per:1 + (b + 1) * per]
    for ri, t in enumerate(chunk):
      y = top + ri * cell_h
      if ri == 0:
        d.rectangle([x0, y, xs[-1], y + cell_h], fill=NODE)
      d.line([x0, y + cell_h, xs[-1], y + cell_h], fill=GRID)
      for c in range(ncols):
        d.text(((xs[c] + xs[c + 1]) / 2, y + cell_h / 2), t[c], fill=FG, font=f, anchor="mm")
  return img


def matrix(size: int, title: str, m):
  """A square matrix (e.g. TSP distances) as a grid with row/column labels."""
  n = len(m)
  img, d, top = canvas(size, title)
  cell = (size - 16) / (n + 1)
  cell = min(cell, (size - top - 8) / (n + 1))
  f = font(cell * 0.45)
  for i in range(n + 1):
    for j in range(n + 1):
      x, y = 8 + j * cell, top + i * cell
      if i == 0 and j == 0:
        continue
      if i == 0 or j == 0:
        d.rectangle([x, y, x + cell, y + cell], fill=NODE, outline=GRID)
        label = str(j - 1 if i == 0 else i - 1)
      else:
        d.rectangle([x, y, x + cell, y + cell], outline=GRID)
        label = f"{m[i - 1][j - 1]:g}"
      d.text((x + cell / 2, y + cell / 2), label, fill=FG, font=f, anchor="mm")
  return img


def calendar(size: int, title: str, availability: dict, meetings: dict, rooms: dict,
             t0: int, t1: int):
  """Attendee availability as bars on a day timeline, with meetings and rooms listed below."""
  img, d, top = canvas(size, title)
  people = sorted(availability)
  lines = [f"meeting {m}: attendees {', '.join(map(str, a))}; {dur} min"
           for m, (a, dur) in sorted(meetings.items())]
  lines.append("rooms: " + ", ".join(f"{r} (cap {c})" for r, c in sorted(rooms.items())))
  text_h = size / 34
  chart_h = size - top - 16 - text_h * (len(lines) + 1)
  row_h = min(chart_h / (len(people) + 1), size / 12)
  left = size * 0.12
  right = size - 12
  f = font(min(row_h * 0.5, text_h))
  span = max(t1 - t0, 1)
  x_of = lambda t: left + (right - left) * (t - t0) / span
  for h in range(t0 - t0 % 60, t1 + 1, 60):
    if h < t0:
      continue
    d.line([x_of(h), top, x_of(h), top + row_h * len(people)], fill=GRID)
    d.text((x_of(h), top + row_h * len(people) + 2), f"{h // 60}:{h % 60:02d}", fill=FG,
           font=f, anchor="ma")
  for i, p in enumerate(people):
    y = top + i * row_h
    d.text((left - 6, y + row_h / 2), f"att {p}", fill=FG, font=f, anchor="rm")
    for a, b in availability[p]:
      d.rectangle([x_of(a), y + row_h * 0.2, x_of(b), y + row_h * 0.8],
                  fill=PALETTE[i % len(PALETTE)])
  y = top + row_h * (len(people) + 1) + 8
  ft = font(text_h * 0.8)
  for line in lines:
    d.text((12, y), line, fill=FG, font=ft)
    y += text_h
  return img
