"""Schedule category: meeting scheduling with rooms and attendee availability."""

from __future__ import annotations

import math
import random
import time

from dmpo_jax.tasks import checks, parsing, render
from dmpo_jax.tasks.base import Exact, Infeasible, Task
from dmpo_jax.tasks.common import Problem, cp_model, solve, uniform

DAY = (540, 1020)  # 9:00 to 17:00, minutes
STEP = 30


class MeetingSchedule(Task):
  key = "meeting-schedule"
  fields = {"meetings": (dict,), "attendee_availability": (dict,), "rooms": (dict,)}
  title = "Meeting scheduling"
  category = "schedule"
  direction = "max"
  description = ("Schedule meetings into rooms: each scheduled meeting gets a room and a start "
                 "time (minutes after midnight); meetings in the same room must not overlap, the "
                 "room must hold all attendees, and every attendee must be available for the "
                 "whole meeting and in one meeting at a time. Each meeting is scheduled at most "
                 "once. Maximise the total number of attendees of the scheduled meetings.")
  answer_format = ("a list of (meeting_id, room_id, start_time) tuples, e.g. "
                   "Answer: [(0, 1, 540), (2, 0, 600)]; [] schedules nothing")
  TINY = ((2, 3), (2, 3), (1, 2))  # (meetings, attendees, rooms); ours, tiny never changes
  # NP-Bench's levels: (meetings, attendees, rooms, most attendees per meeting). Everyone is
  # available 9:00-12:00 and 13:00-17:00; rooms hold 3-10; a greedy schedule is planted.
  SIZES = {"easy": ((4, 5), (3, 5), (3, 4), 3), "medium": ((5, 6), (4, 6), (4, 5), 4),
           "hard": ((6, 7), (5, 7), (5, 6), 4), "bench": ((8, 10), (7, 9), (6, 7), 5)}
  LUNCH = (720, 780)

  def _generate_npbench(self, rng, level):
    nm, na, nr, most = self.SIZES[level]
    M, A, R = uniform(rng, nm), uniform(rng, na), uniform(rng, nr)
    meetings = {m: (sorted(rng.sample(range(A), rng.randint(2, most))), rng.choice([30, 60, 90]))
                for m in range(M)}
    windows = [[DAY[0], self.LUNCH[0]], [self.LUNCH[1], DAY[1]]]
    rooms = {r: rng.randint(3, 10) for r in range(R)}
    busy_room = {r: [] for r in range(R)}
    busy_att = {a: [] for a in range(A)}
    free = lambda iv, s, e: all(e <= a or b <= s for a, b in iv)
    planted = []
    for m, (att, dur) in meetings.items():  # greedy: first room, then earliest half hour
      slot = next(((r, s) for r in range(R) if rooms[r] >= len(att)
                   for lo, hi in windows for s in range(lo, hi - dur + 1, 30)
                   if free(busy_room[r], s, s + dur) and all(free(busy_att[a], s, s + dur) for a in att)),
                  None)
      if slot:
        r, s = slot
        busy_room[r].append((s, s + dur))
        for a in att:
          busy_att[a].append((s, s + dur))
        planted.append((m, r, s))
    q = {"meetings": {str(m): {"attendees": att, "duration": dur} for m, (att, dur) in meetings.items()},
         "attendee_availability": {str(a): [list(w) for w in windows] for a in range(A)},
         "rooms": {str(r): c for r, c in rooms.items()}}
    return q, planted

  def _generate(self, rng, level):
    if level != "tiny":
      return self._generate_npbench(rng, level)
    nm, na, nr = self.TINY
    M, A, R = uniform(rng, nm), uniform(rng, na), uniform(rng, nr)
    rooms = {r: rng.randint(2, max(3, A + 1)) for r in range(R)}
    busy_room = {r: [] for r in range(R)}
    busy_att = {a: [] for a in range(A)}
    meetings, planted = {}, []
    free = lambda iv, s, e: all(e <= a or b <= s for a, b in iv)
    for m in range(M):
      k = rng.randint(2, max(2, min(A, 4)))
      att = sorted(rng.sample(range(A), min(k, A)))
      dur = rng.choice([30, 60, 90])
      meetings[m] = (att, dur)
      if rng.random() < 0.8:  # plant a slot for most meetings
        slots = [(r, s) for r in range(R) if rooms[r] >= len(att)
                 for s in range(DAY[0], DAY[1] - dur + 1, STEP)
                 if free(busy_room[r], s, s + dur) and all(free(busy_att[a], s, s + dur) for a in att)]
        if slots:
          r, s = rng.choice(slots)
          busy_room[r].append((s, s + dur))
          for a in att:
            busy_att[a].append((s, s + dur))
          planted.append((m, r, s))
    avail = {}
    for a in range(A):
      spans = [(s - STEP * rng.randint(0, 2), e + STEP * rng.randint(0, 2)) for s, e in busy_att[a]]
      for _ in range(rng.randint(1, 2)):  # free windows
        s = rng.randrange(DAY[0], DAY[1] - 60, STEP)
        spans.append((s, min(DAY[1], s + STEP * rng.randint(2, 8))))
      spans = sorted((max(DAY[0], s), min(DAY[1], e)) for s, e in spans)
      merged = []
      for s, e in spans:
        if merged and s <= merged[-1][1]:
          merged[-1][1] = max(merged[-1][1], e)
        else:
          merged.append([s, e])
      avail[str(a)] = merged
    q = {"meetings": {str(m): {"attendees": att, "duration": dur} for m, (att, dur) in meetings.items()},
         "attendee_availability": avail,
         "rooms": {str(r): c for r, c in rooms.items()}}
    return q, planted

  def _validate(self, q):
    for field, what in (("meetings", "meeting"), ("attendee_availability", "attendee"), ("rooms", "room")):
      checks.id_map(self.key, field, q[field], what)
    for a, spans in q["attendee_availability"].items():
      if not isinstance(spans, list):
        checks.fail(self.key, "attendee_availability", f"attendee {a}'s windows are not a list")
      for span in spans:
        if not (isinstance(span, (list, tuple)) and len(span) == 2 and all(map(checks.is_int, span))
                and 0 <= span[0] < span[1]):
          checks.fail(self.key, "attendee_availability", f"attendee {a}'s window {span!r} is not "
                      "[start, end], integers with 0 <= start < end")
    for r, capacity in q["rooms"].items():
      checks.int_at_least(self.key, "rooms", capacity, 0, f"room {r}'s capacity")
    for m, meeting in q["meetings"].items():
      self._validate_meeting(q, m, meeting)

  def _validate_meeting(self, q, m, meeting):
    if not isinstance(meeting, dict) or not {"attendees", "duration"} <= set(meeting):
      checks.fail(self.key, "meetings", f"meeting {m} is {meeting!r}, expected "
                  "{\"attendees\": [...], \"duration\": d}")
    att = meeting["attendees"]
    if not isinstance(att, list) or not att:
      checks.fail(self.key, "meetings", f"meeting {m}'s attendees {att!r} are not a non-empty list")
    for a in att:
      if not checks.is_int(a) or str(a) not in q["attendee_availability"]:
        checks.fail(self.key, "meetings", f"meeting {m}'s attendee {a!r} is not an attendee id of "
                    "attendee_availability")
    if len(set(att)) != len(att):
      checks.fail(self.key, "meetings", f"meeting {m} lists an attendee twice")
    checks.int_at_least(self.key, "meetings", meeting["duration"], 1, f"meeting {m}'s duration")

  def _load(self, q):
    meetings = {int(k): (tuple(int(a) for a in v["attendees"]), int(v["duration"]))
                for k, v in q["meetings"].items()}
    avail = {int(k): [(int(a), int(b)) for a, b in v] for k, v in q["attendee_availability"].items()}
    rooms = {int(k): int(v) for k, v in q["rooms"].items()}
    return Problem(meetings=meetings, avail=avail, rooms=rooms)

  def _parse(self, answer):
    items = parsing.parse_list(answer)
    if not isinstance(items, list):
      raise parsing.ParseError("expected a list of (meeting, room, start) tuples")
    for it in items:
      if not isinstance(it, (list, tuple)) or len(it) != 3 or not all(isinstance(x, int) for x in it):
        raise parsing.ParseError(f"entry {it!r} is not a (meeting_id, room_id, start_time) triple")
    return [tuple(it) for it in items]

  def format_answer(self, solution):
    return "[" + ", ".join(f"({m}, {r}, {s})" for m, r, s in solution) + "]"

  def _available(self, p, a, s, e):
    return any(lo <= s and e <= hi for lo, hi in p.avail.get(a, ()))

  def _check(self, p, sched):
    seen, by_room, by_att = set(), {}, {}
    value = 0
    for m, r, s in sched:
      if m not in p.meetings:
        raise Infeasible(f"meeting {m} does not exist")
      if r not in p.rooms:
        raise Infeasible(f"room {r} does not exist")
      att, dur = p.meetings[m]
      e = s + dur
      if m in seen:
        raise Infeasible(f"meeting {m} scheduled more than once")
      seen.add(m)
      if p.rooms[r] < len(att):
        raise Infeasible(f"room {r} holds {p.rooms[r]}, meeting {m} has {len(att)} attendees")
      for a in att:
        if not self._available(p, a, s, e):
          raise Infeasible(f"attendee {a} is not available for meeting {m} at {s}-{e}")
      for (m2, s2, e2) in by_room.get(r, ()):
        if s < e2 and s2 < e:
          raise Infeasible(f"meetings {m2} and {m} overlap in room {r}")
      by_room.setdefault(r, []).append((m, s, e))
      for a in att:
        for (m2, s2, e2) in by_att.get(a, ()):
          if s < e2 and s2 < e:
            raise Infeasible(f"attendee {a} is in meetings {m2} and {m} at once")
        by_att.setdefault(a, []).append((m, s, e))
      value += len(att)
    return value, tuple(sorted(sched))

  # ---- solvers ----------------------------------------------------------
  def _grid(self, p):
    g = 0
    for lo_hi in p.avail.values():
      for lo, hi in lo_hi:
        g = math.gcd(g, math.gcd(lo, hi))
    for _, dur in p.meetings.values():
      g = math.gcd(g, dur)
    return max(g, 1)

  def _starts(self, p, m, step):
    att, dur = p.meetings[m]
    cands = set()
    for a in att:
      for lo, hi in p.avail.get(a, ()):
        cands.update(range(lo, hi - dur + 1, step))
    return sorted(s for s in cands if all(self._available(p, a, s, s + dur) for a in att))

  def _insert(self, p, sched, m, rng, step, randomise):
    """Place meeting m at a feasible (room, start), earliest first (or random)."""
    att, dur = p.meetings[m]
    options = []
    for s in self._starts(p, m, step):
      e = s + dur
      if any(s < s2 + p.meetings[m2][1] and s2 < e and set(att) & set(p.meetings[m2][0])
             for m2, _, s2 in sched):
        continue
      for r in sorted(p.rooms):
        if p.rooms[r] >= len(att) and not any(
            r2 == r and s < s2 + p.meetings[m2][1] and s2 < e for m2, r2, s2 in sched):
          options.append((s, p.rooms[r], r))
    if not options:
      return False
    s, _, r = rng.choice(options) if randomise else min(options)
    sched.append((m, r, s))
    return True

  def _greedy(self, p, order, rng, randomise=False):
    step = self._grid(p)
    sched = []
    for m in order:
      self._insert(p, sched, m, rng, step, randomise)
    return sched

  def _value(self, p, sched):
    return sum(len(p.meetings[m][0]) for m, _, _ in sched)

  def _reference(self, p, rng, deadline):
    """Greedy by attendee count, then ruin-and-recreate (a removed meeting is never re-added
    while still scheduled: every solution stays strictly feasible)."""
    order = sorted(p.meetings, key=lambda m: (-len(p.meetings[m][0]), p.meetings[m][1], m))
    best = self._greedy(p, order, rng)
    step = self._grid(p)
    for it in range(1000):
      if time.monotonic() > deadline:
        break
      cur = list(best)
      for _ in range(min(len(cur), rng.randint(1, 2))):
        cur.pop(rng.randrange(len(cur)))
      todo = [m for m in p.meetings if m not in {x[0] for x in cur}]
      rng.shuffle(todo)
      for m in todo:
        self._insert(p, cur, m, rng, step, randomise=rng.random() < 0.5)
      if self._value(p, cur) >= self._value(p, best):  # sideways moves escape plateaus
        best = cur
    return sorted(best)

  def _sample(self, p, rng):
    order = list(p.meetings)
    rng.shuffle(order)
    order = order[:rng.randint(1, len(order))]
    return self._greedy(p, order, rng, randomise=True)

  def _exact(self, p, time_limit):
    """CP-SAT on the time grid gcd(all bounds, durations): exact, since any feasible schedule
    can be shifted left, meeting by meeting, onto that grid."""
    m_ = cp_model()
    if m_ is None:
      return Exact(None, "UNAVAILABLE")
    step = self._grid(p)
    model = m_.CpModel()
    x = {}
    for m, (att, dur) in p.meetings.items():
      for s in self._starts(p, m, step):
        for r, cap in p.rooms.items():
          if cap >= len(att):
            x[(m, r, s)] = model.NewBoolVar(f"x{m}_{r}_{s}")
    for m in p.meetings:
      model.AddAtMostOne([v for k, v in x.items() if k[0] == m])
    points = sorted({s + k * step for (m, r, s) in x for k in range(p.meetings[m][1] // step)})
    for t in points:
      covering = [(k, v) for k, v in x.items() if k[2] <= t < k[2] + p.meetings[k[0]][1]]
      for r in p.rooms:
        model.AddAtMostOne([v for k, v in covering if k[1] == r])
      for a in p.avail:
        model.AddAtMostOne([v for k, v in covering if a in p.meetings[k[0]][0]])
    model.Maximize(sum(len(p.meetings[k[0]][0]) * v for k, v in x.items()))
    solver, status = solve(model, time_limit, workers=2)
    if status not in ("OPTIMAL", "FEASIBLE"):
      return Exact(None, status)
    sol = sorted(k for k, v in x.items() if solver.Value(v))
    return Exact(float(self._value(p, sol)), status, sol)

  # ---- text and images ---------------------------------------------------
  def _npbench_instance(self, p):
    lines = ["Meetings (id: attendees, duration in minutes):"]
    lines += [f"{m}: attendees {list(att)}, duration {dur}" for m, (att, dur) in sorted(p.meetings.items())]
    lines.append("Attendee availability (minutes after midnight):")
    lines += [f"{a}: {[list(iv) for iv in ivs]}" for a, ivs in sorted(p.avail.items())]
    lines.append("Rooms (id: capacity): " + ", ".join(f"{r}: {c}" for r, c in sorted(p.rooms.items())))
    return "\n".join(lines)

  def _compact(self, p):
    ms = " ; ".join(f"{' '.join(map(str, att))} dur {dur}" for _, (att, dur) in sorted(p.meetings.items()))
    av = " ; ".join(" ".join(f"{lo}-{hi}" for lo, hi in ivs) for _, ivs in sorted(p.avail.items()))
    rooms = " ".join(str(c) for _, c in sorted(p.rooms.items()))
    return f"meet att {ms} avail {av} rooms {rooms}"

  def _render(self, p, size):
    lo = min([DAY[0]] + [a for ivs in p.avail.values() for a, _ in ivs])
    hi = max([DAY[1]] + [b for ivs in p.avail.values() for _, b in ivs])
    return render.calendar(size, "Meeting scheduling: availability", p.avail,
                           {m: (list(att), dur) for m, (att, dur) in p.meetings.items()},
                           p.rooms, lo, hi)
